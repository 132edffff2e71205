// Note [Ulysses sequence parallelism]: ranks that each run the model on a slice of a packed
// micro-batch's tokens (attention trading heads for tokens around itself) give the unsplit
// forward's log-probs, entropies and values, and gradients whose sum over the group (what FSDP's
// average over the ranks turns into the data-parallel mean) is the unsplit gradient; for plain
// causal attention, grouped KV heads fewer than the group (repeated), sliding windows and
// softcapped scores; with rows whose tokens do not divide by the group (padding) and ranks whose
// slice holds no response token. DataParallelPPOActor and DataParallelPPOCritic gather the
// group's rows and return each rank its own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "runtime/collective/communicator.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"
#include "tests/workers/ppo/ppo_test_util.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/dp_critic.hpp"
#include "workers/ppo/sequence_parallel.hpp"

namespace tessera::ppo {
namespace {

using namespace testing;  // NOLINT: the PPO test helpers (ppo_test_util.hpp)
using collective::testing::run_ranks;

// Rank r of an in-process Ulysses group of `size`, rendezvous `key`.
std::shared_ptr<UlyssesGroup> ulysses(int rank, int size, const std::string& key) {
  auto comm = unwrap(collective::make_communicator(collective::testing::world_options("inproc", rank, size, 0, key)));
  return unwrap(UlyssesGroup::create(std::move(comm)));
}

std::string next_key() { return collective::testing::fresh_key("ulysses"); }

std::shared_ptr<models::CausalLM> policy(const models::ModelConfig& c, uint64_t seed) {
  models::ModelInit init;
  init.seed = seed;
  auto m = unwrap(models::CausalLM::create(c, init));
  sharpen(*m, 10.0);
  return m;
}

std::shared_ptr<LocalTrainableModule> local(std::shared_ptr<models::PretrainedModel> model) {
  return unwrap(LocalTrainableModule::create(std::move(model), LocalOptimizerOptions{}));
}

struct Pass {
  at::Tensor log_probs, entropy;       // [B, R]
  std::vector<at::Tensor> grads;       // every parameter's
};

// One training forward and backward of `model` over `data` (packed; split over `group` when set):
// the response log-probs and entropies, and the gradients of a fixed weighted sum of both.
Pass forward_backward(const std::shared_ptr<models::CausalLM>& model, const proto::DataProto& data,
                      std::shared_ptr<const UlyssesGroup> group) {
  auto module = local(model);
  const SequenceBatch seq = unwrap(read_sequence_batch(data));
  const ResponseHead head = unwrap(response_head(*module, seq, ForwardMode::train, true, at::Tensor(), group));
  const LogProbOutput out = unwrap(response_log_probs(head, seq.responses, 0.9, /*calculate_entropy=*/true));
  at::Generator gen = at::detail::createCPUGenerator(17);
  const at::Tensor mask = data.tensor("response_mask")->to(at::kFloat);
  const at::Tensor w1 = at::randn(out.log_probs.sizes(), gen) * mask, w2 = at::randn(out.log_probs.sizes(), gen) * mask;
  model->zero_grad();
  ((out.log_probs * w1).sum() + (out.entropys * w2).sum()).backward();
  Pass p{out.log_probs.detach() * mask, out.entropys.detach() * mask, {}};
  for (const auto& param : model->parameters()) p.grads.push_back(param.grad().clone());
  return p;
}

// The standard batch: 56 real tokens, which groups of 3 or 4 cut with padding (none for 2).
void expect_split_equals_unsplit(const models::ModelConfig& config, int size,
                                 const proto::DataProto& data = make_batch(kPromptLens, kResponseLens, kP, kR, 31)) {
  const Pass want = forward_backward(policy(config, 5), data, nullptr);
  std::vector<Pass> got(size);
  const std::string key = next_key();
  run_ranks(size, [&](int r) { got[r] = forward_backward(policy(config, 5), data, ulysses(r, size, key)); });
  for (int r = 0; r < size; ++r) {
    EXPECT_LT(max_rel_diff(got[r].log_probs, want.log_probs), 1e-5) << "rank " << r;
    EXPECT_LT(max_rel_diff(got[r].entropy, want.entropy), 1e-5) << "rank " << r;
  }
  // verl's Gather scales a rank's gradient by the group size; FSDP then averages over ranks.
  for (size_t i = 0; i < want.grads.size(); ++i) {
    at::Tensor sum = at::zeros_like(want.grads[i]);
    for (int r = 0; r < size; ++r) sum += got[r].grads[i];
    const double scale = std::max(1.0, want.grads[i].abs().max().item<double>());
    EXPECT_LT(max_diff(sum / size, want.grads[i]), 2e-5 * scale) << "parameter " << i;
    EXPECT_GT(want.grads[i].abs().max().item<double>(), 0.0) << "parameter " << i;
  }
}

TEST(Ulysses, SplitForwardAndBackwardEqualTheUnsplitOnes) {
  SCOPED_TRACE("qwen2, 4 query heads over 2 KV heads, groups of 2");
  expect_split_equals_unsplit(tiny_config(), 2);
  SCOPED_TRACE("qwen2, 4 KV heads, groups of 2: two KV heads a rank");
  expect_split_equals_unsplit(models::testing::tiny_config("qwen2", 4, false, kVocab), 2);
}

TEST(Ulysses, KeyValueHeadsFewerThanTheGroupAreRepeated) {
  SCOPED_TRACE("qwen2, 2 KV heads, groups of 4: each KV head serves two ranks");
  expect_split_equals_unsplit(tiny_config(), 4);
  SCOPED_TRACE("llama, 1 KV head (multi-query), groups of 2");
  expect_split_equals_unsplit(models::testing::tiny_config("llama", 1, false, kVocab), 2);
}

TEST(Ulysses, SlidingWindowsAndSoftcappedScores) {
  SCOPED_TRACE("gemma2: alternating windows of 3, score and logit softcaps");
  expect_split_equals_unsplit(models::testing::tiny_config("gemma2", 2, false, kVocab), 2);
  expect_split_equals_unsplit(models::testing::tiny_config("gemma3_text", 2, false, kVocab), 2);
  SCOPED_TRACE("mistral: a window of 3 on every layer");
  expect_split_equals_unsplit(models::testing::tiny_config("mistral", 4, false, kVocab), 4);
}

// Dynamic NTK RoPE scales by the longest position of the forward: every rank scales by the whole
// row's (PackedSegments::max_position), not by its slice's. Positions here run past the 6 the
// config says it was trained on, so the scale grows, and differs between slices.
TEST(Ulysses, DynamicRopeScalesByTheWholeRowsLongestPosition) {
  models::ModelConfig dynamic = tiny_config();
  dynamic.rope_scaling.rope_type = "dynamic";
  dynamic.rope_scaling.factor = 2.0;
  dynamic.max_position_embeddings = 6;
  expect_split_equals_unsplit(dynamic, 2);
  expect_split_equals_unsplit(dynamic, 4);
}

TEST(Ulysses, RanksWhoseSliceHoldsNoResponseTokenAndAPaddedRow) {
  // One row of 6 prompt tokens and 1 response token: 7 tokens padded to 8, slices of 2; only the
  // third rank's slice holds the position that predicts the response token.
  expect_split_equals_unsplit(tiny_config(), 4, make_batch({6}, {1}, kP, kR, 43));
  expect_split_equals_unsplit(tiny_config(), 2, make_batch({5, 1}, {2, 5}, kP, kR, 47));
  // 5 tokens in groups of 4: slices of 2, the last rank's wholly padding.
  expect_split_equals_unsplit(tiny_config(), 4, make_batch({2}, {3}, kP, kR, 53));
}

ActorConfig packed_actor(int64_t sp, bool dynamic) {
  ActorConfig c;
  c.ppo_mini_batch_size = 8;
  c.ppo_micro_batch_size_per_gpu = 8;
  c.use_remove_padding = true;
  c.use_dynamic_bsz = dynamic;
  c.ulysses_sequence_parallel_size = sp;
  return c;
}

// The actor gathers the group's rows, scores them split, and returns each rank its own rows.
TEST(Ulysses, ActorLogProbsOfEachRanksRowsEqualTheUnsplitActor) {
  const auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 37);
  const at::Tensor mask = data.tensor("response_mask")->to(at::kBool);
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic micro-batches" : "fixed micro-batches");
    auto meta = forward_meta(1.0, 2, dynamic, 12);  // the budget is per rank: x2 for the group
    auto one = unwrap(DataParallelPPOActor::create(packed_actor(1, dynamic), local(tiny_policy(9))));
    proto::DataProto whole = data;
    whole.meta_info() = meta;
    const LogProbOutput want = unwrap(one->compute_log_prob(whole, true));
    auto chunks = unwrap(data.chunk(2));
    std::vector<LogProbOutput> got(2);
    const std::string key = next_key();
    run_ranks(2, [&](int r) {
      auto actor = unwrap(DataParallelPPOActor::create(packed_actor(2, dynamic), local(tiny_policy(9)), {},
                                                       ulysses(r, 2, key)));
      proto::DataProto mine = chunks[r];
      mine.meta_info() = meta;
      got[r] = unwrap(actor->compute_log_prob(mine, true));
    });
    const at::Tensor lp = at::cat({got[0].log_probs, got[1].log_probs}), ent = at::cat({got[0].entropys, got[1].entropys});
    ASSERT_EQ(lp.sizes(), want.log_probs.sizes());
    EXPECT_LT(max_rel_diff(lp.masked_select(mask), want.log_probs.masked_select(mask)), kBatchingTolerance);
    EXPECT_LT(max_rel_diff(ent.masked_select(mask), want.entropys.masked_select(mask)), kBatchingTolerance);
  }
}

