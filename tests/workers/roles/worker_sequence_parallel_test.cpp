// Ulysses sequence parallelism in the workers (Note [Ulysses sequence parallelism]): an actor, a
// reference and a critic whose ranks split each micro-batch's tokens train and score as the same
// roles without it. FSDP shards over every rank; each group of ulysses_sequence_parallel_size
// ranks shares its rows, so 2 ranks with groups of 2 are one data-parallel rank, and 4 ranks with
// groups of 2 are two. The reward model scores split rows as it scores them whole (and
// padding-free as padded). Misconfigurations are refused at init naming the key.
#include "tests/runtime/collective/collective_test_util.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/critic_worker.hpp"
#include "workers/roles/reward_model_worker.hpp"
#include "workers/models/model_io.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/sequence_parallel.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT

json sp_config(int64_t sp, bool dynamic = false) {
  json c = arr_config(/*mini=*/4, /*micro=*/2);
  c["model"]["use_remove_padding"] = true;
  c["actor"]["ulysses_sequence_parallel_size"] = sp;
  c["ref"]["ulysses_sequence_parallel_size"] = sp;
  if (dynamic) {  // 24 tokens a micro-batch: the budget is per rank, and a group packs sp times it (verl)
    c["model"]["enable_gradient_checkpointing"] = true;  // the all-to-alls run again in backward
    c["actor"]["use_dynamic_bsz"] = true;
    c["actor"]["ppo_max_token_len_per_gpu"] = 24 / sp;
    c["rollout"]["log_prob_use_dynamic_bsz"] = true;
    c["rollout"]["log_prob_max_token_len_per_gpu"] = 24 / sp;
  }
  return c;
}

proto::DataProto rollout_batch() {
  proto::DataProto b = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 21, kVocab);
  b.meta_info()["temperature"] = 1.0;
  return b;
}

// Old log-probs a little off the policy's, so that ratios clip: the same offsets for every split.
at::Tensor old_log_prob_offsets(const proto::DataProto& batch) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Tensor mask = batch.tensor("response_mask")->to(at::kFloat);
  return 0.15 * at::randn(mask.sizes(), gen) * mask;
}

struct ActorRun {
  at::Tensor log_probs;                          // compute_log_prob of the whole batch, rank order
  std::map<std::string, at::Tensor> state;       // after one update_actor
  double grad_norm = 0;
  at::Tensor after;                              // compute_log_prob after the update
};

// compute_log_prob, update_actor and compute_log_prob again on `world` ranks, each given its
// chunk of the batch (as DP_COMPUTE_PROTO dispatches it).
ActorRun run_actor(int world, const json& config) {
  const proto::DataProto batch = rollout_batch();
  auto chunks = batch.chunk(world);
  EXPECT_TRUE(chunks.ok());
  const at::Tensor offsets = old_log_prob_offsets(batch);
  std::vector<at::Tensor> lp(world), after(world);
  std::vector<std::map<std::string, at::Tensor>> states(world);
  std::vector<double> norms(world);
  const uint16_t port = next_port();
  run_ranks(world, [&](int r) {
    auto w = make_worker(context(r, world, port), "actor", config);
    auto out = w->compute_log_prob((*chunks)[r]);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    lp[r] = *out->tensor("old_log_probs");
    proto::DataProto chunk = (*chunks)[r];
    const int64_t rows = chunk.size();
    ASSERT_TRUE(chunk.set_tensor("old_log_probs", lp[r] + offsets.narrow(0, r * rows, rows)).ok());
    auto updated = w->update_actor(chunk);
    ASSERT_TRUE(updated.ok()) << updated.status().to_string();
    norms[r] = updated->meta_info().at("metrics").at("actor/grad_norm").get<std::vector<double>>().at(0);
    auto s = w->actor_module()->engine().full_state_dict(at::kFloat);
    ASSERT_TRUE(s.ok());
    states[r] = *s;
    auto again = w->compute_log_prob((*chunks)[r]);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    after[r] = *again->tensor("old_log_probs");
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(norms[r], norms[0]) << "rank " << r;
  return ActorRun{at::cat(lp), states[0], norms[0], at::cat(after)};
}

void expect_same_training(const ActorRun& got, const ActorRun& want, const at::Tensor& mask) {
  EXPECT_LT(max_diff(got.log_probs.masked_select(mask), want.log_probs.masked_select(mask)), 1e-5);
  EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-5 * std::max(1.0, want.grad_norm));
  // AdamW's first step is lr x g / |g| per element: where a gradient is near zero, float rounding of
  // the split sums moves that ratio; 1e-4 is 1% of the step (lr 1e-2) and far below any wrong row.
  for (const auto& [name, t] : want.state) EXPECT_LE(max_diff(got.state.at(name), t), 1e-4) << name;
  EXPECT_LT(max_diff(got.after.masked_select(mask), want.after.masked_select(mask)), 1e-5);
  EXPECT_GT(max_diff(want.after.masked_select(mask), want.log_probs.masked_select(mask)), 1e-3);  // it trained
}

TEST(UlyssesWorkers, ActorWithGroupsOfTwoTrainsAsOneRankWithout) {
  const at::Tensor mask = rollout_batch().tensor("response_mask")->to(at::kBool);
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic micro-batches" : "fixed micro-batches");
    const ActorRun want = run_actor(1, sp_config(1, dynamic));
    SCOPED_TRACE("2 ranks, one group of 2");
    expect_same_training(run_actor(2, sp_config(2, dynamic)), want, mask);
  }
}

