// Note [Prefix cache]: within a rollout session a call prefills only what its prompts do not
// share with the sequences of earlier calls, and gives the tokens (greedy and sampled) and
// log-probs that prefilling everything gives, also when a KV cap makes it evict remembered blocks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/rollout/rollout_test_util.hpp"
#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include "workers/rollout/internal/block_cache.hpp"

namespace tessera::rollout {
namespace {

// Two turns of three conversations: the second turn's prompts are the first turn's sequences and
// two more tokens (a tool's answer); `repeat` adds a copy of the first conversation (GRPO's n).
struct Turns {
  std::vector<std::vector<GeneratedRow>> out;
  std::vector<GenerationStats> stats;
};

// Two turns: the second turn's prompts are the first turn's sequences and two more tokens (a
// tool's answer).
Turns run_turns(KVCacheEngine& engine, bool session, std::vector<std::vector<int64_t>> prompts,
                std::vector<int64_t> first_budgets, bool sample, std::vector<int64_t> eos = {2}) {
  Turns t;
  TokenRequests first;
  first.prompts = std::move(prompts);
  first.max_tokens = std::move(first_budgets);
  for (size_t i = 0; i < first.prompts.size(); ++i) first.streams.push_back(static_cast<int64_t>(i));
  first.eos_token_ids = std::move(eos);
  first.do_sample = sample;
  first.seed = 5;
  EngineSession scope(engine, session, static_cast<int64_t>(first.prompts.size()));
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

// Three conversations; `repeat` adds a copy of the first (GRPO's n).
Turns two_turns(KVCacheEngine& engine, bool session, bool repeat, bool sample) {
  std::vector<std::vector<int64_t>> prompts = {{5, 6, 7, 8, 9}, {10, 11, 12}, {13, 14, 15, 16, 17, 18, 19}};
  if (repeat) prompts.push_back(prompts[0]);
  return run_turns(engine, session, prompts, std::vector<int64_t>(prompts.size(), 6), sample);
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

// Conversations that share their first block, one of them sampled twice with different budgets
// and EOS ends allowed: sequences are remembered under equal blocks of others, and the cap makes
// the cache evict blocks whose descendants live sequences still hold.
TEST(PrefixCache, SharedFirstBlocksSamplesAndEosUnderACap) {
  auto model = testing::tiny_model(23);
  const std::vector<std::vector<int64_t>> prompts = {
      {5, 6, 7, 8, 9, 10}, {5, 6, 30, 31, 32}, {5, 6, 30, 31, 32}, {5, 6, 40}, {5, 6, 30, 31, 32}};
  const std::vector<int64_t> budgets = {6, 3, 6, 5, 2};
  for (bool sample : {false, true}) {
    for (int64_t cap : {int64_t{0}, int64_t{12}, int64_t{14}}) {
      SCOPED_TRACE(::testing::Message() << "sample=" << sample << " cap=" << cap);
      RolloutConfig cfg = testing::test_config(/*response_length=*/12);
      cfg.calculate_log_probs = true;
      cfg.kv_block_size = 2;
      cfg.max_model_len = 24;
      const std::vector<int64_t> eos = {2, 17, 23, 41, 57};
      const Turns want = run_turns(*testing::make_engine(model, cfg, 5), false, prompts, budgets, sample, eos);
      cfg.max_kv_blocks = cap;
      auto engine = testing::make_engine(model, cfg, 5);
      const Turns got = run_turns(*engine, true, prompts, budgets, sample, eos);
      expect_same(got, want);
      ASSERT_EQ(got.stats.size(), 2U);
      EXPECT_GT(got.stats[1].cached_prompt_tokens, 0);
    }
  }
}

// On a GPU: a session's calls replay the CUDA graphs its first call captured (the pool and the
// weights stay put), give the tokens of eager decoding without a session (fp32), and the memory
// is back when the session ends.
TEST(PrefixCache, OnCudaSessionGraphsServeEveryCallAndEqualEager) {
#if TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  auto allocated = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current; };
  auto model = testing::tiny_model(24);
  model->to(at::Device("cuda:0"));
  for (bool sample : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "sample=" << sample);
    RolloutConfig cfg = testing::test_config(/*response_length=*/12);
    cfg.ignore_eos = true;
    cfg.calculate_log_probs = true;
    cfg.kv_block_size = 2;
    cfg.max_model_len = 24;
    const Turns want = two_turns(*testing::make_engine(model, cfg, 3), false, true, sample);
    cfg.enforce_eager = false;
    (void)two_turns(*testing::make_engine(model, cfg, 3), true, true, sample);  // first use: library workspaces
    auto engine = testing::make_engine(model, cfg, 3);
    const int64_t before = allocated();
    const Turns got = two_turns(*engine, true, true, sample);
    expect_same(got, want);
    ASSERT_EQ(got.stats.size(), 2U);
    EXPECT_GT(got.stats[0].graphs_captured, 0);
    EXPECT_EQ(got.stats[1].graphs_captured, 0);  // the first call's graphs
    EXPECT_GT(got.stats[1].graph_replays, 0);
    EXPECT_GT(got.stats[1].cached_prompt_tokens, 0);
    EXPECT_EQ(allocated(), before);  // the session's pool and graphs are gone with it
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The trie's bookkeeping: remembered blocks are found by their tokens, count as free while only
// the trie holds them, and are evicted leaves first; a block no sequence holds whose child one
// does (remembered under an equal block of another sequence) leaves with its subtree, the held
// child staying with its sequence.
TEST(PrefixCache, RememberedBlocksAreFoundCountedAndEvicted) {
  const models::ModelConfig config = testing::tiny_config();
  constexpr int64_t bs = 2;
  auto cache = internal::BlockCache::create(config, at::kFloat, /*slots=*/3, /*max_length=*/4, bs, at::kCPU);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  ASSERT_EQ(cache->free_blocks(), 6);
  auto prefill = models::KVCache::create(config, {2, 4, at::kFloat, at::kCPU});
  ASSERT_TRUE(prefill.ok());
  // Slot 0: A = [1 2 | 3 4]; slots 1 and 2: two samples of B = [1 2 | 5 6], sharing B's blocks.
  cache->admit(*prefill, {4, 4}, {0, 1, 2}, {0, 1, 1});
  const std::vector<int64_t> a = {1, 2, 3, 4}, b = {1, 2, 5, 6};
  const int64_t a1 = cache->blocks(0)[0], a2 = cache->blocks(0)[1], b1 = cache->blocks(1)[0], b2 = cache->blocks(1)[1];
  EXPECT_EQ(cache->free_blocks(), 2);
  cache->remember(0, a);
  cache->release(0);
  EXPECT_EQ(cache->remembered_blocks(), 2);
  EXPECT_EQ(cache->free_blocks(), 4);  // a1 and a2: only the trie holds them
  // B's first block equals a1: B's second block is remembered under a1; b1 is not remembered.
  cache->remember(1, b);
  cache->release(1);
  EXPECT_EQ(cache->remembered_blocks(), 3);
  EXPECT_EQ(cache->references(b2), 2);  // slot 2 and the trie
  EXPECT_EQ(cache->references(b1), 1);  // slot 2
  // A prompt starting with A takes a1 and a2, one reference each for the caller.
  EXPECT_EQ(cache->take_prefix({1, 2, 3, 4, 9}, 2), (std::vector<int64_t>{a1, a2}));
  EXPECT_EQ(cache->take_prefix({1, 2, 5, 6}, 1), (std::vector<int64_t>{a1}));  // at most max_blocks
  EXPECT_EQ(cache->free_blocks(), 2);
  for (int64_t block : {a1, a2, a1}) cache->unref(block);
  EXPECT_EQ(cache->free_blocks(), 4);
  // Two more sequences of two blocks each take the two free blocks, then a2 (the only leaf only
  // the trie holds), then a1 with its subtree: b2 leaves the trie but stays slot 2's.
  cache->admit(*prefill, {4, 4}, {0, 1}, {0, 1});
  EXPECT_EQ(cache->remembered_blocks(), 0);
  EXPECT_EQ(cache->references(b2), 1);
  EXPECT_EQ(cache->free_blocks(), 0);
  for (int64_t slot : {0, 1, 2}) cache->release(slot);
  EXPECT_EQ(cache->free_blocks(), 6);
}

}  // namespace
}  // namespace tessera::rollout
