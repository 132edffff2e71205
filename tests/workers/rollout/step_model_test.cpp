// The engine's model seam: the decode-attention kernel against plain torch attention; the rollout
// forward against models::CausalLM::forward_step; and the tensor-parallel seam, exercised by two
// in-process "ranks" (threads) that hold column/row slices and all-reduce through the hook.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include "tests/workers/rollout/rollout_test_util.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/rollout/internal/decode_attention.hpp"
#include "workers/rollout/step_model.hpp"

namespace tessera::rollout {
namespace {

using testing::get;

// softmax(q k^T / sqrt(D)) v with masked columns at the lowest float, as decoder.cpp computes it.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                               const at::Tensor& visible, int64_t columns) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), groups = H / keys.size(1);
  at::Tensor k = keys.narrow(2, 0, columns).repeat_interleave(groups, 1);
  at::Tensor v = values.narrow(2, 0, columns).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q.unsqueeze(2), k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
  at::Tensor seen = visible.narrow(1, 0, columns).view({B, 1, 1, columns});
  scores = scores.masked_fill(seen.logical_not(), std::numeric_limits<float>::lowest());
  return at::matmul(at::softmax(scores, -1), v).reshape({B, H * D});
}

TEST(DecodeAttention, MatchesTorchAttention) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  struct Shape {
    int64_t B, H, KV, D, capacity, columns;
  };
  for (Shape s : {Shape{3, 4, 2, 8, 20, 13}, Shape{2, 8, 8, 64, 40, 40}, Shape{2, 2, 1, 128, 9, 5},
                  Shape{4, 3, 3, 6, 10, 7}}) {  // GQA, MHA, two 64-lane chunks, D % 8 != 0 (scalar path)
    at::Tensor q = at::randn({s.B, s.H, s.D}, gen);
    at::Tensor keys = at::randn({s.B, s.KV, s.capacity, s.D}, gen), values = at::randn({s.B, s.KV, s.capacity, s.D}, gen);
    at::Tensor visible = at::rand({s.B, s.capacity}, gen).lt(0.7);
    visible[0].narrow(0, 0, s.columns).fill_(false);  // row 0 sees nothing: zeros, not NaN
    visible[1][s.columns - 1] = true;
    ASSERT_TRUE(internal::decode_attention_supported(keys));
    at::Tensor got = internal::decode_attention(q, keys, values, visible, s.columns);
    at::Tensor want = reference_attention(q, keys, values, visible, s.columns);
    double diff = (got.narrow(0, 1, s.B - 1) - want.narrow(0, 1, s.B - 1)).abs().max().item<double>();
    std::printf("[decode attention B=%ld H=%ld KV=%ld D=%ld S=%ld] max diff %.3g\n", s.B, s.H, s.KV, s.D, s.columns, diff);
    EXPECT_LT(diff, 1e-5);
    EXPECT_TRUE(got[0].eq(0).all().item<bool>());
  }
  EXPECT_FALSE(internal::decode_attention_supported(at::zeros({1, 1, 4, 8}, at::kBFloat16)));
}

// The rollout forward (prefill + decode steps, with holes in the mask) equals CausalLM::forward_step.
TEST(CausalLMStepModel, EqualsTheModelsForwardStep) {
  auto model = testing::tiny_model(31);
  int hook_calls = 0;
  CausalLMStepModel step(model, [&](at::Tensor&) { ++hook_calls; });
  const int64_t B = 3, P = 5, steps = 4, cap = P + steps + 2;
  auto mine = models::KVCache::create(model->config(), {B, cap, at::kFloat, at::kCPU});
  auto theirs = models::KVCache::create(model->config(), {B, cap, at::kFloat, at::kCPU});
  ASSERT_TRUE(mine.ok() && theirs.ok());
  at::Generator gen = at::detail::createCPUGenerator(2);
  at::Tensor mask = at::ones({B, cap}, at::kLong);
  mask[0].narrow(0, 0, 3).fill_(0);  // left padding
  mask[2][P + 1] = 0;                // a hole, as slot reuse leaves them
  at::Tensor ids = at::randint(0, testing::kVocab, {B, P}, gen), pos = (mask.narrow(1, 0, P).cumsum(1) - 1).clamp_min(0);
  double diff = 0;
  for (int64_t t = 0; t <= steps; ++t) {
    at::Tensor a = step.logits(step.forward_step(ids, pos, *mine, mask));
    at::Tensor b = model->forward_step(ids, pos, *theirs, mask);
    diff = std::max(diff, (a - b).abs().max().item<double>());
    ids = at::randint(0, testing::kVocab, {B, 1}, gen);
    pos = pos.narrow(1, pos.size(1) - 1, 1) + 1;
  }
  std::printf("[rollout forward] max |logits - models forward_step| = %.3g\n", diff);
  EXPECT_LT(diff, 1e-5);
  EXPECT_EQ(hook_calls, 2 * 2 * (steps + 1));  // attention + MLP, 2 layers, every step
}