// LoRA adapters (per token, like every projection) split the same way: the adapters train as
// on one rank.
TEST(UlyssesWorkers, LoraActorWithGroupsOfTwoTrainsAsOneRankWithout) {
  const at::Tensor mask = rollout_batch().tensor("response_mask")->to(at::kBool);
  auto lora = [](int64_t sp) {
    json c = sp_config(sp);
    c["model"]["lora_rank"] = 4;
    c["model"]["lora_alpha"] = 8;
    return c;
  };
  const ActorRun want = run_actor(1, lora(1));
  expect_same_training(run_actor(2, lora(2)), want, mask);
}

// 4 ranks in two groups of 2 are two data-parallel ranks; groups of 4 repeat the 2 KV heads.
TEST(UlyssesWorkers, TwoGroupsTrainAsTwoDataParallelRanks) {
  const at::Tensor mask = rollout_batch().tensor("response_mask")->to(at::kBool);
  const ActorRun want = run_actor(2, sp_config(1));
  SCOPED_TRACE("4 ranks, groups of 2");
  expect_same_training(run_actor(4, sp_config(2)), want, mask);
  const ActorRun one = run_actor(1, sp_config(1));
  SCOPED_TRACE("4 ranks, one group of 4");
  expect_same_training(run_actor(4, sp_config(4)), one, mask);
}

// The reference runs in the actor's groups, or, at 1, scores its own rows whole.
TEST(UlyssesWorkers, ReferenceLogProbsEqualTheUnsplitReference) {
  const proto::DataProto batch = rollout_batch();
  const at::Tensor mask = batch.tensor("response_mask")->to(at::kBool);
  auto one = make_worker(context(0, 1, next_port()), "ref", sp_config(1));
  auto want = one->compute_ref_log_prob(batch);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  const at::Tensor expect = want->tensor("ref_log_prob")->masked_select(mask);
  for (int64_t ref_sp : {2, 1}) {
    SCOPED_TRACE("ref.ulysses_sequence_parallel_size " + std::to_string(ref_sp));
    json c = sp_config(2);
    c["ref"]["ulysses_sequence_parallel_size"] = ref_sp;
    auto chunks = batch.chunk(2);
    ASSERT_TRUE(chunks.ok());
    std::vector<at::Tensor> got(2);
    const uint16_t port = next_port();
    run_ranks(2, [&](int r) {
      auto w = make_worker(context(r, 2, port), "actor_rollout_ref", c);
      auto out = w->compute_ref_log_prob((*chunks)[r]);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      got[r] = *out->tensor("ref_log_prob");
    });
    EXPECT_LT(max_diff(at::cat(got).masked_select(mask), expect), 1e-5);
  }
}

