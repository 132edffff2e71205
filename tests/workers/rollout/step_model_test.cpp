// The engine's model seam: the paged decode-attention kernel against plain torch attention; the
// rollout forward (prefill, and decode over the paged cache) against models::CausalLM::forward_step;
// and the tensor-parallel seam, exercised by two in-process "ranks" (threads) that hold column/row
// slices and all-reduce through the hook (also for a Qwen3 with q/k/v/o biases and dynamic RoPE:
// replicated q_norm/k_norm, o_proj bias added once after the sum).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include "tests/workers/models/model_test_util.hpp"
#include "tests/workers/rollout/rollout_test_util.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/rollout/internal/block_cache.hpp"
#include "workers/rollout/internal/decode_attention.hpp"
#include "workers/rollout/step_model.hpp"
#include "workers/rollout/tensor_parallel.hpp"

namespace tessera::rollout {
namespace {

using testing::get;

// softmax(q k^T / sqrt(D)) v over positions [max(0, len - window), len) of each row, gathered
// from the block pools position by position.
at::Tensor reference_paged_attention(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                     const at::Tensor& tables, const at::Tensor& lens, int64_t window,
                                     double softcap = 0) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), bs = key_pool.size(1), groups = H / key_pool.size(2);
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[b].item<int64_t>(), first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    std::vector<at::Tensor> ks, vs;
    for (int64_t s = first; s < len; ++s) {
      const int64_t block = tables[b][s / bs].item<int64_t>();
      ks.push_back(key_pool[block][s % bs]);  // [KV, D]
      vs.push_back(value_pool[block][s % bs]);
    }
    at::Tensor k = at::stack(ks, 1).repeat_interleave(groups, 0), v = at::stack(vs, 1).repeat_interleave(groups, 0);
    at::Tensor scores = at::matmul(q[b].unsqueeze(1), k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    if (softcap > 0) scores = at::tanh(scores / softcap) * softcap;
    rows.push_back(at::matmul(at::softmax(scores, -1), v).reshape({H * D}));
  }
  return at::stack(rows);
}

TEST(DecodeAttention, PagedKernelMatchesTorchAttention) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  struct Shape {
    int64_t B, H, KV, D, block_size, window;
  };
  // GQA, MHA, two 64-lane chunks, D % 8 != 0 (scalar path), a sliding window, one-token blocks.
  for (Shape s : {Shape{3, 4, 2, 8, 4, 0}, Shape{2, 8, 8, 64, 16, 0}, Shape{2, 2, 1, 128, 3, 0},
                  Shape{4, 3, 3, 6, 2, 0}, Shape{3, 4, 2, 8, 4, 5}, Shape{2, 4, 2, 8, 1, 0}}) {
    const int64_t blocks = 24, width = 6;
    at::Tensor q = at::randn({s.B, s.H, s.D}, gen);
    at::Tensor keys = at::randn({blocks, s.block_size, s.KV, s.D}, gen);
    at::Tensor values = at::randn({blocks, s.block_size, s.KV, s.D}, gen);
    // Each row's blocks are a random distinct choice; its length leaves the last block partial.
    at::Tensor tables = at::randperm(blocks, gen).narrow(0, 0, s.B * width).view({s.B, width}).contiguous();
    at::Tensor lens = at::randint(1, width * s.block_size + 1, {s.B}, gen);
    lens[0] = width * s.block_size;
    ASSERT_TRUE(internal::paged_decode_attention_supported(keys));
    at::Tensor got = internal::paged_decode_attention(q, keys, values, tables, lens, s.window);
    at::Tensor want = reference_paged_attention(q, keys, values, tables, lens, s.window);
    const double diff = (got - want).abs().max().item<double>();
    std::printf("[paged attention B=%ld H=%ld KV=%ld D=%ld bs=%ld window=%ld] max diff %.3g\n", s.B, s.H, s.KV, s.D,
                s.block_size, s.window, diff);
    EXPECT_LT(diff, 1e-5);
  }
  EXPECT_FALSE(internal::paged_decode_attention_supported(at::zeros({2, 4, 1, 8}, at::kBFloat16)));
}