// An in-process all-reduce for `ranks` threads (sum), standing in for the collective.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int ranks) : ranks_(ranks) {}
  void operator()(at::Tensor& t) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    sum_ = arrived_ == 0 ? t.clone() : sum_ + t;
    if (++arrived_ == ranks_) {
      result_ = sum_;
      arrived_ = 0;
      ++round_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return round_ != round; });
    }
    t = result_.clone();
  }

 private:
  int ranks_;
  std::mutex mutex_;
  std::condition_variable done_;
  uint64_t round_ = 0;
  int arrived_ = 0;
  at::Tensor sum_, result_;
};

// Rank r's slice of a full model: q/k/v/gate/up by output rows, o/down by input columns.
std::shared_ptr<models::CausalLM> rank_model(const models::CausalLM& full, int64_t rank, int64_t tp) {
  models::ModelConfig c = full.config();
  c.num_attention_heads /= tp;
  c.num_key_value_heads /= tp;
  c.intermediate_size /= tp;
  models::TensorMap tensors;
  for (const auto& [name, t] : full.parameter_map()) {
    auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    if (has("q_proj") || has("k_proj") || has("v_proj") || has("gate_proj") || has("up_proj")) {
      tensors.emplace(name, t.detach().chunk(tp, 0)[rank].contiguous());
    } else if (has("o_proj") || has("down_proj")) {
      tensors.emplace(name, t.detach().chunk(tp, 1)[rank].contiguous());
    } else {
      tensors.emplace(name, t.detach());
    }
  }
  auto model = models::CausalLM::from_parameters(c, tensors);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  return *model;
}

TEST(TensorParallelSeam, TwoRanksGenerateLikeOne) {
  auto full = testing::tiny_model(32);
  proto::DataProto prompts = testing::prompt_batch({8, 3, 6, 1}, 8, 3, nlohmann::json::array({5, 6}));
  for (bool sample : {false, true}) {
    RolloutConfig cfg = testing::test_config(/*response_length=*/10);
    cfg.do_sample = sample;
    at::Tensor single = get(testing::generate(*testing::make_engine(full, cfg, 4), prompts), "responses");
    ThreadAllReduce all_reduce(2);
    std::vector<std::unique_ptr<KVCacheEngine>> engines;
    for (int64_t r = 0; r < 2; ++r) {
      auto step = std::make_unique<CausalLMStepModel>(rank_model(*full, r, 2), [&](at::Tensor& t) { all_reduce(t); });
      auto engine = KVCacheEngine::create(std::move(step), cfg, EngineOptions{4});
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      engines.push_back(std::move(*engine));
    }
    std::vector<at::Tensor> outputs(2);
    std::vector<std::thread> ranks;
    for (size_t r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] { outputs[r] = get(testing::generate(*engines[r], prompts), "responses"); });
    }
    for (auto& t : ranks) t.join();
    SCOPED_TRACE(sample ? "sampled" : "greedy");
    ASSERT_TRUE(outputs[0].defined() && outputs[1].defined());
    EXPECT_TRUE(outputs[0].equal(outputs[1]));  // TP peers sample identically
    EXPECT_TRUE(outputs[0].equal(single));      // and like the unsplit model
  }
}

}  // namespace
}  // namespace tessera::rollout
