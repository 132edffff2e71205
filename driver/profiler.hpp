// profiler.hpp: verl's trainer.profile_steps through LibTorch's own profiler (Kineto).
//
//   trainer.profile_steps=[2,5]   each listed training step writes
//                                 <trainer.default_local_dir>/profile/step_<N>.pt.trace.json
//
// verl records those steps with Nsight Systems; Tessera records them with the profiler inside
// LibTorch, the one behind torch.profiler: every ATen op on every thread of this process (the
// worker actors' threads included) and, on a GPU, every kernel, copy and memset through CUPTI.
// The file is a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing). After the
// step the console gets a short digest: how long the GPU was busy out of the step's wall time and
// the kernels that took longest. Ranks on node agents run in other processes and are not traced,
// so a run with cluster.agents refuses the key; verl's Nsight option keys have no effect.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver {

class StepProfiler {
 public:
  /// trainer.profile_steps (null or []: no profiler, nullptr) and the output folder; refused
  /// with cluster.agents, and for a step below 1.
  static Result<std::unique_ptr<StepProfiler>> from_config(const nlohmann::json& cfg);
  StepProfiler(std::set<int64_t> steps, std::filesystem::path dir, bool cuda);
  ~StepProfiler();  ///< Stops a trace a failed step left running, without writing it.
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Starts tracing when `step` is listed.
  Status begin(int64_t step);
  /// Stops the trace begun for `step`, writes it, and returns the digest's lines (none when
  /// `step` was not traced).
  Result<std::vector<std::string>> end(int64_t step);

 private:
  std::set<int64_t> steps_;
  std::filesystem::path dir_;
  bool cuda_ = false;
  int64_t active_ = 0;  ///< The step being traced; 0: none.
  std::chrono::steady_clock::time_point started_;
};

}  // namespace tessera::driver