// The CUDA kernels (cuda/paged_attention.hpp: heads and tiled) against the same reference, in
// every dtype they take, with GQA, windows, a softcap, head sizes that are and are not multiples
// of 32, one-token and 16-token blocks, contexts shorter and longer than a tile; and their
// self-checks pass (Note [Kernel self-check]).
TEST(DecodeAttention, OnCudaPagedKernelMatchesTorchAttention) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  at::Generator gen = at::detail::createCPUGenerator(6);
  struct Shape {
    int64_t B, H, KV, D, block_size, window;
    double softcap;
  };
  for (bool tiled : {false, true})
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (Shape s : {Shape{3, 14, 2, 64, 16, 0, 0}, Shape{2, 8, 8, 128, 4, 0, 0}, Shape{4, 4, 2, 80, 1, 0, 0},
                    Shape{3, 4, 2, 64, 16, 7, 0}, Shape{2, 4, 4, 32, 2, 0, 30.0}, Shape{2, 4, 2, 256, 16, 0, 0},
                    // KV groups of 16 (two blocks per KV head) and 6 (a partly filled block); a head
                    // dimension that is no multiple of the kernel's 8-element chunks; a window.
                    Shape{3, 16, 1, 64, 16, 0, 0}, Shape{5, 12, 2, 128, 16, 40, 0}, Shape{2, 6, 2, 20, 4, 0, 0},
                    // Several tiles per row (the tiled kernel stages 64 positions at head size 64,
                    // 32 at 128), with and without a window.
                    Shape{3, 14, 2, 64, 32, 0, 0}, Shape{2, 28, 4, 128, 32, 50, 0}}) {
      ASSERT_TRUE(internal::tiled_decode_attention_supported(s.H, s.KV, s.D));
      const int64_t blocks = 40, width = 6;
      at::Tensor q = at::randn({s.B, s.H, s.D}, gen).to(dtype);
      at::Tensor keys = at::randn({blocks, s.block_size, s.KV, s.D}, gen).to(dtype);
      at::Tensor values = at::randn({blocks, s.block_size, s.KV, s.D}, gen).to(dtype);
      at::Tensor tables = at::randperm(blocks, gen).narrow(0, 0, s.B * width).view({s.B, width}).contiguous();
      at::Tensor lens = at::randint(1, width * s.block_size + 1, {s.B}, gen);
      lens[0] = width * s.block_size;
      at::Tensor want = reference_paged_attention(q.to(at::kFloat), keys.to(at::kFloat), values.to(at::kFloat), tables,
                                                  lens, s.window, s.softcap);
      // Each row whole, then cut into 3 and 7 parts (Note [Split decode attention]; some parts past
      // a row's end, parts of one position at block size 1).
      for (int64_t splits : {1, 3, 7}) {
        at::Tensor got = internal::paged_decode_attention_cuda(q.to(cuda), keys.to(cuda), values.to(cuda),
                                                               tables.to(cuda), lens.to(cuda), s.window,
                                                               1.0 / std::sqrt(double(s.D)), s.softcap, tiled, splits);
        const double diff = (got.to(at::kCPU).to(at::kFloat) - want).abs().max().item<double>();
        std::printf("[cuda paged attention, %s kernel, %ld parts, %s H=%ld KV=%ld D=%ld bs=%ld window=%ld "
                    "softcap=%g] max diff %.3g\n",
                    tiled ? "tiled" : "heads", splits, c10::toString(dtype), s.H, s.KV, s.D, s.block_size, s.window,
                    s.softcap, diff);
        EXPECT_LT(diff, dtype == at::kFloat ? 1e-5 : 2e-2);
      }
    }
    {
      // Rows long enough, and few enough, that the kernel cuts them itself (splits -1), on this
      // device, with a window on some layers' scale: the same attention as the whole rows.
      const Shape s{2, 14, 2, 64, 16, 0, 0};
      const int64_t blocks = 160, width = 64;  // up to 1024 positions a row
      at::Tensor q = at::randn({s.B, s.H, s.D}, gen).to(dtype);
      at::Tensor keys = at::randn({blocks, s.block_size, s.KV, s.D}, gen).to(dtype);
      at::Tensor values = at::randn({blocks, s.block_size, s.KV, s.D}, gen).to(dtype);
      at::Tensor tables = at::randperm(blocks, gen).narrow(0, 0, s.B * width).view({s.B, width}).contiguous();
      at::Tensor lens = at::tensor({1000, 700}, at::kLong);
      // 4 parts of 256 on an H100 (132 multiprocessors; any device of 13 or more).
      ASSERT_EQ(internal::choose_decode_split(s.B, s.H, s.KV, width * s.block_size, 0, tiled, 132).splits, 4);
      for (int64_t window : {0, 600}) {
        at::Tensor want = reference_paged_attention(q.to(at::kFloat), keys.to(at::kFloat), values.to(at::kFloat),
                                                    tables, lens, window, 0.0);
        at::Tensor got = internal::paged_decode_attention_cuda(q.to(cuda), keys.to(cuda), values.to(cuda),
                                                               tables.to(cuda), lens.to(cuda), window,
                                                               1.0 / std::sqrt(double(s.D)), 0.0, tiled);
        const double diff = (got.to(at::kCPU).to(at::kFloat) - want).abs().max().item<double>();
        std::printf("[cuda paged attention, %s kernel, long rows cut as chosen, %s window=%ld] max diff %.3g\n",
                    tiled ? "tiled" : "heads", c10::toString(dtype), window, diff);
        EXPECT_LT(diff, dtype == at::kFloat ? 1e-5 : 2e-2);
      }
    }
    Status check = internal::check_paged_decode_attention_cuda(cuda, dtype, tiled);
    EXPECT_TRUE(check.ok()) << check.to_string();
  }
  // Groups the tiled kernel does not take: more query heads per KV head than it has teams.
  EXPECT_FALSE(internal::tiled_decode_attention_supported(32, 1, 128));
  EXPECT_FALSE(internal::tiled_decode_attention_supported(8, 1, 256));
}