TEST(Ulysses, CriticValuesOfEachRanksRowsEqualTheUnsplitCritic) {
  const auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 41);
  CriticConfig c;
  c.ppo_mini_batch_size = 8;
  c.ppo_micro_batch_size_per_gpu = 4;
  c.forward_micro_batch_size_per_gpu = 4;
  c.use_remove_padding = true;
  auto one = unwrap(DataParallelPPOCritic::create(c, local(tiny_critic(3))));
  const at::Tensor want = unwrap(one->compute_values(data));
  c.ulysses_sequence_parallel_size = 2;
  auto chunks = unwrap(data.chunk(2));
  std::vector<at::Tensor> got(2);
  const std::string key = next_key();
  run_ranks(2, [&](int r) {
    auto critic = unwrap(DataParallelPPOCritic::create(c, local(tiny_critic(3)), {}, ulysses(r, 2, key)));
    got[r] = unwrap(critic->compute_values(chunks[r]));
  });
  EXPECT_LT(max_rel_diff(at::cat({got[0], got[1]}), want), kBatchingTolerance);
  EXPECT_GT(want.abs().max().item<double>(), 0.1);
}

TEST(Ulysses, MisconfigurationsAreOneLineErrorsNamingTheKey) {
  Status st = models::check_sequence_parallel(tiny_config(), 3, "actor.ulysses_sequence_parallel_size");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("actor.ulysses_sequence_parallel_size = 3 must divide the model's "
                              "num_attention_heads = 4"), std::string::npos) << st.message();
  st = models::check_sequence_parallel(models::testing::tiny_config("qwen2", 4, false, kVocab), 8, "k");
  ASSERT_FALSE(st.ok());
  // 2 KV heads and groups of 4: repeated, allowed; 4 query heads cannot be cut 8 ways.
  EXPECT_TRUE(models::check_sequence_parallel(tiny_config(), 4, "k").ok());


  auto no_group = DataParallelPPOActor::create(packed_actor(2, false), local(tiny_policy(1)));
  ASSERT_FALSE(no_group.ok());
  EXPECT_NE(no_group.status().message().find("actor.ulysses_sequence_parallel_size = 2"), std::string::npos)
      << no_group.status().message();

  const std::string key = next_key();
  std::vector<Status> padded(2), rows(2), widths(2);
  run_ranks(2, [&](int r) {
    auto group = ulysses(r, 2, key);
    ActorConfig c = packed_actor(2, false);
    c.use_remove_padding = false;
    padded[r] = DataParallelPPOActor::create(c, local(tiny_policy(1)), {}, group).status();
    // Ranks of a group must get equal chunks: 3 rows here, 2 there.
    auto data = make_batch(r == 0 ? std::vector<int64_t>{2, 3, 4} : std::vector<int64_t>{2, 3},
                           r == 0 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{1, 2}, kP, kR, 3);
    rows[r] = group->gather_rows(data).status();
    // Equal rows and tensor counts, another width on one rank.
    auto wide = make_batch({2, 3}, {1, 2}, r == 0 ? kP : kP + 1, kR, 3);
    widths[r] = group->gather_rows(wide).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(padded[r].message().find("requires use_remove_padding"), std::string::npos) << padded[r].message();
    ASSERT_FALSE(rows[r].ok());
    EXPECT_NE(rows[r].message().find("must receive equal chunks"), std::string::npos) << rows[r].message();
    ASSERT_FALSE(widths[r].ok());
    EXPECT_NE(widths[r].message().find("holds another tensor than this rank's 'input_ids'"), std::string::npos)
        << widths[r].message();
  }
}

}  // namespace
}  // namespace tessera::ppo
