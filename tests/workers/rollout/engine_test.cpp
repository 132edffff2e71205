// KVCacheEngine against an independent reference: greedy tokens are the argmax of a full
// (no-cache) forward, rollout_log_probs are its log-softmax, for left-padded mixed-length batches
// with EOS inside; scheduling (slots, budget, continuous/static) never changes the output; seeds
// reproduce; validation and do_sample follow verl.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "proto/device.hpp"
#include "tests/workers/rollout/rollout_test_util.hpp"
#include "workers/models/decoder.hpp"
#include "workers/rollout/internal/block_cache.hpp"
#include "workers/rollout/internal/generation_loop.hpp"

#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tessera::rollout {
namespace {

using testing::get;

constexpr int64_t kP = 8;
const std::vector<int64_t> kLengths = {8, 3, 5, 1, 7, 2};

// Checks every valid response token of `out` against the full-forward reference: it must be the
// argmax (greedy) and, when present, rollout_log_probs must equal log_softmax(logits / T).
void check_against_full_forward(models::CausalLM& model, const proto::DataProto& out, bool greedy, double temperature) {
  at::Tensor logits = testing::full_forward_logits(model, out);
  at::Tensor responses = get(out, "responses");
  const bool has_lp = out.batch().contains("rollout_log_probs");
  at::Tensor lp = has_lp ? get(out, "rollout_log_probs") : at::Tensor();
  std::vector<int64_t> valid = testing::valid_lengths(out, kP);
  int64_t checked = 0, exact_argmax = 0;
  double max_lp_diff = 0.0;
  for (int64_t b = 0; b < responses.size(0); ++b) {
    for (int64_t t = 0; t < valid[static_cast<size_t>(b)]; ++t) {
      at::Tensor row = logits[b][kP - 1 + t];
      const int64_t token = responses[b][t].item<int64_t>();
      if (greedy) {
        // The chosen token is a maximiser up to float rounding between the two code paths.
        EXPECT_GE(row[token].item<double>(), row.max().item<double>() - 1e-5) << "row " << b << " t " << t;
        exact_argmax += row.argmax().item<int64_t>() == token;
      }
      if (has_lp) {
        double ref = at::log_softmax(row / temperature, 0)[token].item<double>();
        max_lp_diff = std::max(max_lp_diff, std::abs(ref - lp[b][t].item<double>()));
      }
      ++checked;
    }
    for (int64_t t = valid[static_cast<size_t>(b)]; has_lp && t < responses.size(1); ++t) {
      EXPECT_EQ(lp[b][t].item<float>(), -1.0f) << "log-prob padding at row " << b << " t " << t;
    }
  }
  std::printf("[reference] %ld tokens checked, %ld exact argmax, max |logprob - ref| = %.3g\n", checked, exact_argmax,
              max_lp_diff);
  if (greedy) {
    EXPECT_EQ(exact_argmax, checked);
  }
  EXPECT_LT(max_lp_diff, 1e-4);
  EXPECT_GT(checked, 0);
}

// The first-EOS truncation of `full` (responses generated with ignore_eos), padded with `pad`.
at::Tensor truncate_at_eos(const at::Tensor& full, const std::vector<int64_t>& eos, int64_t pad) {
  at::Tensor out = full.clone();
  for (int64_t b = 0; b < full.size(0); ++b) {
    bool seen = false;
    for (int64_t t = 0; t < full.size(1); ++t) {
      if (seen) out[b][t] = pad;
      if (std::count(eos.begin(), eos.end(), full[b][t].item<int64_t>()) > 0) seen = true;
    }
  }
  return out;
}

TEST(KVCacheEngine, GreedyEqualsFullForwardArgmaxWithEosInside) {
  auto model = testing::tiny_model(1);
  RolloutConfig cfg = testing::test_config();
  cfg.do_sample = false;
  cfg.calculate_log_probs = true;
  cfg.ignore_eos = true;
  proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 3, /*eos=*/95);
  proto::DataProto full = testing::generate(*testing::make_engine(model, cfg), prompts);
  check_against_full_forward(*model, full, /*greedy=*/true, 1.0);

  // Make EOS a token the greedy path emits early in row 0, so rows stop at different places.
  at::Tensor full_resp = get(full, "responses");
  const int64_t eos = full_resp[0][3].item<int64_t>();
  cfg.ignore_eos = false;
  prompts.meta_info()["eos_token_id"] = nlohmann::json::array({eos, 94});
  proto::DataProto out = testing::generate(*testing::make_engine(model, cfg), prompts);
  check_against_full_forward(*model, out, /*greedy=*/true, 1.0);
  EXPECT_TRUE(get(out, "responses").equal(truncate_at_eos(full_resp, {eos, 94}, /*pad=*/0)));
  std::vector<int64_t> valid = testing::valid_lengths(out, kP);
  EXPECT_LE(valid[0], 4);
  EXPECT_LT(*std::min_element(valid.begin(), valid.end()), cfg.response_length);
}

TEST(KVCacheEngine, SampledLogProbsMatchFullForward) {
  auto model = testing::tiny_model(2);
  RolloutConfig cfg = testing::test_config();
  cfg.temperature = 0.7;
  cfg.top_k = 20;
  cfg.top_p = 0.9;
  cfg.calculate_log_probs = true;
  proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 4, /*eos=*/5);
  proto::DataProto out = testing::generate(*testing::make_engine(model, cfg, 11), prompts);
  check_against_full_forward(*model, out, /*greedy=*/false, 0.7);
}

