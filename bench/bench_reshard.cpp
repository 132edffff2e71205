// bench_reshard: the FSDP -> rollout weight handoff (issue "Rollout", reshard figures) on a
// ~20M-parameter decoder (hidden 512, 6 layers, 8 heads, intermediate 1408; character vocabulary),
// fp32, ranks as threads of this process (in-process collectives).
//
//   BM_reshard_colocated/1     enter()+exit() of the colocated sharding manager, 1 rank: the
//                              handoff is by reference (counter copied_bytes must be 0).
//   BM_reshard_colocated/2     the same on 2 FULL_SHARD ranks: each unit all-gathered.
//   BM_reshard_tp2             2 ranks, rollout TP=2: each rank receives only its slices
//                              (counters received_bytes, full_bytes, slice_fraction).
//   BM_reshard_split           split placement through WorkerGroups on the embedded runtime:
//                              2 actor ranks -> 2 rollout ranks on other devices, every bucket
//                              exported and pulled (bytes_per_second: bytes landed on the rollout
//                              ranks per second).
//   BM_reshard_memcpy          memcpy of the same bytes: the bandwidth bound for BM_reshard_split.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/models/init_model.hpp"
#include "workers/roles/registry.hpp"

namespace {

using json = nlohmann::json;
using namespace tessera;

const std::string& model_dir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() / ("tessera_bench_reshard_" + std::to_string(::getpid()))).string();
    models::InitModelOptions o;
    o.arch = "llama", o.hidden = 512, o.layers = 6, o.heads = 8, o.intermediate = 1408, o.seed = 1;
    o.tokenizer = "chars:abcdefghijklmnopqrstuvwxyz0123456789+= ", o.max_position = 256, o.out = d + "/model";
    Status st = models::init_model(o);
    if (!st.ok()) throw std::runtime_error(st.to_string());
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(model_dir() + "/..", ec); });
    return o.out;
  }();
  return dir;
}

json arr_config(int64_t tp, bool split) {
  json fsdp = {{"mixed_precision", {{"param_dtype", "fp32"}, {"reduce_dtype", "fp32"}, {"buffer_dtype", "fp32"}}}};
  json rollout = {{"dtype", "float32"}, {"prompt_length", 16}, {"response_length", 16},
                  {"tensor_model_parallel_size", tp}, {"log_prob_micro_batch_size_per_gpu", 2}};
  if (split) rollout["engine_kwargs"] = {{"tessera", {{"placement", "split"}}}};
  return {{"model", {{"path", model_dir()}}},
          {"actor", {{"ppo_mini_batch_size", 4}, {"ppo_micro_batch_size_per_gpu", 1}, {"fsdp_config", fsdp},
                     {"optim", {{"lr", 1e-3}}}}},
          {"rollout", rollout}};
}

runtime::WorkerContext context(int rank, int world, uint16_t port) {
  runtime::WorkerContext c;
  c.group = "bench", c.rank = rank, c.world_size = world, c.device = "cpu:" + std::to_string(rank);
  c.master_addr = "127.0.0.1", c.master_port = port;
  return c;
}

// `world` colocated actor_rollout workers (threads), initialised.
std::vector<std::unique_ptr<workers::ActorRolloutRefWorker>> make_workers(int world, int64_t tp) {
  static uint16_t port = 45000;
  ++port;
  std::vector<std::unique_ptr<workers::ActorRolloutRefWorker>> ws(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto w = workers::ActorRolloutRefWorker::create(
          context(r, world, port), json{{"role", "actor_rollout"}, {"config", arr_config(tp, false)}, {"comm_backend", "inproc"}});
      if (!w.ok() || !(*w)->init_model().ok()) return;
      ws[static_cast<size_t>(r)] = std::move(*w);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& w : ws) if (!w) throw std::runtime_error("bench_reshard: worker init failed");
  return ws;
}

void run_reshard(benchmark::State& state, int world, int64_t tp) {
  auto ws = make_workers(world, tp);
  rollout::ReshardStats st;
  for (auto _ : state) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto* sm = ws[static_cast<size_t>(r)]->sharding_manager();
        if (!sm->enter().ok()) throw std::runtime_error("enter failed");
        if (r == 0) st = sm->last_reshard();
        (void)sm->exit();
      });
    }
    for (auto& t : threads) t.join();
  }
  state.counters["copied_bytes"] = static_cast<double>(st.handoff_copied_bytes);
  state.counters["gathered_bytes"] = static_cast<double>(st.gathered_bytes);
  state.counters["received_bytes"] = static_cast<double>(st.received_bytes);
  state.counters["full_bytes"] = static_cast<double>(st.full_bytes);
  state.counters["slice_fraction"] = static_cast<double>(st.gathered_bytes) / static_cast<double>(st.full_bytes);
}

void BM_reshard_colocated(benchmark::State& state) { run_reshard(state, static_cast<int>(state.range(0)), 1); }
BENCHMARK(BM_reshard_colocated)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_reshard_tp2(benchmark::State& state) { run_reshard(state, 2, 2); }
BENCHMARK(BM_reshard_tp2)->Unit(benchmark::kMillisecond)->UseRealTime();

int64_t g_split_bytes = 0;  // bytes landed on the rollout ranks per sync (for the memcpy bound)

void BM_reshard_split(benchmark::State& state) {
  runtime::WorkerTypeRegistry registry;
  if (!workers::register_worker_types(registry).ok()) throw std::runtime_error("registry");
  runtime::RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:4";
  auto rt = runtime::Runtime::start(cfg, registry);
  if (!rt.ok()) throw std::runtime_error(rt.status().to_string());
  auto all = (*rt)->resource_pool();
  auto pool = [&](int from) {
    runtime::NodeDevices n = all->nodes().at(0);
    n.devices = {"cpu:" + std::to_string(from), "cpu:" + std::to_string(from + 1)};
    return *runtime::ResourcePool::make({n});
  };
  auto init = [](const std::string& role, bool split) {
    return json{{"role", role}, {"config", arr_config(1, split)}, {"seed", 1}}.dump();
  };
  auto actor_pool = dispatch::WorkerGroup::spawn(**rt, "actor", pool(0), {{"actor", "actor_rollout_ref", init("actor", false)}});
  auto rollout_pool = dispatch::WorkerGroup::spawn(**rt, "rollout", pool(2), {{"rollout", "actor_rollout_ref", init("rollout", true)}});
  auto actor = *(*actor_pool)->role("actor");
  auto rollout = *(*rollout_pool)->role("rollout");
  if (!actor->call("init_model", {}).ok() || !rollout->call("init_model", {}).ok()) throw std::runtime_error("init_model");
  int64_t version = 0, bytes = 0;
  for (auto _ : state) {
    auto plan = actor->call("rollout_weight_buckets", {});
    const int64_t buckets = plan->list().at(0).json().at("buckets").get<int64_t>();
    bytes = plan->list().at(0).json().at("bytes").get<int64_t>() * rollout->world_size();
    for (int64_t b = 0; b < buckets; ++b) {
      auto fut = actor->call_async("export_rollout_weights", {dispatch::Value(json{{"bucket", b}, {"version", version}})});
      auto done = rollout->call("load_rollout_weights", {dispatch::make_future(*fut)});
      if (!done.ok()) throw std::runtime_error(done.status().to_string());
    }
    ++version;
  }
  g_split_bytes = bytes;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["bytes_per_sync"] = static_cast<double>(bytes);
}
BENCHMARK(BM_reshard_split)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_reshard_memcpy(benchmark::State& state) {
  const int64_t bytes = g_split_bytes > 0 ? g_split_bytes : (int64_t{160} << 20);
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_reshard_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
