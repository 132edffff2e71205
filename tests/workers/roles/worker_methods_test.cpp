// Worker method tables against the seed (fsdp_workers.rst / verl-fsdp.md §3.2), init-config
// refusals (role, batch-size normalisation naming keys and values), and the reward model's
// token-level score at the last valid token for left- and right-padded rows, checked against an
// independent forward of the same value model.
#include <map>

#include "dispatch/worker_group.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/critic_worker.hpp"
#include "workers/models/model_io.hpp"
#include "workers/roles/registry.hpp"
#include "workers/roles/reward_model_worker.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT
using Table = std::map<std::string, std::string>;

Table table_of(const dispatch::WorkerBase& w) {
  Table t;
  for (const auto& s : w.methods().specs()) {
    EXPECT_EQ(s.execute_mode, dispatch::ExecuteMode::all) << s.name;
    EXPECT_TRUE(s.blocking) << s.name;
    t[s.name] = s.dispatch_mode;
  }
  return t;
}

// The seed, transcribed: every @register(dispatch_mode=...) of the FSDP workers.
const Table kActorRolloutRef = {
    {"init_model", "ONE_TO_ALL"},          {"generate_sequences", "DP_COMPUTE_PROTO"},
    {"compute_log_prob", "DP_COMPUTE_PROTO"}, {"compute_ref_log_prob", "DP_COMPUTE_PROTO"},
    {"update_actor", "DP_COMPUTE_PROTO"},  {"save_checkpoint", "ONE_TO_ALL"},
    {"load_checkpoint", "ONE_TO_ALL"},
    // Tessera's split placement (workers/rollout/split_weights.hpp), beyond the seed.
    {"rollout_weight_buckets", "ONE_TO_ALL"}, {"export_rollout_weights", "ONE_TO_ALL"},
    {"load_rollout_weights", "ONE_TO_ALL"},
};
const Table kCritic = {
    {"init_model", "ONE_TO_ALL"},        {"compute_values", "DP_COMPUTE_PROTO"}, {"update_critic", "DP_COMPUTE_PROTO"},
    {"save_checkpoint", "ONE_TO_ALL"},   {"load_checkpoint", "ONE_TO_ALL"},
};
const Table kRewardModel = {{"init_model", "ONE_TO_ALL"}, {"compute_rm_score", "DP_COMPUTE_PROTO"}};