// Note [Split decode attention]: a launch is cut into parts only where its rows leave the device
// mostly idle and their contexts are long, never into parts shorter than kMinSplitLen (save the
// rounding of an even cut), and the parts always cover the longest context a row can have.
TEST(DecodeAttention, SplitIsChosenFromShapes) {
  using internal::choose_decode_split;
  const int64_t h100 = 132;
  // Qwen2.5-0.5B (14 query heads over 2 KV heads: 2 blocks of the heads kernel per KV head).
  EXPECT_EQ(choose_decode_split(512, 14, 2, 4352, 0, false, h100).splits, 1);  // 2048 blocks fill it
  EXPECT_EQ(choose_decode_split(128, 14, 2, 4352, 0, false, h100).splits, 1);
  EXPECT_EQ(choose_decode_split(4, 14, 2, 300, 0, false, h100).splits, 1);      // too short to cut
  EXPECT_EQ(choose_decode_split(4, 14, 2, 8192, 300, false, h100).splits, 1);   // the window is short
  const auto four = choose_decode_split(4, 14, 2, 4352, 0, false, h100);      // 16 blocks: 17 parts of 256
  EXPECT_EQ(four.splits, 17);
  EXPECT_EQ(four.split_len, 256);
  EXPECT_EQ(choose_decode_split(4, 14, 2, 4352, 0, /*tiled=*/true, h100).splits, 17);  // 8 blocks, same cap
  EXPECT_EQ(choose_decode_split(64, 14, 2, 4352, 0, false, h100).splits, 2);   // 256 blocks
  EXPECT_EQ(choose_decode_split(1, 28, 4, 32768, 0, false, h100).splits, 33);  // Qwen2.5-7B: 8 blocks
  EXPECT_EQ(choose_decode_split(1, 14, 2, 32768, 0, false, h100).splits, internal::kMaxSplits);  // 4 blocks
  EXPECT_EQ(choose_decode_split(4, 14, 2, 4352, 0, false, /*sm_count=*/0).splits, 1);  // device unknown
  for (int64_t batch : {1, 2, 3, 7, 16, 33, 100}) {
    for (int64_t capacity : {512, 600, 1000, 4352, 9999, 32768, 131072}) {
      for (int64_t window : {0, 700, 4096}) {
        for (bool tiled : {false, true}) {
          const auto s = choose_decode_split(batch, 28, 4, capacity, window, tiled, h100);
          const int64_t span = window > 0 ? std::min(capacity, window) : capacity;
          if (s.splits == 1) continue;
          EXPECT_GE(s.splits * s.split_len, span) << batch << " " << capacity << " " << window;
          EXPECT_LT((s.splits - 1) * s.split_len, span);  // no part starts past the span
          EXPECT_LE(s.splits, internal::kMaxSplits);
          EXPECT_GE(s.split_len * internal::kMaxSplits, span);
          EXPECT_GE(s.split_len, internal::kMinSplitLen - 1);
          const int64_t blocks = batch * 4 * (tiled ? 1 : 2);
          EXPECT_LT(blocks * (s.splits - 1), 2 * h100) << "cut more than the device needs";
        }
      }
    }
  }
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

// A Qwen3 (q_norm/k_norm, head_dim 16 != hidden / heads) with attention_bias (o_proj bias too) and
// dynamic RoPE over max_position_embeddings 6, every parameter random.
std::shared_ptr<models::CausalLM> qwen3_model(uint64_t seed) {
  models::ModelConfig c = models::testing::tiny_config("qwen3", /*kv_heads=*/2, /*tied=*/false, testing::kVocab);
  c.head_dim = 16;
  c.attention_bias = true;
  c.max_position_embeddings = 6;
  c.rope_scaling.rope_type = "dynamic";
  c.rope_scaling.factor = 2.0;
  auto model = models::CausalLM::create(c, models::ModelInit{at::kFloat, seed});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : (*model)->named_parameters()) {
    const double base = p.key().find("norm") != std::string::npos ? 1.0 : 0.0;
    p.value().copy_(at::randn(p.value().sizes(), gen) * 0.2 + base);
  }
  return *model;
}

