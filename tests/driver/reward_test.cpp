// Scorers (verl's gsm8k cases, exact_match, numeric, the demo task) and NaiveRewardManager.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "driver/reward.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

double score(const std::string& ds, const std::string& response, const json& gt) {
  auto fn = ScorerRegistry::with_builtins().find(ds);
  EXPECT_TRUE(fn.ok()) << fn.status().to_string();
  json extra;
  auto r = (*fn)(ScoreInput{ds, response, gt, extra});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->score : -1;
}

TEST(Gsm8k, StrictFollowsVerl) {
  EXPECT_EQ(gsm8k_compute_score("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"), 1.0);
  EXPECT_EQ(gsm8k_compute_score("#### 1,234", "1234"), 1.0);        // commas removed
  EXPECT_EQ(gsm8k_compute_score("#### 3 then #### 4", "4"), 1.0);   // the last match
  EXPECT_EQ(gsm8k_compute_score("#### -5", "-5"), 1.0);
  EXPECT_EQ(gsm8k_compute_score("#### 71", "72"), 0.0);             // format_score
  EXPECT_EQ(gsm8k_compute_score("#### 71", "72", Gsm8kMethod::strict, 0.1), 0.1);
  EXPECT_EQ(gsm8k_compute_score("The answer is 72", "72"), 0.0);    // no "#### "
  EXPECT_EQ(gsm8k_compute_score("####72", "72"), 0.0);              // the space is required
  EXPECT_EQ(gsm8k_compute_score("#### $72", "72"), 0.0);            // '$' is not a number char
  // Only the last 300 characters are searched.
  EXPECT_EQ(gsm8k_compute_score("#### 72" + std::string(300, ' '), "72"), 0.0);
  EXPECT_EQ(gsm8k_compute_score("#### 72" + std::string(293, ' '), "72"), 1.0);
  EXPECT_EQ(*gsm8k_extract_solution("#### 1.5", Gsm8kMethod::strict), "1.5");
  EXPECT_FALSE(gsm8k_extract_solution("nothing", Gsm8kMethod::strict).has_value());
}

TEST(Gsm8k, FlexibleFollowsVerl) {
  EXPECT_EQ(gsm8k_compute_score("so we get 3 and then 72", "72", Gsm8kMethod::flexible), 1.0);
  EXPECT_EQ(gsm8k_compute_score("answer: 72 .", "72", Gsm8kMethod::flexible), 1.0);  // "." is skipped
  EXPECT_EQ(*gsm8k_extract_solution("it is 72.", Gsm8kMethod::flexible), "72.");     // regex keeps the dot
  EXPECT_EQ(*gsm8k_extract_solution("total 1,000", Gsm8kMethod::flexible), "1,000");  // no comma removal
  EXPECT_EQ(*gsm8k_extract_solution("x -3 y", Gsm8kMethod::flexible), "-3");
  EXPECT_FALSE(gsm8k_extract_solution("no digits", Gsm8kMethod::flexible).has_value());
  EXPECT_EQ(score("gsm8k_flexible", "so 42", "42"), 1.0);
  EXPECT_EQ(score("openai/gsm8k", "#### 42", "42"), 1.0);
  EXPECT_EQ(score("gsm8k", "42", "42"), 0.0);
}

TEST(Scorers, ExactMatchNumericAndArith) {
  EXPECT_EQ(score("exact_match", "  Paris \n", "Paris"), 1.0);
  EXPECT_EQ(score("exact_match", "paris", "Paris"), 0.0);
  EXPECT_EQ(score("numeric", "first 3, then 1,234.0", "1234"), 1.0);
  EXPECT_EQ(score("numeric", "it is -2.5", json(-2.5)), 1.0);
  EXPECT_EQ(score("numeric", "it is 7", 8), 0.0);
  EXPECT_EQ(score("numeric", "no number", "8"), 0.0);
  EXPECT_EQ(score("tessera/arith", "42 is it, not 43", "42"), 1.0);
  EXPECT_EQ(score("tessera/arith", "-7", json(-7)), 1.0);
  EXPECT_EQ(score("tessera/arith", "43 or 42", "42"), 0.0);  // the FIRST integer counts
  EXPECT_EQ(score("tessera/arith", "", "42"), 0.0);
  EXPECT_EQ(*last_number("a 1,234.5 b"), 1234.5);
  EXPECT_EQ(*first_integer("x=-12;"), -12);
}

