// Worker method tables against the seed (fsdp_workers.rst / verl-fsdp.md §3.2), init-config
// refusals (role, batch-size normalisation naming keys and values), and the reward model's
// token-level score at the last valid token for left- and right-padded rows, checked against an
// independent forward of the same value model.
#include <map>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dispatch/worker_group.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"
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

// A rollout batch of `chats` whose responses are the ids `responses_ids` right-padded to R (two
// prompt tokens each); raw_prompt holds each row's chat.
proto::DataProto chat_rollout(const std::vector<json>& chats, const std::vector<std::vector<int32_t>>& response_ids,
                              int64_t P, int64_t R) {
  const int64_t B = static_cast<int64_t>(chats.size());
  at::Tensor prompts = at::zeros({B, P}, at::kLong), responses = at::zeros({B, R}, at::kLong);
  at::Tensor mask = at::zeros({B, P + R}, at::kLong);
  std::vector<json> raw;
  for (int64_t i = 0; i < B; ++i) {
    mask[i].narrow(0, P - 2, 2).fill_(1);  // two prompt tokens: only their mask matters here
    const std::vector<int32_t>& r = response_ids[static_cast<size_t>(i)];
    for (size_t t = 0; t < r.size() && static_cast<int64_t>(t) < R; ++t) {
      responses[i][static_cast<int64_t>(t)] = r[t];
      mask[i][P + static_cast<int64_t>(t)] = 1;
    }
    raw.push_back(chats[static_cast<size_t>(i)]);
  }
  proto::TensorDict t;
  t.insert_or_assign("input_ids", at::cat({prompts, responses}, 1));
  t.insert_or_assign("attention_mask", mask);
  t.insert_or_assign("position_ids", (mask.cumsum(1) - 1).clamp_min(0));
  t.insert_or_assign("responses", responses);
  proto::NonTensorBatch cols;
  cols.insert_or_assign("raw_prompt", proto::Column::jsons(std::move(raw)));
  auto d = proto::DataProto::from_dict(std::move(t), std::move(cols));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

// verl's _switch_chat_template against transformers itself on Qwen3's tokenizer and template:
// the chat plus the decoded response (its eos text removed) rendered without a generation prompt
// and encoded without special tokens, right-padded with the pad id.
TEST(RewardModelWorker, SwitchChatTemplateMatchesTransformers) {
  const char* env = std::getenv("TESSERA_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  if (std::system((python + " -c 'import transformers' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import transformers (deploy/dev.sh installs it)";
  }
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  const std::filesystem::path dir = std::filesystem::path(shared != nullptr ? shared : "../shared") / "golden" / "qwen3-tokenizer";
  auto tok = tokenizer::Tokenizer::from_dir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto chat = tokenizer::ChatTemplate::from_name("auto", tok->config());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  const std::vector<json> chats = {
      json::array({{{"role", "user"}, {"content", "What is 17 * 3? Think step by step."}}}),
      json::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name a prime."}}})};
  // Row 0 ends with the eos; row 1 holds <|endoftext|> (special: kept by HF's default decode) and
  // an eos in the middle (removed, as verl's str.replace removes every one).
  auto ids_of = [&](const std::string& text) { return *tok->encode(text); };
  const int32_t eos = *tok->eos_token_id(), endoftext = *tok->token_to_id("<|endoftext|>");
  std::vector<int32_t> row0 = ids_of("17 * 3 = 51, so the answer is 51."), row1 = ids_of("7");
  row0.push_back(eos);
  row1.push_back(endoftext);
  row1.push_back(eos);
  for (int32_t id : ids_of(" done")) row1.push_back(id);
  const std::vector<std::vector<int32_t>> responses = {row0, row1};
  proto::DataProto d = chat_rollout(chats, responses, 3, 24);
  ChatTemplateSwitch sw{*tok, *tok, *chat, /*max_length=*/64, "right"};
  auto rm = switch_chat_template(d, sw);
  ASSERT_TRUE(rm.ok()) << rm.status().to_string();
  char tmpl[] = "/tmp/tessera_rm_switch_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  json in = json::array();
  for (size_t i = 0; i < chats.size(); ++i) in.push_back({{"chat", chats[i]}, {"response_ids", responses[i]}});
  std::ofstream(root + "/in.json") << in.dump();
  std::ofstream(root + "/switch.py") << R"PY(
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for case in json.load(open(sys.argv[2])):
    response = tok.decode(case["response_ids"]).replace(tok.eos_token, "")  # verl's _switch_chat_template
    chat = case["chat"] + [{"role": "assistant", "content": response}]
    text = tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    out.append(tok(text, add_special_tokens=False)["input_ids"])
json.dump(out, open(sys.argv[3], "w"))
)PY";
  const std::string cmd = python + " " + root + "/switch.py " + dir.string() + " " + root + "/in.json " + root + "/out.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out_file(root + "/out.json");
  const json want = json::parse(out_file);
  at::Tensor ids = *rm->tensor("input_ids"), mask = *rm->tensor("attention_mask"), pos = *rm->tensor("position_ids");
  const int64_t width = 64;
  ASSERT_EQ(ids.size(1), width);
  for (int64_t i = 0; i < 2; ++i) {
    const auto& w = want[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(w.size());
    ASSERT_LE(n, width) << "row " << i;
    for (int64_t t = 0; t < width; ++t) {
      EXPECT_EQ(ids[i][t].item<int64_t>(), t < n ? w[static_cast<size_t>(t)].get<int64_t>() : *tok->pad_token_id())
          << "row " << i << " token " << t;
      EXPECT_EQ(mask[i][t].item<int64_t>(), t < n ? 1 : 0);
    }
    EXPECT_EQ(pos[i][n - 1].item<int64_t>(), n - 1);
  }
  // Truncation to reward_model.max_length as verl's postprocess_data cuts (right by default).
  sw.max_length = 5;
  for (const std::string side : {"right", "left", "middle"}) {
    sw.truncation = side;
    auto cut = switch_chat_template(d, sw);
    ASSERT_TRUE(cut.ok()) << side;
    const auto& w = want[0];
    const size_t n = w.size();
    const std::vector<size_t> from = side == "right"  ? std::vector<size_t>{0, 1, 2, 3, 4}
                                     : side == "left" ? std::vector<size_t>{n - 5, n - 4, n - 3, n - 2, n - 1}
                                                      : std::vector<size_t>{0, 1, n - 3, n - 2, n - 1};
    for (int64_t t = 0; t < 5; ++t) {
      EXPECT_EQ((*cut->tensor("input_ids"))[0][t].item<int64_t>(), w[from[static_cast<size_t>(t)]].get<int64_t>())
          << side << " token " << t;
    }
  }
  sw.truncation = "error";
  auto refused = switch_chat_template(d, sw);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("reward_model.max_length = 5"), std::string::npos) << refused.status().message();
  // max_length null: the input's width (27), cut from the right.
  sw.max_length = std::nullopt;
  sw.truncation = "right";
  auto input_width = switch_chat_template(d, sw);
  ASSERT_TRUE(input_width.ok());
  EXPECT_EQ(input_width->tensor("input_ids")->size(1), d.tensor("attention_mask")->size(1));
  // Without the chat messages: one line naming the key and the way out.
  proto::DataProto bare = d;
  ASSERT_TRUE(bare.pop(std::vector<std::string>{}, std::vector<std::string>{"raw_prompt"}).ok());
  auto missing = switch_chat_template(bare, ChatTemplateSwitch{*tok, *tok, *chat, std::nullopt, "right"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("input_tokenizer=null"), std::string::npos) << missing.status().message();
  std::filesystem::remove_all(root);
}

// The worker with input_tokenizer set (verl's default) scores the re-templated chat: the value at
// its last token, placed at the policy sequence's last valid token.
TEST(RewardModelWorker, InputTokenizerScoresTheReTemplatedChat) {
  // The policy's tokenizer (Qwen3's) differs from the reward model's (the tiny model's ChatML one):
  // responses are decoded by the first, its eos text removed, and encoded by the second.
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  const std::filesystem::path qwen3 = std::filesystem::path(shared != nullptr ? shared : "../shared") / "golden" / "qwen3-tokenizer";
  auto policy = tokenizer::Tokenizer::from_dir(qwen3);
  ASSERT_TRUE(policy.ok()) << policy.status().to_string();
  auto tok = tokenizer::Tokenizer::from_dir(tiny_model_dir());
  ASSERT_TRUE(tok.ok());
  const std::vector<json> chats = {json::array({{{"role", "user"}, {"content", "1+1="}}}),
                                   json::array({{{"role", "user"}, {"content", "abc"}}}),
                                   json::array({{{"role", "user"}, {"content", "2+2="}}})};
  const std::vector<std::string> responses = {"2", "d e f", "4"};
  std::vector<std::vector<int32_t>> ids;
  for (const auto& r : responses) {
    ids.push_back(*policy->encode(r));
    ids.back().push_back(*policy->eos_token_id());
  }
  proto::DataProto d = chat_rollout(chats, ids, 3, 8);
  for (bool dynamic : {false, true}) {  // one row per micro-batch, or token-budget micro-batches reordered
    json c = rm_config(dynamic);
    c["model"]["input_tokenizer"] = qwen3.string();
    c["max_length"] = 40;
    c["micro_batch_size_per_gpu"] = 1;
    c["forward_max_token_len_per_gpu"] = 80;
    auto w = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", c}});
    ASSERT_TRUE(w.ok());
    Status st = (*w)->init_model();
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto out = (*w)->compute_rm_score(d);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    // Independently: Tessera's native ChatML renderer (the tiny tokenizer's Jinja template is ChatML).
    const tokenizer::ChatTemplate chatml = tokenizer::ChatTemplate::chatml();
    proto::TensorDict t;
    const int64_t width = 40;
    at::Tensor rm_ids = at::zeros({3, width}, at::kLong), mask = at::zeros({3, width}, at::kLong);
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<tokenizer::ChatMessage> msgs = {{"user", chats[static_cast<size_t>(i)][0]["content"]},
                                                  {"assistant", responses[static_cast<size_t>(i)]}};
      auto text = chatml.render(msgs, false);
      ASSERT_TRUE(text.ok());
      auto enc = tok->encode(*text);
      ASSERT_TRUE(enc.ok());
      ASSERT_LE(static_cast<int64_t>(enc->size()), width);
      for (size_t j = 0; j < enc->size(); ++j) {
        rm_ids[i][static_cast<int64_t>(j)] = (*enc)[j];
        mask[i][static_cast<int64_t>(j)] = 1;
      }
    }
    t.insert_or_assign("input_ids", rm_ids);
    t.insert_or_assign("attention_mask", mask);
    t.insert_or_assign("position_ids", (mask.cumsum(1) - 1).clamp_min(0));
    std::vector<float> want = reference_scores(*proto::DataProto::from_dict(std::move(t)));
    at::Tensor rm = *out->tensor("rm_scores");
    at::Tensor rmask = d.tensor("attention_mask")->narrow(1, 3, 8);
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t last = rmask[i].sum().item<int64_t>() - 1;
      EXPECT_NEAR(rm[i][last].item<float>(), want[static_cast<size_t>(i)], 1e-5) << "row " << i << (dynamic ? " (dynamic)" : "");
      EXPECT_EQ((rm[i] != 0).sum().item<int64_t>(), 1);
    }
  }
  json c = rm_config(false);
  c["model"]["input_tokenizer"] = qwen3.string();
  // A raw_prompt column of another type: an error naming the key, not a crash.
  proto::DataProto strings = d;
  ASSERT_TRUE(strings.set_column("raw_prompt", proto::Column::strings({"a", "b", "c"})).ok());
  auto w = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", c}});
  ASSERT_TRUE(w.ok() && (*w)->init_model().ok());
  auto wrong = (*w)->compute_rm_score(strings);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("reward_model.model.input_tokenizer"), std::string::npos)
      << wrong.status().message();
  // input_tokenizer must be a directory or null.
  c["model"]["input_tokenizer"] = true;
  auto flag = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", c}});
  ASSERT_TRUE(flag.ok());
  EXPECT_NE((*flag)->init_model().message().find("reward_model.model.input_tokenizer = true"), std::string::npos);
  c["model"]["input_tokenizer"] = qwen3.string();
  // A truncation other than verl's four is refused at init.
  c["truncation"] = "both";
  auto bad = RewardModelWorker::create(context(0, 1, next_port()), json{{"config", c}});
  ASSERT_TRUE(bad.ok());
  Status refused = (*bad)->init_model();
  EXPECT_NE(refused.message().find("reward_model.truncation = 'both'"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace tessera::workers
