// Note [Prefix cache]: within a rollout session a call prefills only what its prompts do not
// share with the sequences of earlier calls, and gives the tokens (greedy and sampled) and
// log-probs that prefilling everything gives, also when a KV cap makes it evict remembered blocks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/rollout/rollout_test_util.hpp"

namespace tessera::rollout {
namespace {

// Two turns of three conversations: the second turn's prompts are the first turn's sequences and
// two more tokens (a tool's answer); `repeat` adds a copy of the first conversation (GRPO's n).
struct Turns {
  std::vector<std::vector<GeneratedRow>> out;
  std::vector<GenerationStats> stats;
};

Turns two_turns(KVCacheEngine& engine, bool session, bool repeat, bool sample) {
  Turns t;
  TokenRequests first;
  first.prompts = {{5, 6, 7, 8, 9}, {10, 11, 12}, {13, 14, 15, 16, 17, 18, 19}};
  if (repeat) first.prompts.push_back(first.prompts[0]);
  for (size_t i = 0; i < first.prompts.size(); ++i) {
    first.max_tokens.push_back(6);
    first.streams.push_back(static_cast<int64_t>(i));
  }
  first.eos_token_ids = {2};
  first.do_sample = sample;
  first.seed = 5;
  EngineSession scope(engine, session);
  auto a = engine.generate_tokens(first);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  if (!a.ok()) return t;
  t.out.push_back(*a);
  t.stats.push_back(engine.last_stats());
  TokenRequests second = first;
  second.seed = 6;
  for (size_t i = 0; i < first.prompts.size(); ++i) {
    second.prompts[i].insert(second.prompts[i].end(), (*a)[i].tokens.begin(), (*a)[i].tokens.end());
    second.prompts[i].insert(second.prompts[i].end(), {20, 21});
    second.max_tokens[i] = 4;
    second.streams[i] += 10;
  }
  auto b = engine.generate_tokens(second);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return t;
  t.out.push_back(*b);
  t.stats.push_back(engine.last_stats());
  return t;
}

void expect_same(const Turns& got, const Turns& want) {
  ASSERT_EQ(got.out.size(), want.out.size());
  for (size_t turn = 0; turn < got.out.size(); ++turn) {
    ASSERT_EQ(got.out[turn].size(), want.out[turn].size());
    for (size_t r = 0; r < got.out[turn].size(); ++r) {
      EXPECT_EQ(got.out[turn][r].tokens, want.out[turn][r].tokens) << "turn " << turn << " row " << r;
      ASSERT_EQ(got.out[turn][r].logprobs.size(), want.out[turn][r].logprobs.size());
      for (size_t j = 0; j < got.out[turn][r].logprobs.size(); ++j) {
        EXPECT_NEAR(got.out[turn][r].logprobs[j], want.out[turn][r].logprobs[j], 1e-5) << turn << " " << r << " " << j;
      }
    }
  }
}

TEST(PrefixCache, SessionPrefillsOnlyWhatIsNewAndChangesNoToken) {
  auto model = testing::tiny_model(21);
  for (bool sample : {false, true}) {
    for (bool repeat : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "sample=" << sample << " repeat=" << repeat);
      RolloutConfig cfg = testing::test_config(/*response_length=*/12);
      cfg.do_sample = sample;
      cfg.ignore_eos = true;
      cfg.calculate_log_probs = true;
      cfg.kv_block_size = 2;
      cfg.max_model_len = 24;
      const Turns want = two_turns(*testing::make_engine(model, cfg, 3), /*session=*/false, repeat, sample);
      auto engine = testing::make_engine(model, cfg, 3);
      const Turns got = two_turns(*engine, /*session=*/true, repeat, sample);
      expect_same(got, want);
      ASSERT_EQ(got.stats.size(), 2U);
      EXPECT_EQ(want.stats[1].cached_prompt_tokens, 0);
      EXPECT_EQ(got.stats[0].cached_prompt_tokens, 0);
      // Turn 1 stored 10, 8 and 12 tokens of each conversation (the last sampled token is never
      // fed); a sequence is remembered when it ends, up to the tokens read by then (Note [Lagged
      // token reads]: all but the last two), so 4 + 3 + 5 whole blocks of 2 are reused. A repeated
      // conversation is prefilled with its twin when greedy, from its own blocks when sampled.
      EXPECT_EQ(got.stats[1].cached_prompt_tokens, repeat && sample ? 32 : 24);
      EXPECT_GT(got.stats[1].cached_prefill_flops, 0.0);
      EXPECT_LT(got.stats[1].prefill_tokens, want.stats[1].prefill_tokens);
      EXPECT_LT(got.stats[1].prefill_flops, want.stats[1].prefill_flops);
    }
  }
  // The session ends with the scope: a later call has nothing remembered.
  RolloutConfig cfg = testing::test_config(12);
  cfg.kv_block_size = 2;
  auto engine = testing::make_engine(model, cfg, 3);
  (void)two_turns(*engine, true, false, true);
  TokenRequests again;
  again.prompts = {{5, 6, 7, 8, 9}};
  again.eos_token_ids = {2};
  ASSERT_TRUE(engine->generate_tokens(again).ok());
  EXPECT_EQ(engine->last_stats().cached_prompt_tokens, 0);
}

// Under a KV cap the remembered blocks are evicted (least recently used first) when live
// sequences need blocks; what is left is still reused and the tokens do not change.
TEST(PrefixCache, EvictionUnderAKvCapChangesNoToken) {
  auto model = testing::tiny_model(22);
  for (bool sample : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "sample=" << sample);
    RolloutConfig cfg = testing::test_config(/*response_length=*/12);
    cfg.do_sample = sample;
    cfg.ignore_eos = true;
    cfg.calculate_log_probs = true;
    cfg.kv_block_size = 2;
    cfg.max_model_len = 24;
    const Turns want = two_turns(*testing::make_engine(model, cfg, 4), false, true, sample);
    cfg.max_kv_blocks = 12;  // one sequence at its longest (24 tokens) takes 12
    auto capped = testing::make_engine(model, cfg, 4);
    const Turns got = two_turns(*capped, true, true, sample);
    expect_same(got, want);
    ASSERT_EQ(got.stats.size(), 2U);
    EXPECT_EQ(got.stats[1].kv_blocks, 12 + 1);
    EXPECT_GT(got.stats[1].cached_prompt_tokens, 0);
    EXPECT_LT(got.stats[1].cached_prompt_tokens, sample ? 32 : 24);  // some were evicted
  }
}

}  // namespace
}  // namespace tessera::rollout