TEST(Scorers, RegistryErrors) {
  auto reg = ScorerRegistry::with_builtins();
  auto unknown = reg.find("prime_code_thing");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'prime_code_thing'"), std::string::npos);
  EXPECT_TRUE(reg.find("lighteval/MATH").ok());
  EXPECT_TRUE(reg.find("aime2024").ok());  // verl: any aime* source is math_dapo
  EXPECT_EQ(reg.add("gsm8k", [](const ScoreInput&) -> Result<ScoreResult> { return ScoreResult{}; }).code(),
            ErrorCode::already_exists);
  EXPECT_TRUE(reg.add("mine", [](const ScoreInput&) -> Result<ScoreResult> { return ScoreResult{0.5, {}}; }).ok());
  EXPECT_TRUE(reg.find("mine").ok());
  json extra;
  auto bad_gt = (*reg.find("numeric"))(ScoreInput{"numeric", "3", json::array(), extra});
  EXPECT_FALSE(bad_gt.ok());
}

// A batch of rows with the given responses: prompt width 6 (left padded), response width 8
// (right padded).
proto::DataProto scored_batch(const std::vector<std::string>& responses, const std::vector<std::string>& sources,
                              const std::vector<std::string>& truths) {
  const auto& tok = testing::qwen3_tokenizer();
  const int64_t b = static_cast<int64_t>(responses.size()), p = 6, r = 8;
  const int32_t pad = *tok.pad_token_id();
  at::Tensor prompts = torch::full({b, p}, pad, torch::kInt64), resp = torch::full({b, r}, pad, torch::kInt64);
  at::Tensor mask = torch::zeros({b, p + r}, torch::kInt64);
  std::vector<json> rm;
  for (int64_t i = 0; i < b; ++i) {
    auto pid = *tok.encode("Q?");
    for (size_t j = 0; j < pid.size(); ++j) prompts[i][p - pid.size() + j] = pid[j], mask[i][p - pid.size() + j] = 1;
    auto rid = *tok.encode(responses[i]);
    for (size_t j = 0; j < rid.size(); ++j) resp[i][j] = rid[j], mask[i][p + j] = 1;
    rm.push_back({{"style", "rule"}, {"ground_truth", truths[i]}});
  }
  proto::TensorDict t;
  t.insert_or_assign("prompts", prompts);
  t.insert_or_assign("responses", resp);
  t.insert_or_assign("attention_mask", mask);
  proto::NonTensorBatch c;
  c.insert_or_assign("data_source", proto::Column::strings(sources));
  c.insert_or_assign("reward_model", proto::Column::jsons(rm));
  return *proto::DataProto::from_dict(t, c);
}

