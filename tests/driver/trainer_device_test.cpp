// GRPO on a GPU against the same run on the CPU (label gpu: skips without a CUDA device). Three
// steps of the tiny Qwen2 in fp32, one rank each, with TF32 off: every deterministic metric agrees
// within rtol 1e-3, and the peak CUDA memory the run reports exceeds the model's bytes (the model
// was on the GPU). trainer_run_test checks that a cuda run without that GPU is refused.
#include <gtest/gtest.h>

#include <fstream>

#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include "proto/device.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

std::vector<std::string> on(std::vector<std::string> overrides, const std::string& device) {
  for (auto& o : overrides) {
    if (o.rfind("trainer.n_gpus_per_node=", 0) == 0) o = "trainer.n_gpus_per_node=1";
    if (o.rfind("trainer.device=", 0) == 0) o = "trainer.device=" + device;
  }
  overrides.push_back("actor_rollout_ref.rollout.val_kwargs.do_sample=false");  // greedy validation
  return overrides;
}

TEST(TrainerDevice, GrpoOnCudaMatchesTheCpu) {
  if (proto::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  TempDir dir("grpo_device");
  testing::make_tiny_run(dir.path());
  const auto base = testing::tiny_ppo_overrides(dir.path(), "grpo", 3);
  auto cpu = testing::fit_trainer(on(base, "cpu"));
  auto gpu_overrides = on(base, "cuda");
  gpu_overrides.push_back("trainer.profile_steps=[3]");  // the trace must hold the GPU's kernels
  auto gpu = testing::fit_trainer(gpu_overrides);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  testing::expect_same_history(cpu->history(), gpu->history(), /*tol=*/1e-3);
  // The tiny model's fp32 parameters plus AdamW state are well above 0; the peak must cover them.
  const auto& last = gpu->history().back().second;
  ASSERT_TRUE(last.count("perf/max_memory_allocated_gb"));
  EXPECT_GT(last.at("perf/max_memory_allocated_gb") * 1024 * 1024 * 1024, 4.0 * 32 * 32 * 2);
  std::ifstream in(dir.path() / "run" / "profile" / "step_3.pt.trace.json");
  ASSERT_TRUE(in.good()) << "no trace for step 3";
  const auto trace = nlohmann::json::parse(in);
  int64_t kernels = 0;
  for (const auto& e : trace.at("traceEvents")) kernels += e.value("cat", "") == "kernel" ? 1 : 0;
  EXPECT_GT(kernels, 100) << "the trace of a cuda step has no kernels";
}

}  // namespace
}  // namespace tessera::driver