// Prefill 5 columns (row 0 left-padded, a hole in row 2), then 4 decode steps: positions reach 8,
// past max_position_embeddings. Returns each call's logits; the inputs depend only on `seed`.
std::vector<at::Tensor> run_steps(StepModel& step, uint64_t seed, bool hole = true) {
  const int64_t B = 3, P = 5, steps = 4, cap = P + steps + 2;
  auto cache = models::KVCache::create(step.cache_config(), {B, cap, at::kFloat, at::kCPU});
  EXPECT_TRUE(cache.ok()) << cache.status().to_string();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor mask = at::ones({B, cap}, at::kLong);
  mask[0].narrow(0, 0, 3).fill_(0);
  if (hole) mask[2][P + 1] = 0;
  at::Tensor ids = at::randint(0, testing::kVocab, {B, P}, gen), pos = (mask.narrow(1, 0, P).cumsum(1) - 1).clamp_min(0);
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t <= steps; ++t) {
    out.push_back(step.logits(step.forward_step(ids, pos, *cache, mask)));
    ids = at::randint(0, testing::kVocab, {B, 1}, gen);
    pos = pos.narrow(1, pos.size(1) - 1, 1) + 1;
  }
  return out;
}

// run_steps(step, seed, /*hole=*/false) through the paged cache: the same prefill, copied into
// blocks of `block_size`, then the decode steps by decode_step. `padded` runs them as a graph
// would: 5 rows (2 padding) and the widest block table.
std::vector<at::Tensor> run_paged_steps(StepModel& step, uint64_t seed, int64_t block_size, bool padded) {
  const int64_t B = 3, P = 5, steps = 4;
  auto cache = internal::BlockCache::create(step.cache_config(), at::kFloat, B, P + steps, block_size, at::kCPU);
  auto prefill = models::KVCache::create(step.cache_config(), {B, P, at::kFloat, at::kCPU});
  EXPECT_TRUE(cache.ok() && prefill.ok());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor mask = at::ones({B, P}, at::kLong);
  mask[0].narrow(0, 0, 3).fill_(0);
  at::Tensor ids = at::randint(0, testing::kVocab, {B, P}, gen), pos = (mask.cumsum(1) - 1).clamp_min(0);
  std::vector<at::Tensor> out{step.logits(step.forward_step(ids, pos, *prefill, mask))};
  cache->admit(*prefill, {2, P, P}, {0, 1, 2}, {0, 1, 2});
  const int64_t rows = padded ? 5 : B, width = padded ? (P + steps + block_size - 1) / block_size : 0;
  for (int64_t t = 1; t <= steps; ++t) {
    ids = at::randint(0, testing::kVocab, {B, 1}, gen);
    pos = pos.narrow(1, pos.size(1) - 1, 1) + 1;
    auto [table, w] = cache->append({0, 1, 2}, rows, width);
    table.narrow(0, 0, B).select(1, w + kTokenId).copy_(ids.squeeze(1));
    table.narrow(0, 0, B).select(1, w + kPosition).copy_(pos.squeeze(1));
    StepInputs in = step_inputs(table, w);
    out.push_back(step.logits(step.decode_step(in.input_ids, in.position_ids, cache->kv(), in.batch))
                      .narrow(0, 0, B).unsqueeze(1));
  }
  return out;
}

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

