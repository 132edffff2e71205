// worker_test_util.hpp: a tiny HF model directory written once per test process, verl-shaped
// configs and batches for the worker classes, and N ranks as threads (in-process collectives).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "runtime/messages.hpp"
#include "tests/workers/ppo/rollout_batch_util.hpp"
#include "workers/models/config.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/models/init_model.hpp"
#include "workers/models/model_io.hpp"
#include "workers/roles/registry.hpp"

namespace tessera::workers::testing {

using tessera::testing::max_diff;
using tessera::testing::rollout_tensors;

using json = nlohmann::json;

/// A 2-layer qwen2 (hidden 32, 4 heads over 2 KV heads) with a 44-token character tokenizer,
/// written once per process into a temporary directory that is removed at exit.
inline const std::string& tiny_model_dir() {
  struct TempModel {
    std::string base, dir;
    ~TempModel() {
      std::error_code ec;
      if (!base.empty()) std::filesystem::remove_all(base, ec);
    }
  };
  static const TempModel model = [] {
    char tmpl[] = "/tmp/tessera_worker_test_XXXXXX";
    const char* base = mkdtemp(tmpl);
    EXPECT_NE(base, nullptr);
    TempModel m{base ? base : "", std::string(base ? base : "/tmp") + "/model"};
    models::InitModelOptions o;
    o.arch = "qwen2";
    o.hidden = 32;
    o.layers = 2;
    o.heads = 4;
    o.kv_heads = 2;
    o.intermediate = 48;
    o.tokenizer = "chars:abcdefghijklmnopqrstuvwxyz0123456789+= ";
    o.seed = 7;
    o.max_position = 128;
    o.out = m.dir;
    Status st = models::init_model(o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return m;
  }();
  return model.dir;
}

/// Token ids the worker tests' batches draw from ([3, kVocab), inside the tiny tokenizer's 44).
constexpr int64_t kVocab = 40;

/// The tiny model loaded from tiny_model_dir() as an fp32 CausalLM.
inline std::shared_ptr<models::CausalLM> load_tiny_model() {
  models::LoadOptions o;
  o.dtype = at::kFloat;
  auto m = models::load_causal_lm(tiny_model_dir(), o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return *m;
}

/// The tiny model's config.json.
inline models::ModelConfig tiny_model_config() {
  auto c = models::load_model_config(tiny_model_dir());
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

/// An fp32 fsdp_config (fp32 master weights, also for the frozen models that default to bf16, and
/// gathers in fp32, so results compare at fp32 precision).
inline json fp32_fsdp(bool param_offload = false, bool optimizer_offload = false) {
  return {{"model_dtype", "fp32"},
          {"mixed_precision", {{"param_dtype", "fp32"}, {"reduce_dtype", "fp32"}, {"buffer_dtype", "fp32"}}},
          {"param_offload", param_offload},
          {"optimizer_offload", optimizer_offload}};
}

/// A verl actor_rollout_ref subtree for the tiny model (fp32 everywhere). `mini` and `micro` in
/// prompts / per GPU as verl's config states them.
inline json arr_config(int64_t mini = 4, int64_t micro = 1, int64_t response_length = 6) {
  return {
      {"model", {{"path", tiny_model_dir()}, {"use_remove_padding", false}}},
      {"actor",
       {{"ppo_mini_batch_size", mini},
        {"ppo_micro_batch_size_per_gpu", micro},
        {"ppo_epochs", 1},
        {"clip_ratio", 0.2},
        {"entropy_coeff", 0.0},
        {"grad_clip", 1.0},
        {"optim", {{"lr", 1e-2}, {"weight_decay", 0.01}}},
        {"fsdp_config", fp32_fsdp()}}},
      {"rollout",
       {{"dtype", "float32"},
        {"temperature", 1.0},
        {"prompt_length", 8},
        {"response_length", response_length},
        {"log_prob_micro_batch_size_per_gpu", 2},
        {"calculate_log_probs", true},
        {"max_num_seqs", 8}}},
      {"ref", {{"log_prob_micro_batch_size_per_gpu", 2}, {"fsdp_config", fp32_fsdp()}}},
  };
}

/// The worker types Tessera ships (workers/roles/registry.hpp), registered once per process.
inline const runtime::WorkerTypeRegistry& worker_registry() {
  static const runtime::WorkerTypeRegistry reg = [] {
    runtime::WorkerTypeRegistry r;
    Status st = register_worker_types(r);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return r;
  }();
  return reg;
}

/// A worker context: rank `rank` of `world`, rendezvous id by `port` (unique per test).
inline runtime::WorkerContext context(int rank, int world, uint16_t port, const std::string& group = "wg") {
  runtime::WorkerContext c;
  c.group = group;
  c.rank = rank;
  c.world_size = world;
  c.device = "cpu:" + std::to_string(rank);
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  return c;
}

/// An ActorRolloutRefWorker of `role` on `ctx` (seed 3, in-process collectives), after init_model.
inline std::unique_ptr<ActorRolloutRefWorker> make_worker(const runtime::WorkerContext& ctx, const std::string& role,
                                                          const json& config) {
  auto w = ActorRolloutRefWorker::create(ctx, json{{"role", role}, {"config", config}, {"seed", 3},
                                                   {"comm_backend", "inproc"}});
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  Status st = (*w)->init_model();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(*w);
}

/// A fresh rendezvous port id for in-process groups (never bound: inproc keys only).
inline uint16_t next_port() {
  static std::atomic<uint16_t> port{41000};
  return port++;
}

/// Runs fn(rank) on `world` threads and joins them.
inline void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

/// Left-padded prompts [B, P] from the tiny vocabulary (ids >= 3), lengths `lens`.
inline proto::DataProto make_prompts(const std::vector<int64_t>& lens, int64_t P, uint64_t seed, int64_t vocab) {
  const auto B = static_cast<int64_t>(lens.size());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor mask = at::zeros({B, P}, at::kLong);
  for (int64_t i = 0; i < B; ++i) mask[i].narrow(0, P - lens[i], lens[i]).fill_(1);
  at::Tensor ids = at::randint(3, vocab, {B, P}, gen, at::kLong) * mask;
  proto::TensorDict t;
  t.insert_or_assign("input_ids", ids);
  t.insert_or_assign("attention_mask", mask);
  t.insert_or_assign("position_ids", (mask.cumsum(1) - 1).clamp_min(0));
  auto d = proto::DataProto::from_dict(std::move(t));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

/// A verl rollout batch: prompts left-padded to P, responses right-padded to R.
inline proto::DataProto make_rollout(const std::vector<int64_t>& prompt_lens, const std::vector<int64_t>& response_lens,
                                     int64_t P, int64_t R, uint64_t seed, int64_t vocab) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  proto::TensorDict t = rollout_tensors(prompt_lens, response_lens, P, R, vocab, gen);
  const at::Tensor rm = *t.find("response_mask");
  t.insert_or_assign("advantages", at::randn({static_cast<int64_t>(prompt_lens.size()), R}, gen) * rm);
  auto d = proto::DataProto::from_dict(std::move(t));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

}  // namespace tessera::workers::testing