TEST(NaiveRewardManager, ScoresAtTheLastValidToken) {
  NaiveRewardManager manager(testing::qwen3_tokenizer(), ScorerRegistry::with_builtins());
  auto batch = scored_batch({"#### 12<|im_end|>", "7 apples", "#### 5"}, {"gsm8k", "numeric", "gsm8k"},
                            {"12", "8", "5"});
  auto out = manager(batch);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const auto& tok = testing::qwen3_tokenizer();
  auto len = [&](const std::string& s) { return static_cast<int64_t>(tok.encode(s)->size()); };
  at::Tensor want = torch::zeros({3, 8});
  want[0][len("#### 12<|im_end|>") - 1] = 1.0;  // <|im_end|> is skipped when decoding; the score
  want[2][len("#### 5") - 1] = 1.0;             // still lands on the last valid position
  EXPECT_TRUE(torch::equal(out->reward_tensor, want)) << out->reward_tensor;
  EXPECT_EQ(out->reward_tensor.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(out->reward_extra_info.empty());  // plain-float scorers add no extra info
}

TEST(NaiveRewardManager, ExtraInfoAndErrors) {
  NaiveRewardManager manager(testing::qwen3_tokenizer(), ScorerRegistry::with_builtins());
  auto arith = manager(scored_batch({"3", "4"}, {"tessera/arith", "tessera/arith"}, {"3", "5"}));
  ASSERT_TRUE(arith.ok()) << arith.status().to_string();
  EXPECT_EQ(arith->reward_extra_info["acc"], (std::vector<json>{true, false}));
  EXPECT_EQ(arith->reward_extra_info["pred"], (std::vector<json>{"3", "4"}));
  EXPECT_EQ(arith->reward_extra_info["score"], (std::vector<json>{1.0, 0.0}));
  auto mixed = manager(scored_batch({"3", "#### 5"}, {"tessera/arith", "gsm8k"}, {"3", "5"}));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("reward_extra_info"), std::string::npos);
  auto unknown = manager(scored_batch({"3"}, {"nope/source"}, {"3"}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'nope/source'"), std::string::npos) << unknown.status().message();
  // rm_scores short-circuit the rule scorers.
  auto batch = scored_batch({"3"}, {"nope/source"}, {"3"});
  ASSERT_TRUE(batch.set_tensor("rm_scores", torch::ones({1, 8})).ok());
  auto rm = manager(batch);
  ASSERT_TRUE(rm.ok());
  EXPECT_TRUE(torch::equal(rm->reward_tensor, torch::ones({1, 8})));
}

// A dict answer's keys, "score" included, are extra infos (verl's naive manager); a row whose
// custom scorer raised under on_error=zero takes the same keys ("score" 0, null for the rest), so
// the columns stay one entry per row.
TEST(NaiveRewardManager, DictAnswersAndRowsScoredZeroKeepTheColumnsAligned) {
  RewardManagerOptions o;
  o.batch_scorer = [](const std::vector<ScoreRequest>& rows) -> Result<std::vector<ScoreResult>> {
    std::vector<ScoreResult> out(rows.size());
    out[0].score = 1.0;
    out[0].dict = true;
    out[0].extra = {{"acc", true}};
    out[1].failed = true;  // raised; scored 0
    return out;
  };
  NaiveRewardManager manager(testing::qwen3_tokenizer(), ScorerRegistry::with_builtins(), o);
  auto out = manager(scored_batch({"#### 12", "#### 5"}, {"gsm8k", "gsm8k"}, {"12", "5"}));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->reward_extra_info["score"], (std::vector<json>{1.0, 0.0}));
  EXPECT_EQ(out->reward_extra_info["acc"], (std::vector<json>{true, nullptr}));
}

// verl's DAPORewardManager: reward = score + min(-(len - (max_resp_len - buffer)) / buffer * factor, 0),
// with acc / overlong_reward / overlong as extra infos.
TEST(NaiveRewardManager, DapoOverlongBuffer) {
  RewardManagerOptions o;
  o.kind = "dapo";
  o.max_resp_len = 8;
  o.overlong = {/*enable=*/true, /*len=*/4, /*penalty_factor=*/1.0, /*log=*/true};
  NaiveRewardManager manager(testing::qwen3_tokenizer(), ScorerRegistry::with_builtins(), o);
  const auto& tok = testing::qwen3_tokenizer();
  // Response lengths in tokens: "#### 12" is short; the long one runs past max_resp_len - len = 4.
  const std::string long_text = "#### 12 and so on and";
  const auto n_long = static_cast<int64_t>(tok.encode(long_text)->size());
  ASSERT_GT(n_long, 4);
  ASSERT_LE(n_long, 8);
  auto out = manager(scored_batch({"#### 12", long_text}, {"gsm8k", "gsm8k"}, {"12", "12"}));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const double penalty = std::min(-static_cast<double>(n_long - 4) / 4.0, 0.0);
  EXPECT_EQ(out->reward_extra_info["acc"], (std::vector<json>{1.0, 1.0}));  // both answer "#### 12"
  EXPECT_EQ(out->reward_extra_info["overlong"], (std::vector<json>{false, true}));
  EXPECT_DOUBLE_EQ(out->reward_extra_info["overlong_reward"][1].get<double>(), penalty);
  EXPECT_FLOAT_EQ(out->reward_tensor[1][n_long - 1].item<float>(), static_cast<float>(1.0 + penalty));
  EXPECT_LT(penalty, 0.0);
  // naive with the same scores adds nothing.
  NaiveRewardManager naive(testing::qwen3_tokenizer(), ScorerRegistry::with_builtins());
  auto plain = naive(scored_batch({"#### 12", long_text}, {"gsm8k", "gsm8k"}, {"12", "12"}));
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->reward_extra_info.empty());
  EXPECT_FLOAT_EQ(plain->reward_tensor[1][n_long - 1].item<float>(), 1.0f);
}

}  // namespace
}  // namespace tessera::driver
