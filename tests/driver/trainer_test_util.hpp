// Shared helpers for the trainer tests: a tiny model + demo datasets in a temp dir, small PPO /
// GRPO / SFT override lists, and the worker registry (every worker type plus "sft").
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/config.hpp"
#include "driver/demo_task.hpp"
#include "driver/metrics.hpp"
#include "driver/ppo_trainer.hpp"
#include "runtime/worker.hpp"
#include "tests/driver/driver_test_util.hpp"
#include "workers/models/init_model.hpp"
#include "workers/roles/registry.hpp"
#include "workers/roles/sft_worker.hpp"

namespace tessera::driver::testing {

/// Every worker type Tessera ships plus "sft" (what app/worker_types.cpp registers).
inline const runtime::WorkerTypeRegistry& trainer_registry() {
  static const runtime::WorkerTypeRegistry registry = [] {
    runtime::WorkerTypeRegistry r;
    EXPECT_TRUE(workers::register_worker_types(r).ok());
    EXPECT_TRUE(workers::register_sft_worker(r).ok());
    return r;
  }();
  return registry;
}

/// A tiny Qwen2 (hidden 32, 2 layers) with the demo's character tokenizer in dir/model, and the
/// demo datasets (small) in dir/data. `arch` qwen3_moe / qwen2_moe: 4 experts of width 16, top 2;
/// gemma3_text: 6 layers, windows of 8 on the first five, RoPE bases 1e4 and 1e6.
inline void make_tiny_run(const std::filesystem::path& dir, const std::string& arch = "qwen2") {
  models::InitModelOptions o;
  o.arch = arch, o.hidden = 32, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.seed = 7, o.max_position = 64;
  if (arch == "qwen3_moe" || arch == "qwen2_moe") {
    o.experts = 4, o.experts_per_tok = 2, o.moe_intermediate = 16, o.norm_topk_prob = arch == "qwen3_moe";
  }
  // gemma3_text: five sliding layers (RoPE base 1e4), the sixth full (base 1e6, as Gemma-3 ships).
  if (arch == "gemma3_text") o.layers = 6, o.sliding_window = 8;  // full layers: init-model's 1e6
  o.tokenizer = std::string("chars:") + kDemoAlphabet;
  o.out = (dir / "model").string();
  ASSERT_TRUE(models::init_model(o).ok());
  DemoTaskOptions t;
  t.rl_train_size = 64, t.rl_val_size = 8, t.sft_train_size = 64, t.sft_val_size = 10;
  ASSERT_TRUE(write_demo_datasets(t, (dir / "data").string()).ok());
}

/// Overrides for a 2-rank CPU run of `steps` steps over make_tiny_run(dir)'s files.
inline std::vector<std::string> tiny_ppo_overrides(const std::filesystem::path& dir, const std::string& estimator,
                                                   int steps) {
  const std::string d = dir.string();
  std::vector<std::string> o = {
      "data.train_files=" + d + "/data/rl_train.jsonl", "data.val_files=" + d + "/data/rl_val.jsonl",
      "data.max_prompt_length=24", "data.max_response_length=4", "data.train_batch_size=4",
      "actor_rollout_ref.model.path=" + d + "/model", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3",
      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.dtype=float32",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.max_num_seqs=16",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
      "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
      "++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32",
      "algorithm.adv_estimator=" + estimator, "trainer.n_gpus_per_node=2", "trainer.device=cpu",
      "trainer.num_threads=1", "trainer.total_epochs=1", "trainer.total_training_steps=" + std::to_string(steps),
      "trainer.test_freq=2", "trainer.val_before_train=true", "trainer.logger=[jsonl]",
      "trainer.default_local_dir=" + d + "/run", "trainer.resume_mode=disable"};
  if (estimator == "gae") {
    // critic.optim.min_lr_ratio defaults to null (verl), which the critic worker's optim parser
    // refuses today; 0.0 is verl's effective value.
    for (const char* s : {"critic.ppo_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-3", "critic.optim.min_lr_ratio=0.0",
                          "++critic.model.fsdp_config.mixed_precision.param_dtype=fp32"}) {
      o.push_back(s);
    }
    o.push_back("critic.model.path=" + d + "/model");
  }
  return o;
}

/// Overrides for a 2-rank CPU SFT run of `steps` steps over make_tiny_run(dir)'s files.
inline std::vector<std::string> tiny_sft_overrides(const std::filesystem::path& dir, int steps) {
  const std::string d = dir.string();
  return {"data.train_files=" + d + "/data/sft_train.jsonl", "data.val_files=" + d + "/data/sft_val.jsonl",
          "data.prompt_key=prompt", "data.response_key=response", "data.max_length=32", "data.train_batch_size=8",
          "data.micro_batch_size_per_gpu=2", "model.partial_pretrain=" + d + "/model", "optim.lr=1e-3",
          "optim.lr_scheduler=constant", "optim.warmup_steps_ratio=0.0", "trainer.n_gpus_per_node=2",
          "trainer.device=cpu", "trainer.num_threads=1", "trainer.total_training_steps=" + std::to_string(steps),
          "trainer.logger=[jsonl]", "trainer.default_local_dir=" + d + "/sft", "trainer.resume_mode=disable"};
}

/// A quiet trainer over `overrides` (defaults = examples/config/ppo_trainer.yaml), its workers
/// initialised and fit() run; every failure is a test failure and gives nullptr.
inline std::unique_ptr<RayPPOTrainer> fit_trainer(const std::vector<std::string>& overrides,
                                                  std::FILE* console = nullptr) {
  auto cfg = load_config(ConfigKind::ppo, "", overrides);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return nullptr;
  PpoTrainerOptions o;
  o.console = console;
  o.progress = nullptr;
  auto t = RayPPOTrainer::create(std::move(*cfg), trainer_registry(), o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return nullptr;
  Status st = (*t)->init_workers();
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (st.ok()) st = (*t)->fit();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? std::move(*t) : nullptr;
}

/// The metrics that depend only on the data and the model (no timing, throughput or memory).
inline Metrics deterministic_metrics(const Metrics& m) {
  Metrics out;
  for (const auto& [k, v] : m) {
    if (k.rfind("timing", 0) == 0 || k.rfind("perf/", 0) == 0) continue;
    out[k] = v;
  }
  return out;
}

/// Two runs' histories agree step by step on every deterministic metric (relative `tol`).
inline void expect_same_history(const std::vector<std::pair<int64_t, Metrics>>& expected,
                                const std::vector<std::pair<int64_t, Metrics>>& got, double tol = 1e-5) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    Metrics want = deterministic_metrics(expected[i].second);
    Metrics have = deterministic_metrics(got[i].second);
    EXPECT_EQ(have.size(), want.size()) << "step " << expected[i].first;
    for (const auto& [k, v] : want) {
      auto it = have.find(k);
      ASSERT_NE(it, have.end()) << "step " << expected[i].first << ": missing " << k;
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(it->second)) << k;
      } else {
        EXPECT_NEAR(it->second, v, tol * std::max(1.0, std::fabs(v))) << "step " << expected[i].first << ": " << k;
      }
    }
  }
}

}  // namespace tessera::driver::testing