// Slot counts, prefill budgets and batching modes change the schedule, never the tokens.
TEST(KVCacheEngine, SchedulingNeverChangesTheOutput) {
  auto model = testing::tiny_model(3);
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 14; ++i) lengths.push_back(1 + (i * 5) % kP);
  proto::DataProto prompts = testing::prompt_batch(lengths, kP, 5, /*eos=*/nlohmann::json::array({7, 11, 13, 17}));
  for (bool sample : {false, true}) {
    RolloutConfig base = testing::test_config(/*response_length=*/16);
    base.do_sample = sample;
    base.calculate_log_probs = true;
    base.max_num_seqs = 1024;
    base.batching = BatchingMode::static_waves;
    proto::DataProto reference = testing::generate(*testing::make_engine(model, base, 9), prompts);
    struct Variant {
      BatchingMode mode;
      int64_t slots, budget, block_size;
    };
    for (Variant v : {Variant{BatchingMode::continuous, 3, 64, 16}, Variant{BatchingMode::continuous, 5, 8, 3},
                      Variant{BatchingMode::static_waves, 4, 16, 1}, Variant{BatchingMode::continuous, 1024, 1, 4}}) {
      RolloutConfig cfg = base;
      cfg.batching = v.mode;
      cfg.max_num_seqs = v.slots;
      cfg.max_num_batched_tokens = v.budget;
      cfg.kv_block_size = v.block_size;
      auto engine = testing::make_engine(model, cfg, 9);
      proto::DataProto out = testing::generate(*engine, prompts);
      SCOPED_TRACE(::testing::Message() << "sample=" << sample << " mode=" << to_string(v.mode) << " slots=" << v.slots
                                        << " budget=" << v.budget << " block=" << v.block_size);
      EXPECT_TRUE(get(out, "responses").equal(get(reference, "responses")));
      EXPECT_TRUE(get(out, "attention_mask").equal(get(reference, "attention_mask")));
      EXPECT_LT((get(out, "rollout_log_probs") - get(reference, "rollout_log_probs")).abs().max().item<double>(), 1e-5);
      const GenerationStats& s = engine->last_stats();
      std::printf("[schedule %s slots=%ld budget=%ld sample=%d] steps=%ld row_steps=%ld admissions=%ld blocks=%ld\n",
                  to_string(v.mode), v.slots, v.budget, sample, s.decode_steps, s.decode_row_steps, s.admissions,
                  s.kv_blocks);
    }
    if (!sample) check_against_full_forward(*model, reference, /*greedy=*/true, 1.0);
  }
}

TEST(KVCacheEngine, ContinuousBatchingRefillsSlots) {
  auto model = testing::tiny_model(4);
  std::vector<int64_t> lengths(12, 4);
  proto::DataProto prompts = testing::prompt_batch(lengths, kP, 6, nlohmann::json::array({3, 9, 21, 33, 41, 50}));
  RolloutConfig cfg = testing::test_config(/*response_length=*/24);
  cfg.max_num_seqs = 4;
  cfg.temperature = 1.0;
  auto continuous = testing::make_engine(model, cfg, 1);
  testing::generate(*continuous, prompts);
  cfg.batching = BatchingMode::static_waves;
  auto waves = testing::make_engine(model, cfg, 1);
  testing::generate(*waves, prompts);
  const GenerationStats &c = continuous->last_stats(), &w = waves->last_stats();
  std::printf("[refill] continuous steps=%ld admissions=%ld; static steps=%ld admissions=%ld\n", c.decode_steps,
              c.admissions, w.decode_steps, w.admissions);
  EXPECT_EQ(c.generated_tokens, w.generated_tokens);
  EXPECT_GT(c.admissions, 3);               // prompts admitted as slots free up, not in 3 waves
  EXPECT_LE(c.decode_steps, w.decode_steps);  // the long tail of each wave is not waited for
  EXPECT_LE(c.decode_row_steps, 4 * c.decode_steps);
}

TEST(KVCacheEngine, SeedsReproduceAndCallsDiffer) {
  auto model = testing::tiny_model(5);
  proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 7, 95);
  RolloutConfig cfg = testing::test_config();
  auto a = testing::make_engine(model, cfg, 42), b = testing::make_engine(model, cfg, 42);
  auto c = testing::make_engine(model, cfg, 43);
  at::Tensor a1 = get(testing::generate(*a, prompts), "responses");
  at::Tensor a2 = get(testing::generate(*a, prompts), "responses");
  at::Tensor b1 = get(testing::generate(*b, prompts), "responses");
  at::Tensor b2 = get(testing::generate(*b, prompts), "responses");
  at::Tensor c1 = get(testing::generate(*c, prompts), "responses");
  EXPECT_TRUE(a1.equal(b1));
  EXPECT_TRUE(a2.equal(b2));
  EXPECT_FALSE(a1.equal(a2));  // the next call draws a new seed
  EXPECT_FALSE(a1.equal(c1));  // another seed samples differently
}

// generate_tokens (the multi-turn rollout's turns): each row stops at its own budget, and a row
// samples from its stream whatever its position, batch-mates or budget.
TEST(KVCacheEngine, GenerateTokensKeepsEachRowsBudgetAndStream) {
  auto model = testing::tiny_model(6);
  RolloutConfig cfg = testing::test_config();
  cfg.ignore_eos = true;
  cfg.do_sample = true;
  auto engine = testing::make_engine(model, cfg, 3);
  TokenRequests a;
  a.prompts = {{5, 6, 7}, {9, 10}, {11, 12, 13, 14}};
  a.max_tokens = {3, 12, 1};
  a.streams = {7, 8, 9};
  a.eos_token_ids = {2};
  a.seed = 123;
  auto rows_a = engine->generate_tokens(a);
  ASSERT_TRUE(rows_a.ok()) << rows_a.status().to_string();
  ASSERT_EQ(rows_a->size(), 3U);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(static_cast<int64_t>((*rows_a)[i].tokens.size()), a.max_tokens[i]);
  EXPECT_EQ(engine->last_stats().generated_tokens, 16);
  // The same streams, reversed and with the whole budget: each row's tokens begin with A's.
  TokenRequests b = a;
  std::reverse(b.prompts.begin(), b.prompts.end());
  std::reverse(b.streams.begin(), b.streams.end());
  b.max_tokens = {12, 12, 12};
  auto rows_b = engine->generate_tokens(b);
  ASSERT_TRUE(rows_b.ok()) << rows_b.status().to_string();
  for (size_t i = 0; i < 3; ++i) {
    const auto& want = (*rows_a)[i].tokens;
    const auto& got = (*rows_b)[2 - i].tokens;
    ASSERT_EQ(got.size(), 12U);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "stream " << a.streams[i];
  }
  // Another seed samples differently; a budget past response_length is refused.
  TokenRequests c = b;
  c.seed = 124;
  auto rows_c = engine->generate_tokens(c);
  ASSERT_TRUE(rows_c.ok());
  EXPECT_NE((*rows_c)[0].tokens, (*rows_b)[0].tokens);
  c.max_tokens = {13, 1, 1};
  auto refused = engine->generate_tokens(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("budget 13"), std::string::npos) << refused.status().to_string();
}

// verl's n: the trainer repeats the prompts; the engine samples each repeated row independently.
TEST(KVCacheEngine, RepeatedPromptsSampleIndependently) {
  auto model = testing::tiny_model(6);
  auto repeated = testing::prompt_batch({5, 3}, kP, 8, 95).repeat(3, /*interleave=*/true);
  ASSERT_TRUE(repeated.ok());
  RolloutConfig cfg = testing::test_config();
  cfg.n = 3;
  proto::DataProto out = testing::generate(*testing::make_engine(model, cfg, 3), *repeated);
  at::Tensor r = get(out, "responses");
  ASSERT_EQ(r.size(0), 6);
  EXPECT_FALSE(r[0].equal(r[1]));
  EXPECT_FALSE(r[1].equal(r[2]));
  EXPECT_TRUE(get(out, "prompts")[0].equal(get(out, "prompts")[2]));
}