json critic_sp_config(int64_t sp) {
  return {{"model", {{"path", tiny_model_dir()}, {"use_remove_padding", true}, {"fsdp_config", fp32_fsdp()}}},
          {"optim", {{"lr", 1e-2}}},
          {"ppo_mini_batch_size", 4},
          {"ppo_micro_batch_size_per_gpu", 2},
          {"forward_micro_batch_size_per_gpu", 2},
          {"cliprange_value", 0.5},
          {"grad_clip", 1.0},
          {"ulysses_sequence_parallel_size", sp}};
}

// Values, then one update, then values again: 2 ranks in one group of 2 == 1 rank.
std::pair<at::Tensor, at::Tensor> run_critic(int world, int64_t sp) {
  proto::DataProto batch = rollout_batch();
  auto chunks = batch.chunk(world);
  EXPECT_TRUE(chunks.ok());
  std::vector<at::Tensor> before(world), after(world);
  const uint16_t port = next_port();
  run_ranks(world, [&](int r) {
    auto w = CriticWorker::create(context(r, world, port),
                                  json{{"config", critic_sp_config(sp)}, {"seed", 1}, {"comm_backend", "inproc"}});
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE((*w)->init_model().ok());
    proto::DataProto mine = (*chunks)[r];
    auto values = (*w)->compute_values(mine);
    ASSERT_TRUE(values.ok()) << values.status().to_string();
    before[r] = *values->tensor("values");
    const at::Tensor m = mine.tensor("response_mask")->to(at::kFloat);
    ASSERT_TRUE(mine.set_tensor("values", before[r]).ok());
    ASSERT_TRUE(mine.set_tensor("returns", (before[r] + 0.3) * m).ok());
    auto updated = (*w)->update_critic(mine);
    ASSERT_TRUE(updated.ok()) << updated.status().to_string();
    auto again = (*w)->compute_values((*chunks)[r]);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    after[r] = *again->tensor("values");
  });
  return {at::cat(before), at::cat(after)};
}

TEST(UlyssesWorkers, CriticWithGroupsOfTwoTrainsAsOneRankWithout) {
  auto [want_before, want_after] = run_critic(1, 1);
  auto [got_before, got_after] = run_critic(2, 2);
  EXPECT_LT(max_diff(got_before, want_before), 1e-5);
  EXPECT_LT(max_diff(got_after, want_after), 1e-5);
  EXPECT_GT(max_diff(want_after, want_before), 1e-3);  // it trained
  // Two groups of 2 are two data-parallel ranks.
  auto [dp_before, dp_after] = run_critic(2, 1);
  auto [groups_before, groups_after] = run_critic(4, 2);
  EXPECT_LT(max_diff(groups_before, dp_before), 1e-5);
  EXPECT_LT(max_diff(groups_after, dp_after), 1e-5);
}

// The reward model scores with its value head at each row's last token: padding-free on one rank
// and split over a group of 2 (each rank its own rows back), the padded single rank's scores.
TEST(UlyssesWorkers, RewardModelScoresEqualThePaddedScores) {
  const proto::DataProto batch = make_rollout({2, 5, 3, 5}, {4, 1, 3, 2}, 5, 4, 11, kVocab);
  auto scores = [&](int world, bool packed, int64_t sp, bool dynamic) {
    json c = {{"model", {{"path", tiny_model_dir()}, {"input_tokenizer", nullptr}, {"fsdp_config", fp32_fsdp()},
                         {"use_remove_padding", packed}}},
              {"micro_batch_size_per_gpu", 2},
              {"use_dynamic_bsz", dynamic},
              {"forward_max_token_len_per_gpu", 20 / sp},
              {"ulysses_sequence_parallel_size", sp}};
    auto chunks = batch.chunk(world);
    EXPECT_TRUE(chunks.ok());
    std::vector<at::Tensor> out(world);
    const uint16_t port = next_port();
    run_ranks(world, [&](int r) {
      auto w = RewardModelWorker::create(context(r, world, port), json{{"config", c}, {"comm_backend", "inproc"}});
      ASSERT_TRUE(w.ok());
      Status st = (*w)->init_model();
      ASSERT_TRUE(st.ok()) << st.to_string();
      auto scored = (*w)->compute_rm_score((*chunks)[r]);
      ASSERT_TRUE(scored.ok()) << scored.status().to_string();
      out[r] = *scored->tensor("rm_scores");
    });
    return at::cat(out);
  };
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic micro-batches" : "fixed micro-batches");
    const at::Tensor want = scores(1, false, 1, dynamic);
    EXPECT_GT(want.abs().max().item<double>(), 0.0);
    EXPECT_LT(max_diff(scores(1, true, 1, dynamic), want), 1e-5);
    EXPECT_LT(max_diff(scores(2, true, 2, dynamic), want), 1e-5);
  }
}