// The rollout forward of `full` (decode kernel included), unsplit and over two TP ranks, equals
// the models' forward_step.
void expect_rollout_forward_like_models(const std::shared_ptr<models::CausalLM>& full, const std::string& label) {  // The rollout forward (decode kernel included) equals the models' forward_step.
  struct ModelsStep final : StepModel {
    explicit ModelsStep(std::shared_ptr<models::CausalLM> m) : model(std::move(m)) {}
    const models::ModelConfig& cache_config() const override { return model->config(); }
    c10::ScalarType dtype() const override { return at::kFloat; }
    c10::Device device() const override { return at::kCPU; }
    at::Tensor forward_step(const at::Tensor& ids, const at::Tensor& pos, models::KVCache& cache,
                            const at::Tensor& mask) override {
      return model->forward_step(ids, pos, cache, mask);  // already logits
    }
    at::Tensor decode_step(const at::Tensor&, const at::Tensor&, PagedKV&, const PagedBatch&) override {
      TORCH_CHECK(false, "the reference decodes through forward_step");
    }
    at::Tensor logits(const at::Tensor& already_logits) override { return already_logits; }
    Status load_weights_by_reference(const models::TensorMap&) override { return Status(); }
    std::shared_ptr<models::CausalLM> model;
  };
  ModelsStep reference(full);
  CausalLMStepModel single(full);
  const std::vector<at::Tensor> want = run_steps(reference, 5);
  const double single_diff = max_diff(run_steps(single, 5), want);
  std::printf("[rollout forward %s] max |logits - models forward_step| = %.3g\n", label.c_str(), single_diff);
  EXPECT_LT(single_diff, 1e-5);
  // The paged decode (kernel or gathered attention, compact or padded like a graph) equals it too.
  const std::vector<at::Tensor> want_paged = run_steps(reference, 5, /*hole=*/false);
  for (int64_t block_size : {1, 2, 16}) {
    for (bool padded : {false, true}) {
      const double d = max_diff(run_paged_steps(single, 5, block_size, padded), want_paged);
      std::printf("[paged decode %s bs=%ld padded=%d] max |logits - models forward_step| = %.3g\n", label.c_str(),
                  block_size, padded, d);
      EXPECT_LT(d, 1e-5);
    }
  }
  // Two TP ranks cut with the production split (tp_split_of / tp_slice / tp_rank_config).
  ThreadAllReduce all_reduce(2);
  std::vector<std::unique_ptr<CausalLMStepModel>> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    auto config = tp_rank_config(full->config(), 2);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    models::TensorMap tensors;
    for (const auto& [name, t] : full->parameter_map()) {
      tensors.emplace(name, tp_slice(t.detach(), tp_split_of(name), 2, r).contiguous());
    }
    // Replicated: Qwen3's q_norm (head_dim) and o_proj's bias (hidden) stay whole.
    for (const char* whole : {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.o_proj.bias"}) {
      if (tensors.count(whole) != 0) {
        EXPECT_EQ(tensors.at(whole).sizes(), full->parameter_map().at(whole).sizes());
      }
    }
    auto model = models::CausalLM::from_parameters(*config, tensors);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    ranks.push_back(std::make_unique<CausalLMStepModel>(*model, [&](at::Tensor& t) { all_reduce(t); }, 2));
  }
  std::vector<std::vector<at::Tensor>> outputs(2);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < 2; ++r) threads.emplace_back([&, r] { outputs[r] = run_steps(*ranks[r], 5); });
  for (auto& t : threads) t.join();
  std::vector<std::vector<at::Tensor>> paged(2);
  threads.clear();
  for (size_t r = 0; r < 2; ++r) threads.emplace_back([&, r] { paged[r] = run_paged_steps(*ranks[r], 5, 2, true); });
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < 2; ++r) EXPECT_LT(max_diff(paged[r], want_paged), 1e-5) << "paged TP rank " << r;
  for (size_t r = 0; r < 2; ++r) {
    const double d = max_diff(outputs[r], want);
    std::printf("[rollout TP rank %zu %s] max |logits - unsplit| = %.3g\n", r, label.c_str(), d);
    EXPECT_LT(d, 1e-5);
  }
}

TEST(TensorParallelSeam, Qwen3WithBiasesAndDynamicRopeSplitsLikeOne) {
  expect_rollout_forward_like_models(qwen3_model(41), "qwen3 + dynamic rope");
}

// Mistral's sliding window (3, under 9 columns with a hole), Gemma2's windowed and full layers,
// softcaps, scale and sandwich norms (applied after the TP reduction); the MoE families' experts
// split per expert, with the router and Qwen2-MoE's shared-expert gate whole.
TEST(TensorParallelSeam, MistralGemma2AndMoeSplitLikeOne) {
  for (const char* type : {"mistral", "gemma2", "gemma3_text", "qwen3_moe", "qwen2_moe"}) {
    SCOPED_TRACE(type);
    models::ModelConfig c = models::testing::tiny_config(type, /*kv_heads=*/2, /*tied=*/false, testing::kVocab);
    auto model = models::CausalLM::create(c, models::ModelInit{at::kFloat, 43});
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    models::testing::randomise(**model, 44);
    expect_rollout_forward_like_models(*model, type);
  }
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