// Note [Shared prompt prefill]: n samples of a prompt admitted together are prefilled once. The
// output equals prefilling every copy (rollout.enable_prefix_caching=false), sampled and greedy,
// under schedules that split a prompt's samples over several admissions, and the prefill computes
// 1/n of the tokens when all samples fit in one admission.
TEST(KVCacheEngine, SharedPromptPrefillEqualsPrefillingEveryCopy) {
  auto model = testing::tiny_model(8);
  constexpr int64_t n = 4;
  auto repeated = testing::prompt_batch({5, 3, 8, 1, 6}, kP, 12, nlohmann::json::array({7, 11})).repeat(n, true);
  ASSERT_TRUE(repeated.ok());
  for (bool sample : {true, false}) {
    struct Schedule {
      BatchingMode mode;
      int64_t slots, budget;
    };
    for (Schedule sc : {Schedule{BatchingMode::continuous, 64, 1024}, Schedule{BatchingMode::continuous, 6, 16},
                        Schedule{BatchingMode::static_waves, 7, 12}}) {
      RolloutConfig cfg = testing::test_config(/*response_length=*/10);
      cfg.n = n;
      cfg.do_sample = sample;
      cfg.calculate_log_probs = true;
      cfg.batching = sc.mode;
      cfg.max_num_seqs = sc.slots;
      cfg.max_num_batched_tokens = sc.budget;
      cfg.kv_block_size = 2;
      cfg.enable_prefix_caching = false;
      auto every = testing::make_engine(model, cfg, 21);
      proto::DataProto want = testing::generate(*every, *repeated);
      cfg.enable_prefix_caching = true;
      auto shared = testing::make_engine(model, cfg, 21);
      proto::DataProto got = testing::generate(*shared, *repeated);
      SCOPED_TRACE(::testing::Message() << "sample=" << sample << " slots=" << sc.slots << " budget=" << sc.budget);
      EXPECT_TRUE(get(got, "responses").equal(get(want, "responses")));
      EXPECT_TRUE(get(got, "attention_mask").equal(get(want, "attention_mask")));
      // Sharing changes which prompts share an admission, hence the batching of the float maths.
      EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-5);
      const GenerationStats &a = every->last_stats(), &b = shared->last_stats();
      EXPECT_EQ(a.shared_prompt_tokens, 0);
      EXPECT_GT(b.shared_prompt_tokens, 0);
      EXPECT_EQ(a.shared_kv_blocks, 0);
      EXPECT_GT(b.shared_kv_blocks, 0);
      EXPECT_EQ(b.prompt_tokens + b.shared_prompt_tokens, a.prompt_tokens);
      EXPECT_EQ(a.shared_prefill_flops, 0);
      EXPECT_NEAR(b.prefill_flops + b.shared_prefill_flops, a.prefill_flops, 1e-9 * a.prefill_flops);
      if (sc.slots == 64) {  // one admission: each prompt prefilled once, at the common width
        EXPECT_EQ(b.admissions, 1);
        EXPECT_EQ(b.prefill_tokens * n, a.prefill_tokens);
        EXPECT_EQ(b.prompt_tokens, 5 + 3 + 8 + 1 + 6);
        EXPECT_NEAR(b.shared_prefill_flops, (n - 1) * b.prefill_flops, 1e-9 * b.prefill_flops);  // 1/n computed
        // n - 1 samples of each prompt reuse its full blocks of 2 tokens: 2 + 1 + 4 + 0 + 3.
        EXPECT_EQ(b.shared_kv_blocks, (n - 1) * (2 + 1 + 4 + 0 + 3));
      }
      if (sample) {
        EXPECT_FALSE(get(got, "responses")[0].equal(get(got, "responses")[1]));  // samples still differ
      }
    }
  }
}

// enable_chunked_prefill: a prefill over max_num_batched_tokens runs as several forwards, each
// chunk of columns attending to the ones before; the output equals one forward per prefill.
TEST(KVCacheEngine, ChunkedPrefillEqualsOneForward) {
  auto model = testing::tiny_model(16);
  proto::DataProto prompts = testing::prompt_batch({8, 3, 7, 1, 8, 5}, kP, 17, nlohmann::json::array({7, 11}));
  for (bool sample : {false, true}) {
    RolloutConfig cfg = testing::test_config(/*response_length=*/10);
    cfg.do_sample = sample;
    cfg.calculate_log_probs = true;
    cfg.max_num_seqs = 6;
    cfg.max_num_batched_tokens = 5;  // under one 8-token prompt: every prefill is chunked
    cfg.enable_chunked_prefill = false;
    auto whole = testing::make_engine(model, cfg, 2);
    proto::DataProto want = testing::generate(*whole, prompts);
    cfg.enable_chunked_prefill = true;
    auto chunked = testing::make_engine(model, cfg, 2);
    proto::DataProto got = testing::generate(*chunked, prompts);
    EXPECT_TRUE(get(got, "responses").equal(get(want, "responses")));
    EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-5);
    const GenerationStats &w = whole->last_stats(), &c = chunked->last_stats();
    EXPECT_EQ(w.prefill_forwards, w.admissions);
    EXPECT_GT(c.prefill_forwards, c.admissions);
    if (!sample) check_against_full_forward(*model, got, /*greedy=*/true, 1.0);
  }
}