// On a GPU the packed bf16 forward is one varlen flash-attention call (Note [Packed sequences]):
// split over a group of 2 (two threads, in-process exchanges of device tensors), with the padding
// segment among its offsets, it gives the unsplit log-probs and, averaged over the group (each
// rank's is its slice's times the group size, Note [Ulysses sequence parallelism]), its
// gradients, to bf16 precision. The gradients need a GPU per rank: autograd runs every CUDA node
// of a device on one thread of its own, so two ranks sharing a GPU in one process cannot run their
// backward exchanges together (the first rank's all-to-all would wait, on that thread, for the
// second's, queued behind it); a worker has a GPU of its own, as here with two. On one GPU the
// ranks share it for the forward only. Skipped without a GPU.
TEST(OnDevice, UlyssesSplitFlashForwardEqualsTheUnsplitOneInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const bool gpu_per_rank = torch::cuda::device_count() >= 2;
  if (!gpu_per_rank) std::printf("[one GPU: the split forward only; the gradients need two]\n");
  const proto::DataProto batch = make_rollout({3, 5, 2, 4, 5}, {4, 2, 6, 3, 6}, 5, 6, 23, kVocab);  // 45 tokens
  struct Pass {
    at::Tensor log_probs;
    std::vector<at::Tensor> grads;
  };
  auto pass = [&](std::shared_ptr<const ppo::UlyssesGroup> group, const c10::Device& cuda, bool backward) {
    models::LoadOptions o;
    o.dtype = at::kBFloat16;
    o.device = cuda;
    auto model = models::load_causal_lm(tiny_model_dir(), o);
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    auto module = ppo::LocalTrainableModule::create(*model, ppo::LocalOptimizerOptions{});
    EXPECT_TRUE(module.ok());
    proto::DataProto d = batch;
    EXPECT_TRUE(d.to(cuda).ok());
    auto seq = ppo::read_sequence_batch(d);
    EXPECT_TRUE(seq.ok());
    auto head = ppo::response_head(**module, *seq, ppo::ForwardMode::train, true, at::Tensor(), group);
    EXPECT_TRUE(head.ok()) << head.status().to_string();
    auto lp = ppo::response_log_probs(*head, seq->responses, 1.0, false);
    EXPECT_TRUE(lp.ok()) << lp.status().to_string();
    const at::Tensor mask = d.tensor("response_mask")->to(at::kFloat);
    Pass p{(lp->log_probs.detach() * mask).cpu(), {}};
    if (backward) {
      (lp->log_probs * mask).sum().backward();
      for (const auto& param : (*model)->parameters()) p.grads.push_back(param.grad().to(at::kFloat).cpu());
    }
    return p;
  };
  const Pass want = pass(nullptr, c10::Device(c10::kCUDA, 0), gpu_per_rank);
  std::vector<Pass> got(2);
  const uint16_t port = next_port();
  run_ranks(2, [&](int r) {
    auto comm = collective::make_communicator(
        collective::testing::world_options("inproc", r, 2, 0, "ulysses-cuda-" + std::to_string(port)));
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    auto group = ppo::UlyssesGroup::create(*comm);
    ASSERT_TRUE(group.ok());
    got[r] = pass(*group, c10::Device(c10::kCUDA, gpu_per_rank ? r : 0), gpu_per_rank);
  });
  for (int r = 0; r < 2; ++r) EXPECT_LT(max_diff(got[r].log_probs, want.log_probs), 2e-2) << "rank " << r;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const double scale = std::max(1e-3, want.grads[i].abs().max().item<double>());
    EXPECT_LT(max_diff((got[0].grads[i] + got[1].grads[i]) / 2, want.grads[i]), 5e-2 * scale) << "parameter " << i;
  }
}

