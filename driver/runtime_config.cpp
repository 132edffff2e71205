// runtime_config.cpp: trainer.* and cluster.* to a runtime::RuntimeConfig (runtime_config.hpp).
#include "driver/runtime_config.hpp"

#include <string>

#include <fmt/format.h>

#include "driver/config.hpp"
#include "proto/device.hpp"

namespace tessera::driver {

using nlohmann::json;

namespace {

// The defaults YAML lists every cluster key with null meaning "the runtime's default".
json without_nulls(const json& j) {
  if (!j.is_object()) return j;
  json out = json::object();
  for (const auto& [k, v] : j.items()) {
    if (!v.is_null()) out[k] = without_nulls(v);
  }
  return out;
}

}  // namespace

Result<int64_t> split_rollout_devices(const json& cfg) {
  const std::string kwargs = "actor_rollout_ref.rollout.engine_kwargs.tessera.";
  TESSERA_ASSIGN_OR_RETURN(std::string placement, config_get_or<std::string>(cfg, kwargs + "placement", "colocated"));
  if (placement != "split") return int64_t{0};
  TESSERA_ASSIGN_OR_RETURN(int64_t n, config_get_or<int64_t>(cfg, kwargs + "split_devices_per_node", 0));
  if (n > 0) return n;
  return config_get<int64_t>(cfg, "trainer.n_gpus_per_node");
}

Result<runtime::RuntimeConfig> trainer_runtime_config(const json& cfg) {
  // cluster.* (agents, token_file, TLS files, timeouts, heartbeats, data_plane caps): runtime/config.hpp.
  TESSERA_ASSIGN_OR_RETURN(runtime::RuntimeConfig rc, runtime::RuntimeConfig::from_json(without_nulls(cfg.value("cluster", json()))));
  TESSERA_ASSIGN_OR_RETURN(int64_t nnodes, config_get<int64_t>(cfg, "trainer.nnodes"));
  TESSERA_ASSIGN_OR_RETURN(int64_t per_node, config_get<int64_t>(cfg, "trainer.n_gpus_per_node"));
  TESSERA_ASSIGN_OR_RETURN(std::string device, config_get<std::string>(cfg, "trainer.device"));
  if (!rc.agents.empty()) return rc;
  if (nnodes != 1) {
    return make_error(ErrorCode::invalid_argument, "trainer.nnodes: {} needs cluster.agents (embedded runs are one node)",
                      nnodes);
  }
  // Split placement: the rollout ranks take devices of their own after the trainer's.
  TESSERA_ASSIGN_OR_RETURN(int64_t split, split_rollout_devices(cfg));
  const int64_t devices = per_node + split;
  if (device == "cpu") {
    rc.embedded_devices = fmt::format("cpu:{}", devices);
  } else if (device == "cuda") {
    // Never a silent CPU run: too few GPUs stop here, saying how to run on the CPU instead.
    if (const int visible = proto::cuda_device_count(); visible < devices) {
      return make_error(ErrorCode::unavailable,
                        "trainer.device=cuda: {} device(s) needed (trainer.n_gpus_per_node{}) but this process sees {} "
                        "CUDA device(s); set trainer.device=cpu to run on the CPU",
                        devices, split > 0 ? " plus the split rollout's" : "", visible);
    }
    rc.embedded_devices = devices == 1 ? "cuda:0" : fmt::format("cuda:0-{}", devices - 1);
  } else {
    return make_error(ErrorCode::invalid_argument, "trainer.device: '{}' is not cpu or cuda", device);
  }
  return rc;
}

}  // namespace tessera::driver