// Note [Preemption]: under a KV-cache cap too small for every sequence at once, prompts wait for
// blocks and the latest admitted sequences are preempted and recomputed; the output equals an
// uncapped run (greedy and sampled, continuous and static, with shared prompt blocks). A cap that
// cannot hold one sequence is an error naming the key.
TEST(KVCacheEngine, PreemptionUnderAKvCapEqualsUncapped) {
  auto model = testing::tiny_model(18);
  auto prompts = testing::prompt_batch({8, 3, 7, 1, 8, 5}, kP, 19, nlohmann::json::array({7, 11})).repeat(2, true);
  ASSERT_TRUE(prompts.ok());
  for (bool sample : {false, true}) {
    for (BatchingMode mode : {BatchingMode::continuous, BatchingMode::static_waves}) {
      RolloutConfig cfg = testing::test_config(/*response_length=*/16);
      cfg.do_sample = sample;
      cfg.calculate_log_probs = true;
      cfg.batching = mode;
      cfg.max_num_seqs = 6;
      cfg.kv_block_size = 2;
      proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 4), *prompts);
      cfg.max_kv_blocks = 14;  // one sequence at its longest (8 + 16 tokens) takes 12
      auto capped = testing::make_engine(model, cfg, 4);
      proto::DataProto got = testing::generate(*capped, *prompts);
      const GenerationStats& s = capped->last_stats();
      SCOPED_TRACE(::testing::Message() << "sample=" << sample << " mode=" << to_string(mode));
      std::printf("[preemption sample=%d %s] blocks=%ld preemptions=%ld recomputed=%ld steps=%ld\n", sample,
                  to_string(mode), s.kv_blocks, s.preemptions, s.recomputed_tokens, s.decode_steps);
      EXPECT_EQ(s.kv_blocks, 14 + 1);
      EXPECT_GT(s.preemptions, 0);
      EXPECT_GT(s.recomputed_tokens, 0);
      EXPECT_TRUE(get(got, "responses").equal(get(want, "responses")));
      EXPECT_TRUE(get(got, "attention_mask").equal(get(want, "attention_mask")));
      EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-5);
    }
  }
  RolloutConfig tiny = testing::test_config(/*response_length=*/16);
  tiny.kv_block_size = 2;
  tiny.max_kv_blocks = 5;
  auto out = testing::make_engine(model, tiny)->generate_sequences(*prompts);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("engine_kwargs.tessera.max_kv_blocks"), std::string::npos)
      << out.status().to_string();
}

// Note [Paged KV cache]: samples of one prompt share its full blocks and own a copy of the partial
// one; every token reads back what the prefill wrote; blocks return to the pool when the last
// holder goes; appends open a new block at a boundary and padding rows use the scratch block.
TEST(BlockCache, SharesFullPromptBlocksAndCopiesThePartialOne) {
  const models::ModelConfig config = testing::tiny_config();
  const int64_t bs = 4, W = 10;
  auto cache = internal::BlockCache::create(config, at::kFloat, /*slots=*/5, /*max_length=*/16, bs, at::kCPU);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  const int64_t total = cache->free_blocks();
  EXPECT_EQ(total, 5 * 4);  // every slot at 16 tokens, plus the scratch block not counted
  auto prefill = models::KVCache::create(config, {2, W, at::kFloat, at::kCPU});
  ASSERT_TRUE(prefill.ok());
  at::Generator gen = at::detail::createCPUGenerator(3);
  for (int64_t l = 0; l < prefill->num_layers(); ++l) {
    prefill->key(l).copy_(at::randn(prefill->key(l).sizes(), gen));
    prefill->value(l).copy_(at::randn(prefill->value(l).sizes(), gen));
  }
  // Row 0: a 10-token prompt (2 full blocks + 2 tokens) for slots 0, 1, 2; row 1: 8 tokens (2
  // full blocks, nothing partial) for slots 3, 4.
  const std::vector<int64_t> lengths = {10, 8};
  EXPECT_EQ(cache->admit(*prefill, lengths, {0, 1, 2, 3, 4}, {0, 0, 0, 1, 1}), 2 * 2 + 1 * 2);
  EXPECT_EQ(cache->free_blocks(), total - (3 + 2 + 2));
  for (int64_t s : {1, 2}) {
    EXPECT_EQ(cache->blocks(s)[0], cache->blocks(0)[0]);
    EXPECT_EQ(cache->blocks(s)[1], cache->blocks(0)[1]);
    EXPECT_NE(cache->blocks(s)[2], cache->blocks(0)[2]);  // the partial block is each sample's own
  }
  EXPECT_EQ(cache->references(cache->blocks(0)[0]), 3);
  EXPECT_EQ(cache->references(cache->blocks(0)[2]), 1);
  EXPECT_EQ(cache->blocks(4), cache->blocks(3));
  for (int64_t slot = 0; slot < 5; ++slot) {
    const int64_t row = slot < 3 ? 0 : 1, len = lengths[static_cast<size_t>(row)];
    ASSERT_EQ(cache->length(slot), len);
    for (int64_t l = 0; l < prefill->num_layers(); ++l) {
      for (int64_t j = 0; j < len; ++j) {
        const int64_t block = cache->blocks(slot)[static_cast<size_t>(j / bs)];
        EXPECT_TRUE(cache->kv().keys[l][block][j % bs].equal(prefill->key(l)[row].select(1, W - len + j)));
        EXPECT_TRUE(cache->kv().values[l][block][j % bs].equal(prefill->value(l)[row].select(1, W - len + j)));
      }
    }
  }
  // Slot 3 (8 tokens) opens a block; slot 0 (10 tokens) writes into its own partial block.
  auto [table, width] = cache->append({3, 0}, /*rows=*/4, /*table_width=*/4);
  ASSERT_EQ(width, 4);
  ASSERT_EQ(table.sizes(), (std::vector<int64_t>{4, 4 + kStepColumns}));
  EXPECT_EQ(cache->blocks(3).size(), 3u);
  EXPECT_EQ(table[0][width + kContextLen].item<int64_t>(), 9);
  EXPECT_EQ(table[0][width + kSlot].item<int64_t>(), cache->blocks(3)[2] * bs + 0);
  EXPECT_EQ(table[1][width + kContextLen].item<int64_t>(), 11);
  EXPECT_EQ(table[1][width + kSlot].item<int64_t>(), cache->blocks(0)[2] * bs + 2);
  EXPECT_EQ(table[1][3].item<int64_t>(), 0);  // past the row's blocks: the scratch block
  for (int64_t r : {2, 3}) {                   // padding rows: one token in block 0
    EXPECT_EQ(table[r][width + kContextLen].item<int64_t>(), 1);
    EXPECT_EQ(table[r][width + kSlot].item<int64_t>(), 0);
    EXPECT_EQ(table[r].narrow(0, 0, width).sum().item<int64_t>(), 0);
  }
  // Shared blocks stay until their last holder goes.
  cache->release(0);
  cache->release(1);
  EXPECT_EQ(cache->references(cache->blocks(2)[0]), 1);
  for (int64_t s : {2, 3, 4}) cache->release(s);
  EXPECT_EQ(cache->free_blocks(), total);
}

// `count` random prompts of 1 + (i * step) % modulo tokens; with `repeat_every` > 0 every
// repeat_every-th prompt appears twice in a row (shared prompt prefill).
std::vector<std::vector<int64_t>> random_prompts(uint64_t seed, int64_t count, int64_t step, int64_t modulo,
                                                 int64_t repeat_every = 0) {
  std::vector<std::vector<int64_t>> prompts;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor p = at::randint(3, testing::kVocab, {1 + (i * step) % modulo}, gen);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    if (repeat_every > 0 && i % repeat_every == 0) prompts.push_back(prompts.back());
  }
  return prompts;
}