TEST(UlyssesWorkers, MisconfigurationsAreRefusedAtInitNamingTheKey) {
  auto init_error = [](int world, const json& config, const std::string& role = "actor") {
    std::vector<std::string> messages(world);
    const uint16_t port = next_port();
    run_ranks(world, [&](int r) {
      auto w = ActorRolloutRefWorker::create(context(r, world, port), json{{"role", role}, {"config", config},
                                                                           {"comm_backend", "inproc"}});
      ASSERT_TRUE(w.ok());
      Status st = (*w)->init_model();
      messages[r] = st.ok() ? "" : st.message();
    });
    return messages[0];
  };
  // 4 query heads cannot be cut 3 ways.
  json c = sp_config(3);
  c["actor"]["ppo_mini_batch_size"] = 6;
  std::string m = init_error(3, c);
  EXPECT_NE(m.find("actor_rollout_ref.actor.ulysses_sequence_parallel_size = 3 must divide the model's "
                   "num_attention_heads = 4"), std::string::npos) << m;
  // A group size that does not divide the ranks.
  m = init_error(2, sp_config(4));
  EXPECT_NE(m.find("actor_rollout_ref.actor.ulysses_sequence_parallel_size = 4 does not divide"), std::string::npos) << m;
  // Padded micro-batches cannot be split.
  c = sp_config(2);
  c["model"]["use_remove_padding"] = false;
  m = init_error(2, c);
  EXPECT_NE(m.find("actor_rollout_ref.actor.ulysses_sequence_parallel_size = 2 > 1 requires "
                   "actor_rollout_ref.model.use_remove_padding = true"), std::string::npos) << m;
  // The reference runs in the actor's groups or alone.
  c = sp_config(2);
  c["ref"]["ulysses_sequence_parallel_size"] = 4;
  m = init_error(4, c, "actor_rollout_ref");
  EXPECT_NE(m.find("actor_rollout_ref.ref.ulysses_sequence_parallel_size = 4 must be 1 or"), std::string::npos) << m;
  // A split-placement rollout group runs no sequence-parallel pass: the actor's groups of 4 do not
  // have to divide its 2 ranks.
  c = sp_config(4);
  c["rollout"]["engine_kwargs"] = {{"tessera", {{"placement", "split"}}}};
  auto rollout = parse_actor_rollout_ref_config(json{{"role", "rollout"}, {"config", c}}, 2);
  ASSERT_TRUE(rollout.ok()) << rollout.status().to_string();
  EXPECT_EQ(rollout->ulysses_sequence_parallel_size, 1);
  // The critic names its own keys.
  json critic = critic_sp_config(2);
  critic["model"]["use_remove_padding"] = false;
  std::vector<std::string> critic_errors(2);
  const uint16_t port = next_port();
  run_ranks(2, [&](int r) {
    auto w = CriticWorker::create(context(r, 2, port), json{{"config", critic}, {"comm_backend", "inproc"}});
    ASSERT_TRUE(w.ok());
    critic_errors[r] = (*w)->init_model().message();
  });
  EXPECT_NE(critic_errors[0].find("critic.ulysses_sequence_parallel_size = 2 > 1 requires "
                                  "critic.model.use_remove_padding = true"), std::string::npos) << critic_errors[0];
  // The reward model's groups split padding-free micro-batches only.
  auto rm = RewardModelWorker::create(context(0, 2, next_port()),
                                      json{{"config", {{"model", {{"path", tiny_model_dir()}}},
                                                       {"micro_batch_size_per_gpu", 2},
                                                       {"ulysses_sequence_parallel_size", 2}}},
                                           {"comm_backend", "inproc"}});
  ASSERT_TRUE(rm.ok());
  Status st = (*rm)->init_model();
  EXPECT_NE(st.message().find("reward_model.ulysses_sequence_parallel_size = 2 > 1 requires "
                              "reward_model.model.use_remove_padding = true"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera::workers
