// profiler.cpp: StepProfiler (see profiler.hpp).
#include "driver/profiler.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "driver/config.hpp"
#include "proto/device.hpp"

namespace tessera::driver {
namespace {

namespace kineto_api = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

// On-device work: kernels, copies and memsets (CUPTI activities), not the runtime calls that
// launched them.
bool is_device_activity(const kineto_api::KinetoEvent& e) {
  const auto type = static_cast<libkineto::ActivityType>(e.activityType());
  return type == libkineto::ActivityType::CONCURRENT_KERNEL || type == libkineto::ActivityType::GPU_MEMCPY ||
         type == libkineto::ActivityType::GPU_MEMSET;
}

// Seconds covered by the union of [start, end) intervals (the GPU busy time: kernels of several
// streams may overlap).
double covered_seconds(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  uint64_t total = 0, open_start = 0, open_end = 0;
  bool open = false;
  for (const auto& [s, e] : spans) {
    if (open && s <= open_end) {
      open_end = std::max(open_end, e);
      continue;
    }
    if (open) total += open_end - open_start;
    open_start = s;
    open_end = e;
    open = true;
  }
  if (open) total += open_end - open_start;
  return static_cast<double>(total) * 1e-9;
}

std::vector<std::string> digest(const kineto_api::ProfilerResult& result, double wall_s) {
  struct Total {
    uint64_t ns = 0;
    int64_t count = 0;
  };
  std::map<std::string, Total> by_name;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  int64_t ops = 0;
  for (const auto& e : result.events()) {
    if (!is_device_activity(e)) {
      ops += e.deviceType() == c10::DeviceType::CPU ? 1 : 0;
      continue;
    }
    spans.emplace_back(e.startNs(), e.endNs());
    Total& t = by_name[e.name()];
    t.ns += e.durationNs();
    t.count += 1;
  }
  std::vector<std::string> lines;
  if (spans.empty()) {
    lines.push_back(fmt::format("  {} CPU events; no device activity (a CPU run)", ops));
    return lines;
  }
  const double busy = covered_seconds(spans);
  lines.push_back(fmt::format("  GPU busy {:.3f} s of the step's {:.3f} s ({:.0f}%): {} kernels, copies and memsets",
                              busy, wall_s, wall_s > 0 ? 100.0 * busy / wall_s : 0.0, spans.size()));
  std::vector<std::pair<std::string, Total>> top(by_name.begin(), by_name.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  if (top.size() > 8) top.resize(8);
  for (const auto& [name, t] : top) {
    const double s = static_cast<double>(t.ns) * 1e-9;
    std::string shown = name.size() > 96 ? name.substr(0, 93) + "..." : name;
    lines.push_back(fmt::format("  {:8.3f} s {:4.0f}% {:8}x  {}", s, busy > 0 ? 100.0 * s / busy : 0.0, t.count, shown));
  }
  return lines;
}

}  // namespace

Result<std::unique_ptr<StepProfiler>> StepProfiler::from_config(const nlohmann::json& cfg) {
  constexpr const char* key = "trainer.profile_steps";
  TESSERA_ASSIGN_OR_RETURN(auto listed, config_get_or<std::optional<std::vector<int64_t>>>(cfg, key, std::nullopt));
  if (!listed || listed->empty()) return std::unique_ptr<StepProfiler>();
  std::set<int64_t> steps;
  for (int64_t s : *listed) {
    if (s < 1) return make_error(ErrorCode::invalid_argument, "{}: step {} is not a training step (they count from 1)", key, s);
    steps.insert(s);
  }
  if (const auto* agents = config_find(cfg, "cluster.agents"); agents != nullptr && agents->is_array() && !agents->empty()) {
    return make_error(ErrorCode::unimplemented,
                      "{}: the trace covers the driver's process, and with cluster.agents the ranks run on the agents",
                      key);
  }
  TESSERA_ASSIGN_OR_RETURN(std::string out, config_get<std::string>(cfg, "trainer.default_local_dir"));
  TESSERA_ASSIGN_OR_RETURN(std::string device, config_get<std::string>(cfg, "trainer.device"));
  return std::make_unique<StepProfiler>(std::move(steps), std::filesystem::path(out) / "profile", device == "cuda");
}

StepProfiler::StepProfiler(std::set<int64_t> steps, std::filesystem::path dir, bool cuda)
    : steps_(std::move(steps)), dir_(std::move(dir)), cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  if (active_ != 0) {
    try {
      kineto_api::disableProfiler();
    } catch (...) {  // nothing to report to at destruction
    }
  }
}

Status StepProfiler::begin(int64_t step) {
  if (steps_.count(step) == 0) return Status();
  try {
    if (active_ != 0) {  // a failed step left its trace running: drop it, trace this attempt
      active_ = 0;
      kineto_api::disableProfiler();
    }
    impl::ExperimentalConfig experimental(/*profiler_metrics=*/{}, /*profiler_measure_per_kernel=*/false,
                                          /*verbose=*/false, /*performance_events=*/{},
                                          /*enable_cuda_sync_events=*/false, /*adjust_profiler_step=*/false,
                                          /*disable_external_correlation=*/false, /*profile_all_threads=*/true);
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                                      /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/false,
                                      /*with_modules=*/false, experimental);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (cuda_) activities.insert(impl::ActivityType::CUDA);
    kineto_api::prepareProfiler(config, activities);
    kineto_api::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "trainer.profile_steps: step {}: starting the profiler: {}", step, e.what());
  }
  active_ = step;
  started_ = std::chrono::steady_clock::now();
  return Status();
}

Result<std::vector<std::string>> StepProfiler::end(int64_t step) {
  if (active_ == 0 || active_ != step) return std::vector<std::string>();
  active_ = 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const std::filesystem::path path = dir_ / fmt::format("step_{}.pt.trace.json", step);
  try {
    std::unique_ptr<kineto_api::ProfilerResult> result = kineto_api::disableProfiler();
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) return make_error(ErrorCode::io_error, "trainer.profile_steps: {}: {}", dir_.string(), ec.message());
    // Kineto writes the file itself (no atomic rename): a half-written trace is only possible if
    // the process dies inside save(), and the digest below is printed only after it returned.
    result->save(path.string());
    std::vector<std::string> lines{
        fmt::format("step {} trace: {} (open in https://ui.perfetto.dev)", step, path.string())};
    for (auto& l : digest(*result, wall)) lines.push_back(std::move(l));
    return lines;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "trainer.profile_steps: step {}: {}: {}", step, path.string(), e.what());
  }
}

}  // namespace tessera::driver