// Every row has the same tokens, and log-probs within 1e-5.
void expect_same_rows(const std::vector<GeneratedRow>& got, const std::vector<GeneratedRow>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << "row " << r;
    ASSERT_EQ(got[r].logprobs.size(), want[r].logprobs.size());
    for (size_t t = 0; t < got[r].logprobs.size(); ++t) {
      EXPECT_NEAR(got[r].logprobs[t], want[r].logprobs[t], 1e-5) << "row " << r << " t " << t;
    }
  }
}

// Note [Decode graphs]: the shapes a graph replays (batches padded to buckets, the widest block
// table) give the same tokens and log-probs as compact eager steps, sampled and greedy, for any
// buckets and block size. (The capture itself is a GPU test.)
TEST(KVCacheEngine, GraphShapedDecodeEqualsCompactDecode) {
  auto model = testing::tiny_model(13);
  CausalLMStepModel step(model);
  const auto prompts = random_prompts(4, 11, 3, 7);
  for (bool greedy : {true, false}) {
    internal::LoopOptions base;
    base.slots = 6;
    base.prefill_token_budget = 16;
    base.response_length = 9;
    base.eos_token_ids = {7, 11, 13};
    base.want_logprobs = true;
    base.sampling.greedy = greedy;
    base.call_seed = 99;
    base.block_size = 4;
    GenerationStats compact_stats;
    auto want = internal::run_generation(step, prompts, base, compact_stats);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    for (std::vector<int64_t> buckets : {std::vector<int64_t>{}, std::vector<int64_t>{2, 5}, std::vector<int64_t>{8}}) {
      internal::LoopOptions padded = base;
      padded.decode.static_shapes = true;
      padded.decode.buckets = buckets;
      GenerationStats stats;
      auto got = internal::run_generation(step, prompts, padded, stats);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      SCOPED_TRACE(::testing::Message() << "greedy=" << greedy << " buckets=" << buckets.size());
      expect_same_rows(*got, *want);
      EXPECT_EQ(stats.generated_tokens, compact_stats.generated_tokens);
      EXPECT_GE(stats.decode_row_steps, compact_stats.decode_row_steps);  // padding rows are computed
    }
  }
}

// Note [Lagged token reads]: reading each launch's tokens one step late (the default) gives every
// row the tokens and log-probs that reading them before the next launch gives, under EOS,
// continuous and static batching, shared prompts and preemption under a KV cap; rows that sampled
// an EOS run one step more, whose tokens are dropped.
TEST(KVCacheEngine, LaggedTokenReadsEqualReadingEveryStep) {
  auto model = testing::tiny_model(21);
  CausalLMStepModel step(model);
  const auto prompts = random_prompts(5, 9, 4, 9, /*repeat_every=*/3);
  for (bool greedy : {true, false}) {
    for (BatchingMode mode : {BatchingMode::continuous, BatchingMode::static_waves}) {
      for (int64_t cap : {int64_t{0}, int64_t{12}}) {
        internal::LoopOptions every;
        every.slots = 5;
        every.prefill_token_budget = 24;
        every.response_length = 12;
        every.eos_token_ids = {5, 9, 13, 17, 19};
        every.want_logprobs = true;
        every.sampling.greedy = greedy;
        every.call_seed = 7;
        every.block_size = 2;
        every.batching = mode;
        every.max_kv_blocks = cap;
        every.lag_token_reads = false;
        internal::LoopOptions lagged = every;
        lagged.lag_token_reads = true;
        GenerationStats want_stats, got_stats;
        auto want = internal::run_generation(step, prompts, every, want_stats);
        ASSERT_TRUE(want.ok()) << want.status().to_string();
        auto got = internal::run_generation(step, prompts, lagged, got_stats);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        SCOPED_TRACE(::testing::Message() << "greedy=" << greedy << " mode=" << to_string(mode) << " cap=" << cap);
        expect_same_rows(*got, *want);
        int64_t eos_rows = 0;
        for (const GeneratedRow& row : *want) eos_rows += static_cast<int64_t>(row.tokens.size()) < every.response_length;
        std::printf("[lagged greedy=%d %s cap=%ld] eos rows=%ld row steps %ld (every step: %ld) preemptions %ld (%ld)\n",
                    greedy, to_string(mode), cap, eos_rows, got_stats.decode_row_steps, want_stats.decode_row_steps,
                    got_stats.preemptions, want_stats.preemptions);
        EXPECT_GT(eos_rows, 0);
        EXPECT_EQ(got_stats.generated_tokens, want_stats.generated_tokens);
        EXPECT_GT(got_stats.shared_prompt_tokens, 0);
        if (cap > 0) {
          EXPECT_GT(got_stats.preemptions, 0);
        }
        // An EOS row's extra step is computed and dropped; none is computed without EOS rows.
        EXPECT_GT(got_stats.decode_row_steps, want_stats.decode_row_steps);
      }
    }
  }
}