TEST(WorkerMethods, TablesMatchTheSeed) {
  auto ctx = context(0, 1, next_port());
  for (const auto& role : actor_rollout_ref_roles()) {
    auto w = ActorRolloutRefWorker::create(ctx, json{{"role", role}, {"config", arr_config()}, {"seed", 0}});
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(table_of(**w), kActorRolloutRef) << role;
  }
  auto c = CriticWorker::create(ctx, json{{"config", json::object()}, {"seed", 0}});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(table_of(**c), kCritic);
  auto r = RewardModelWorker::create(ctx, json{{"config", json::object()}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(table_of(**r), kRewardModel);
}

TEST(WorkerMethods, RegistryHasTheThreeTypes) {
  runtime::WorkerTypeRegistry reg;
  ASSERT_TRUE(register_worker_types(reg).ok());
  EXPECT_EQ(reg.names(), (std::vector<std::string>{"actor_rollout_ref", "critic", "reward_model"}));
  EXPECT_EQ(register_worker_types(reg).code(), ErrorCode::already_exists);
}

TEST(WorkerMethods, BadRoleIsRefusedNamingIt) {
  auto w = ActorRolloutRefWorker::create(context(0, 1, next_port()), json{{"role", "critic"}, {"config", arr_config()}});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("\"critic\""), std::string::npos) << w.status().message();
}

TEST(WorkerMethods, BatchSizesAreNormalisedPerRank) {
  json cfg = arr_config(/*mini=*/4, /*micro=*/1);
  cfg["rollout"]["n"] = 2;
  cfg["rollout"].erase("log_prob_micro_batch_size_per_gpu");
  cfg["rollout"]["log_prob_micro_batch_size"] = 8;
  auto c = parse_actor_rollout_ref_config(json{{"role", "actor_rollout"}, {"config", cfg}}, /*dp=*/2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->actor.ppo_mini_batch_size, 4 * 2 / 2);
  EXPECT_EQ(c->rollout.log_prob_micro_batch_size_per_gpu, 4);
}

TEST(WorkerMethods, BadBatchSizesAreRefusedNamingKeysAndValues) {
  json cfg = arr_config(/*mini=*/3, /*micro=*/1);
  auto c = parse_actor_rollout_ref_config(json{{"role", "actor"}, {"config", cfg}}, /*dp=*/2);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("ppo_mini_batch_size"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("3"), std::string::npos) << c.status().message();

  json no_micro = arr_config();
  no_micro["ref"].erase("log_prob_micro_batch_size_per_gpu");
  auto r = parse_actor_rollout_ref_config(json{{"role", "ref"}, {"config", no_micro}}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"), std::string::npos)
      << r.status().message();

  json bad_key = arr_config();
  bad_key["actor"]["ppo_epoch"] = 2;  // verl's key is ppo_epochs
  auto k = parse_actor_rollout_ref_config(json{{"role", "actor"}, {"config", bad_key}}, 1);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("actor_rollout_ref.actor.ppo_epoch"), std::string::npos) << k.status().message();
}

TEST(WorkerMethods, InitModelRefusesAnIndivisibleMiniBatchAtInit) {
  auto w = ActorRolloutRefWorker::create(context(0, 1, next_port()),
                                         json{{"role", "actor"}, {"config", arr_config(/*mini=*/4, /*micro=*/3)}});
  ASSERT_TRUE(w.ok());
  Status st = (*w)->init_model();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ppo_micro_batch_size_per_gpu"), std::string::npos) << st.message();
  auto gen = (*w)->generate_sequences(make_prompts({3}, 8, 1, 40));
  EXPECT_NE(gen.status().message().find("init_model"), std::string::npos);
}

TEST(WorkerMethods, ExpandToTokenLevelPutsTheScoreAtTheLastValidToken) {
  // Row 0: left-padded prompt, response of 2 valid tokens; row 1: everything right-padded.
  at::Tensor mask = at::tensor({0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0}, at::kLong).view({2, 6});
  at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
  at::Tensor out = expand_to_token_level(at::tensor({2.5f, -1.0f}), mask, pos, 3);
  EXPECT_TRUE(at::equal(out, at::tensor({0.0f, 2.5f, 0.0f, 0.0f, 0.0f, 0.0f}).view({2, 3})));
}

json rm_config(bool dynamic) {
  json c = {{"model", {{"path", tiny_model_dir()}, {"input_tokenizer", nullptr}, {"fsdp_config", fp32_fsdp()}}},
            {"micro_batch_size_per_gpu", 2},
            {"use_dynamic_bsz", dynamic},
            {"forward_max_token_len_per_gpu", 20}};
  return c;
}

// Independent reference: the value model's output at the last valid position of each row.
std::vector<float> reference_scores(const proto::DataProto& d) {
  models::LoadOptions o;
  o.dtype = at::kFloat;
  auto m = models::load_value_model(tiny_model_dir(), o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  torch::NoGradGuard g;
  (*m)->eval();
  at::Tensor ids = *d.tensor("input_ids"), mask = *d.tensor("attention_mask"), pos = *d.tensor("position_ids");
  std::vector<float> out;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    at::Tensor v = (*m)->forward(ids.narrow(0, i, 1), mask.narrow(0, i, 1), pos.narrow(0, i, 1));
    int64_t last = -1;
    for (int64_t t = 0; t < mask.size(1); ++t) {
      if (mask[i][t].item<int64_t>() == 1) last = t;
    }
    out.push_back(v[0][last].item<float>());
  }
  return out;
}

void check_rm(const proto::DataProto& batch, bool dynamic) {
  auto w = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", rm_config(dynamic)}});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->init_model().ok());
  auto out = (*w)->compute_rm_score(batch);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  at::Tensor rm = *out->tensor("rm_scores");
  EXPECT_TRUE(out->meta_info().at("metrics").contains("timing_s/compute_rm_score"));
  const int64_t R = batch.tensor("responses")->size(1);
  ASSERT_EQ(rm.sizes(), (at::IntArrayRef{batch.size(), R}));
  std::vector<float> want = reference_scores(batch);
  at::Tensor rmask = batch.tensor("attention_mask")->narrow(1, -R, R);
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int64_t last = rmask[i].sum().item<int64_t>() - 1;  // responses are right-padded
    for (int64_t t = 0; t < R; ++t) {
      if (t == last) {
        EXPECT_NEAR(rm[i][t].item<float>(), want[i], 1e-5) << "row " << i;
      } else {
        EXPECT_EQ(rm[i][t].item<float>(), 0.0f) << "row " << i << " col " << t;
      }
    }
  }
  EXPECT_TRUE((*w)->module()->engine().params_offloaded());  // forced offload between calls
}

TEST(RewardModelWorker, ScoreAtLastValidTokenLeftPaddedPrompts) {
  check_rm(make_rollout({2, 5, 3, 5}, {4, 1, 3, 2}, 5, 4, 11, 40), /*dynamic=*/false);
}

TEST(RewardModelWorker, ScoreAtLastValidTokenDynamicBatching) {
  check_rm(make_rollout({2, 5, 3, 5, 1}, {4, 1, 3, 2, 4}, 5, 4, 12, 40), /*dynamic=*/true);
}

TEST(RewardModelWorker, ScoreAtLastValidTokenRightPadded) {
  // A right-padded sequence (verl's RM with a switched chat template): tokens first, pads after.
  proto::DataProto d = make_rollout({5, 5, 5}, {4, 4, 4}, 5, 4, 13, 40);
  at::Tensor mask = at::tensor({1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
                               at::kLong)
                        .view({3, 9});
  ASSERT_TRUE(d.set_tensor("attention_mask", mask).ok());
  ASSERT_TRUE(d.set_tensor("position_ids", (mask.cumsum(1) - 1).clamp_min(0)).ok());
  auto w = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", rm_config(false)}});
  ASSERT_TRUE(w.ok() && (*w)->init_model().ok());
  auto out = (*w)->compute_rm_score(d);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> want = reference_scores(d);
  at::Tensor rm = *out->tensor("rm_scores");  // response columns 5..8 of the 9
  // Row 0's last valid token is column 5 (response col 0); row 1's is 8 (col 3); row 2's is 4:
  // inside the prompt, so nothing lands in the response slice.
  EXPECT_NEAR(rm[0][0].item<float>(), want[0], 1e-5);
  EXPECT_NEAR(rm[1][3].item<float>(), want[1], 1e-5);
  EXPECT_EQ(rm[2].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ((rm != 0).sum().item<int64_t>(), 2);
}

TEST(RewardModelWorker, DifferentInputTokenizerIsRefused) {
  json c = rm_config(false);
  c["model"]["input_tokenizer"] = "/some/other/tokenizer";
  auto w = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", c}});
  ASSERT_TRUE(w.ok());
  Status st = (*w)->init_model();
  EXPECT_EQ(st.code(), ErrorCode::unimplemented);
  EXPECT_NE(st.message().find("input_tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace tessera::workers