// Graph-captured decode equals eager decode token for token (greedy and sampled, fp32), replays
// most steps, and leaves the device memory as it found it.
TEST(KVCacheEngine, OnCudaGraphDecodeEqualsEagerDecode) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  auto allocated = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current; };
  auto model = testing::tiny_model(14);
  model->to(at::Device("cuda:0"));
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 24; ++i) lengths.push_back(1 + (i * 5) % kP);
  proto::DataProto prompts = testing::prompt_batch(lengths, kP, 15, nlohmann::json::array({7, 11, 13}));
  for (bool sample : {false, true}) {
    RolloutConfig cfg = testing::test_config(/*response_length=*/20);
    cfg.do_sample = sample;
    cfg.calculate_log_probs = true;
    cfg.max_num_seqs = 16;
    proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
    cfg.enforce_eager = false;
    testing::generate(*testing::make_engine(model, cfg, 3), prompts);  // first use: library workspaces
    auto graphs = testing::make_engine(model, cfg, 3);
    const int64_t before = allocated();
    {
      proto::DataProto got = testing::generate(*graphs, prompts);
      const GenerationStats& s = graphs->last_stats();
      std::printf("[graphs sample=%d] captured %ld, replayed %ld of %ld steps\n", sample, s.graphs_captured,
                  s.graph_replays, s.decode_steps);
      EXPECT_TRUE(get(got, "responses").to(at::kCPU).equal(get(want, "responses").to(at::kCPU)));
      EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-4);
      EXPECT_GT(s.graphs_captured, 0);
      EXPECT_GT(s.graph_replays, s.decode_steps / 2);
    }
    EXPECT_EQ(allocated(), before);  // the cache, the graphs and their pool are gone with the call
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// A MoE model's decode steps capture into CUDA graphs in bf16 on sm90/sm100, where the grouped
// expert GEMM keeps its offsets on the device, and give eager decode's tokens (greedy); in fp32
// (LibTorch's fallback reads the offsets on the host) enforce_eager=false is refused naming it.
TEST(KVCacheEngine, OnCudaMoeGraphDecodeEqualsEagerDecodeInBf16) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  const models::ModelConfig c = models::testing::tiny_config("qwen3_moe", 2, false, testing::kVocab);
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 12; ++i) lengths.push_back(1 + (i * 5) % kP);
  proto::DataProto prompts = testing::prompt_batch(lengths, kP, 15, nlohmann::json::array({7, 11, 13}));
  RolloutConfig cfg = testing::test_config(/*response_length=*/16);
  cfg.do_sample = false;
  cfg.max_num_seqs = 16;
  {
    auto fp32 = models::CausalLM::create(c, models::ModelInit{at::kFloat, 21});
    ASSERT_TRUE(fp32.ok());
    (*fp32)->to(cuda);
    RolloutConfig eager_off = cfg;
    eager_off.enforce_eager = false;
    auto refused = KVCacheEngine::create(*fp32, eager_off, EngineOptions{3});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("enforce_eager=false"), std::string::npos) << refused.status().to_string();
  }
  const int major = proto::cuda_compute_major(cuda);
  if (major != 9 && major != 10) GTEST_SKIP() << "the grouped GEMM captures on sm90/sm100 only (this is sm" << major << "x)";
  auto model = models::CausalLM::create(c, models::ModelInit{at::kBFloat16, 21});
  ASSERT_TRUE(model.ok());
  (*model)->to(cuda);
  cfg.dtype = "bfloat16";
  proto::DataProto want = testing::generate(*testing::make_engine(*model, cfg, 3), prompts);
  cfg.enforce_eager = false;
  auto graphs = testing::make_engine(*model, cfg, 3);
  proto::DataProto got = testing::generate(*graphs, prompts);
  const GenerationStats& s = graphs->last_stats();
  std::printf("[moe graphs] captured %ld, replayed %ld of %ld steps\n", s.graphs_captured, s.graph_replays,
              s.decode_steps);
  EXPECT_TRUE(get(got, "responses").to(at::kCPU).equal(get(want, "responses").to(at::kCPU)));
  EXPECT_GT(s.graph_replays, s.decode_steps / 2);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The multi-turn rollout's turns on a GPU: rows with their own budgets and streams, decoded from
// CUDA graphs, give the CPU's greedy tokens (fp32), each row stopping at its budget.
TEST(KVCacheEngine, OnCudaGenerateTokensWithBudgetsMatchesTheCpu) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  auto cpu_model = testing::tiny_model(17);
  auto gpu_model = testing::tiny_model(17);
  gpu_model->to(at::Device("cuda:0"));
  RolloutConfig cfg = testing::test_config(/*response_length=*/20);
  cfg.do_sample = false;
  cfg.max_num_seqs = 8;
  TokenRequests r;
  for (int64_t i = 0; i < 12; ++i) {
    std::vector<int64_t> prompt;
    for (int64_t j = 0; j <= i % 7; ++j) prompt.push_back(3 + (i * 11 + j * 5) % (testing::kVocab - 3));
    r.prompts.push_back(prompt);
    r.max_tokens.push_back(1 + (i * 7) % 20);
    r.streams.push_back(100 - i);
  }
  r.eos_token_ids = {7};
  r.do_sample = false;
  r.seed = 5;
  auto want = testing::make_engine(cpu_model, cfg, 3)->generate_tokens(r);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  cfg.enforce_eager = false;
  auto engine = testing::make_engine(gpu_model, cfg, 3);
  auto got = engine->generate_tokens(r);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_GT(engine->last_stats().graph_replays, 0);
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "row " << i;
    EXPECT_LE(static_cast<int64_t>((*got)[i].tokens.size()), r.max_tokens[i]);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The rollout's fused layer ops (engine_kwargs.tessera.fused_layers, on by default) decode what
// the op chains decode (greedy, fp32), and the fused sampler reading a bf16 model's logits uncast
// draws what the torch sampler draws from their fp32 copy (the same uniforms; only the order of
// the fp32 sums differs, which moves a draw only where u falls within rounding of a boundary).
TEST(KVCacheEngine, OnCudaFusedLayersAndBf16SamplingMatchTheOpChains) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 16; ++i) lengths.push_back(1 + (i * 3) % kP);
  proto::DataProto prompts = testing::prompt_batch(lengths, kP, 16, nlohmann::json::array({7, 11, 13}));
  {
    auto model = testing::tiny_model(15);
    model->to(cuda);
    RolloutConfig cfg = testing::test_config(/*response_length=*/20);
    cfg.do_sample = false;
    cfg.calculate_log_probs = true;
    cfg.fused_layers = false;
    proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
    cfg.fused_layers = true;
    proto::DataProto got = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
    EXPECT_TRUE(get(got, "responses").to(at::kCPU).equal(get(want, "responses").to(at::kCPU)));
    EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-4);
  }
  {
    auto model = testing::tiny_model(16);
    model->to(cuda, at::kBFloat16);
    RolloutConfig cfg = testing::test_config(/*response_length=*/20);
    cfg.dtype = "bfloat16";
    cfg.do_sample = true;
    cfg.calculate_log_probs = true;
    cfg.sampler = "torch";
    proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
    cfg.sampler = "fused";
    proto::DataProto got = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
    const at::Tensor same_rows = get(got, "responses").eq(get(want, "responses")).all(1).cpu();
    std::printf("[bf16 fused sampler] %ld of %ld rows drew the torch sampler's tokens\n",
                same_rows.sum().item<int64_t>(), same_rows.size(0));
    EXPECT_GE(same_rows.sum().item<int64_t>(), same_rows.size(0) - 1);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// engine_kwargs.tessera.decode_attention=tiled decodes what the heads kernel decodes (greedy,
// fp32: the same tokens; the two kernels sum in different orders), with KV groups of 2 and of 8
// query heads; the default (kernel) is the heads kernel for the first, where a block of it serves
// a whole group, and the tiled kernel for the second, to the bit.
TEST(KVCacheEngine, OnCudaTiledDecodeAttentionMatchesTheHeadsKernel) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  for (int64_t heads : {4, 16}) {  // over 2 KV heads
    SCOPED_TRACE("query heads " + std::to_string(heads));
    models::ModelConfig config = testing::tiny_config();
    config.num_attention_heads = heads;
    auto created = models::CausalLM::create(config, models::ModelInit{at::kFloat, 19});
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    std::shared_ptr<models::CausalLM> model = *created;
    model->to(at::Device("cuda:0"));
    proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 20, 95);
    RolloutConfig cfg = testing::test_config(/*response_length=*/24);
    cfg.do_sample = false;
    cfg.calculate_log_probs = true;
    auto run = [&](const char* attention) {
      cfg.decode_attention = attention;
      proto::DataProto out = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
      return std::make_pair(get(out, "responses").to(at::kCPU), get(out, "rollout_log_probs").to(at::kCPU));
    };
    const auto want = run("heads");
    const auto got = run("tiled");
    EXPECT_TRUE(got.first.equal(want.first));
    EXPECT_LT((got.second - want.second).abs().max().item<double>(), 1e-4);
    const auto chosen = run("kernel");
    EXPECT_TRUE(chosen.second.equal(heads > 4 * config.num_key_value_heads ? got.second : want.second));
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Few rows with long contexts, which the decode-attention kernels cut into parts (Note [Split
// decode attention]), decode what they decode whole (engine_kwargs.tessera.split_decode_attention
// =false), with CUDA graphs (the parts chosen once per captured batch size) and without; both
// kernels (greedy, fp32).
TEST(KVCacheEngine, OnCudaSplitDecodeAttentionMatchesWholeRows) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  models::ModelConfig config = testing::tiny_config();
  config.max_position_embeddings = 1024;
  auto created = models::CausalLM::create(config, models::ModelInit{at::kFloat, 23});
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::shared_ptr<models::CausalLM> model = *created;
  model->to(at::Device("cuda:0"));
  const int64_t P = 300;
  proto::DataProto prompts = testing::prompt_batch({300, 250, 280}, P, 24, 95);
  for (const char* attention : {"heads", "tiled"}) {
    for (bool eager : {false, true}) {
      RolloutConfig cfg = testing::test_config(/*response_length=*/600);
      cfg.prompt_length = P;
      cfg.ignore_eos = true;  // every row runs its 600 tokens, well past the lengths the kernels cut
      cfg.max_num_batched_tokens = 1024;
      cfg.do_sample = false;
      cfg.calculate_log_probs = true;
      cfg.decode_attention = attention;
      cfg.enforce_eager = eager;
      cfg.split_decode_attention = false;
      proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
      cfg.split_decode_attention = true;
      proto::DataProto got = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
      EXPECT_TRUE(get(got, "responses").to(at::kCPU).equal(get(want, "responses").to(at::kCPU)))
          << attention << (eager ? " eager" : " graphs");
      EXPECT_LT((get(got, "rollout_log_probs") - get(want, "rollout_log_probs")).abs().max().item<double>(), 1e-4)
          << attention << (eager ? " eager" : " graphs");
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// decode_attention=heads names the heads kernel on a GPU; elsewhere it reads the cache as the
// default does (the CPU kernel), token for token and to the bit.
TEST(KVCacheEngine, HeadsDecodeAttentionOffCudaIsTheDefault) {
  auto model = testing::tiny_model(21);
  const proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 23, 95);
  RolloutConfig cfg = testing::test_config(/*response_length=*/12);
  cfg.do_sample = false;
  cfg.calculate_log_probs = true;
  proto::DataProto want = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
  cfg.decode_attention = "heads";
  ASSERT_TRUE(validate_rollout_config(cfg).ok());
  proto::DataProto got = testing::generate(*testing::make_engine(model, cfg, 3), prompts);
  EXPECT_TRUE(get(got, "responses").equal(get(want, "responses")));
  EXPECT_TRUE(get(got, "rollout_log_probs").equal(get(want, "rollout_log_probs")));
}

// decode_attention=tiled where the tiled kernel cannot run (here: the CPU) is one line naming the
// key, not a quiet fall back to another kernel.
TEST(KVCacheEngine, TiledDecodeAttentionOffCudaIsAnErrorNamingTheKey) {
  auto model = testing::tiny_model(21);
  RolloutConfig cfg = testing::test_config();
  cfg.decode_attention = "tiled";
  ASSERT_TRUE(validate_rollout_config(cfg).ok());
  auto engine = testing::make_engine(model, cfg);
  auto out = engine->generate_sequences(testing::prompt_batch(kLengths, kP, 22, 95));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("engine_kwargs.tessera.decode_attention=tiled"), std::string::npos)
      << out.status().to_string();
  cfg.decode_attention = "fast";
  const Status bad = validate_rollout_config(cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("expected kernel|heads|tiled|gather"), std::string::npos) << bad.to_string();
}

// engine_kwargs.tessera.fused_layers reaches every norm, attention and MLP of the engine's model;
// on the CPU, where the fused kernels never run, the tokens are the same either way.
TEST(KVCacheEngine, FusedLayersKeySetsEveryLayerSwitch) {
  auto model = testing::tiny_model(17);
  proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 18, 95);
  RolloutConfig cfg = testing::test_config();
  cfg.do_sample = false;
  std::vector<at::Tensor> responses;
  for (bool on : {false, true}) {
    cfg.fused_layers = on;
    auto engine = testing::make_engine(model, cfg);
    int64_t switches = 0;
    for (const auto& m : model->modules(/*include_self=*/true)) {
      std::optional<bool> flag;
      if (auto* norm = dynamic_cast<models::RMSNorm*>(m.get())) flag = norm->fused;
      if (auto* attn = dynamic_cast<models::Attention*>(m.get())) flag = attn->fused_rotary;
      if (auto* mlp = dynamic_cast<models::MLP*>(m.get())) flag = mlp->fused_swiglu;
      if (!flag) continue;
      EXPECT_EQ(*flag, on) << m->name();
      ++switches;
    }
    EXPECT_GT(switches, 3);
    responses.push_back(get(testing::generate(*engine, prompts), "responses"));
  }
  EXPECT_TRUE(responses[0].equal(responses[1]));
}

TEST(KVCacheEngine, DoSampleFalseAndValidationUseGreedy) {
  auto model = testing::tiny_model(7);
  proto::DataProto prompts = testing::prompt_batch(kLengths, kP, 9, 95);
  RolloutConfig cfg = testing::test_config();
  cfg.temperature = 1.5;  // training sampling: far from greedy
  auto engine = testing::make_engine(model, cfg, 5);
  proto::DataProto greedy_in = prompts;
  greedy_in.meta_info()["do_sample"] = false;
  at::Tensor greedy = get(testing::generate(*engine, greedy_in), "responses");
  proto::DataProto val_in = prompts;
  val_in.meta_info()["validate"] = true;  // val_kwargs: temperature 0 -> greedy
  EXPECT_TRUE(get(testing::generate(*engine, val_in), "responses").equal(greedy));
  EXPECT_FALSE(get(testing::generate(*engine, prompts), "responses").equal(greedy));
  cfg.val_kwargs.temperature = 1.0;  // sampled validation
  auto sampled_val = testing::make_engine(model, cfg, 5);
  EXPECT_FALSE(get(testing::generate(*sampled_val, val_in), "responses").equal(greedy));
}

// A device running out of memory mid-generation is one line naming the keys that shrink the
// engine's footprint, not a crash or a backtrace.
// A StepModel that forwards to the tiny model's own; tests override the part they fake.
struct ForwardingStep : StepModel {
  explicit ForwardingStep(std::shared_ptr<models::CausalLM> m) : inner(std::move(m)) {}
  const models::ModelConfig& cache_config() const override { return inner.cache_config(); }
  c10::ScalarType dtype() const override { return inner.dtype(); }
  c10::Device device() const override { return inner.device(); }
  at::Tensor forward_step(const at::Tensor& ids, const at::Tensor& pos, models::KVCache& cache,
                          const at::Tensor& mask) override {
    return inner.forward_step(ids, pos, cache, mask);
  }
  at::Tensor decode_step(const at::Tensor& ids, const at::Tensor& pos, PagedKV& kv, const PagedBatch& batch) override {
    return inner.decode_step(ids, pos, kv, batch);
  }
  at::Tensor logits(const at::Tensor& hidden) override { return inner.logits(hidden); }
  Status load_weights_by_reference(const models::TensorMap& t) override { return inner.load_weights_by_reference(t); }
  CausalLMStepModel inner;
};

TEST(KVCacheEngine, OutOfMemoryIsOneLineNamingTheKeys) {
  struct ExhaustedStep final : ForwardingStep {
    using ForwardingStep::ForwardingStep;
    at::Tensor decode_step(const at::Tensor&, const at::Tensor&, PagedKV&, const PagedBatch&) override {
      throw c10::OutOfMemoryError({"decode_step", "fake.cpp", 1},
                                  "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of "
                                  "79.19 GiB of which 0.25 GiB is free. If reserved but unallocated memory is large "
                                  "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    }
  };
  auto engine = KVCacheEngine::create(std::make_unique<ExhaustedStep>(testing::tiny_model(9)), testing::test_config());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->generate_sequences(testing::prompt_batch({4, 2}, 4, 1, 95));
  ASSERT_FALSE(out.ok());
  const std::string message = out.status().to_string();
  EXPECT_EQ(out.status().code(), ErrorCode::resource_exhausted);
  EXPECT_NE(message.find("Tried to allocate 3.00 GiB"), std::string::npos) << message;
  EXPECT_NE(message.find("max_num_seqs"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// Note [Unsampleable rows]: a policy whose logits turn NaN (here: every row's, from the third
// logits call on: the prefill's, then two decode steps) ends the call with one line naming the
// first row read, greedy or sampled, with the token reads lagged (the engine's default) and not.
TEST(KVCacheEngine, NanLogitsEndTheCallWithOneLineNamingTheRow) {
  struct DivergedStep final : ForwardingStep {
    using ForwardingStep::ForwardingStep;
    at::Tensor logits(const at::Tensor& hidden) override {
      at::Tensor out = inner.logits(hidden);
      return ++calls >= 3 ? out.fill_(std::numeric_limits<float>::quiet_NaN()) : out;
    }
    int calls = 0;
  };
  auto expect_named = [](const Status& st) {
    const std::string message = st.to_string();
    EXPECT_EQ(st.code(), ErrorCode::invalid_argument) << message;
    EXPECT_NE(message.find("the logits of batch row 0 at response token 2 are NaN or infinite"), std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };
  const std::vector<std::vector<int64_t>> prompts = {{3, 4, 5, 6}, {7, 8}, {9, 10, 11}};
  for (bool greedy : {true, false}) {
    for (bool lag : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "greedy=" << greedy << " lag=" << lag);
      DivergedStep step(testing::tiny_model(10));
      internal::LoopOptions o;
      o.slots = 3;
      o.prefill_token_budget = 64;
      o.response_length = 8;
      o.sampling.greedy = greedy;
      o.call_seed = 3;
      o.lag_token_reads = lag;
      GenerationStats stats;
      auto rows = internal::run_generation(step, prompts, o, stats);
      ASSERT_FALSE(rows.ok());
      expect_named(rows.status());
    }
  }
  RolloutConfig cfg = testing::test_config();
  cfg.ignore_eos = true;
  auto engine = KVCacheEngine::create(std::make_unique<DivergedStep>(testing::tiny_model(10)), cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto out = (*engine)->generate_sequences(testing::prompt_batch({4, 2, 3}, 4, 1, 95));
  ASSERT_FALSE(out.ok());
  expect_named(out.status());
}

TEST(KVCacheEngine, RejectsBadInputsAndConfigs) {
  auto model = testing::tiny_model(8);
  RolloutConfig cfg = testing::test_config();
  proto::DataProto prompts = testing::prompt_batch({4, 2}, 4, 1, 95);
  get(prompts, "input_ids")[1][3] = testing::kVocab;  // out of the vocabulary
  auto out = testing::make_engine(model, cfg)->generate_sequences(prompts);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("row 1"), std::string::npos) << out.status().to_string();

  RolloutConfig tp = cfg;
  tp.tensor_model_parallel_size = 2;
  auto e1 = KVCacheEngine::create(model, tp);
  ASSERT_FALSE(e1.ok());  // a whole-model engine cannot be one of 2 TP ranks
  EXPECT_NE(e1.status().message().find("tensor_model_parallel_size=2"), std::string::npos) << e1.status().to_string();
  RolloutConfig bf16 = cfg;
  bf16.dtype = "bfloat16";
  auto e2 = KVCacheEngine::create(model, bf16);
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("dtype"), std::string::npos);
  RolloutConfig long_cfg = cfg;
  long_cfg.response_length = 125;
  auto e3 = KVCacheEngine::create(model, long_cfg);
  ASSERT_FALSE(e3.ok());
  EXPECT_NE(e3.status().message().find("max_position_embeddings"), std::string::npos);
}

}  // namespace
}  // namespace tessera::rollout
