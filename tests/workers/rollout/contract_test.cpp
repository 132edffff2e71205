// verl's generate_sequences contract (§6.3): input checks, get_response_mask, and the output
// layout, both from build_generation_output directly and end to end through the engine.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/rollout/rollout_test_util.hpp"
#include "workers/rollout/contract.hpp"

namespace tessera::rollout {
namespace {

using testing::get;

at::Tensor longs(std::vector<std::vector<int64_t>> rows) {
  std::vector<at::Tensor> out;
  for (auto& r : rows) out.push_back(at::tensor(r, at::kLong));
  return at::stack(out);
}

TEST(Contract, ResponseMaskIsOneThroughTheFirstEos) {
  at::Tensor responses = longs({{5, 2, 7, 2}, {1, 3, 4, 6}, {2, 0, 0, 0}, {9, 7, 2, 1}});
  EXPECT_TRUE(get_response_mask(responses, {2}, at::kLong)
                  .equal(longs({{1, 1, 0, 0}, {1, 1, 1, 1}, {1, 0, 0, 0}, {1, 1, 1, 0}})));
  EXPECT_TRUE(get_response_mask(responses, {7, 2}, at::kLong)
                  .equal(longs({{1, 1, 0, 0}, {1, 1, 1, 1}, {1, 0, 0, 0}, {1, 1, 0, 0}})));
  EXPECT_EQ(get_response_mask(responses, {2}, at::kFloat).scalar_type(), at::kFloat);
}

TEST(Contract, ReadsPromptsUnderTheMask) {
  proto::DataProto batch = testing::prompt_batch({3, 1, 4}, 4, 1, nlohmann::json::array({2, 5}), /*pad=*/7);
  auto in = read_generation_inputs(batch, /*default_do_sample=*/true);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  at::Tensor ids = get(batch, "input_ids");
  ASSERT_EQ(in->prompts.size(), 3u);
  EXPECT_EQ(in->prompts[0], (std::vector<int64_t>{ids[0][1].item<int64_t>(), ids[0][2].item<int64_t>(), ids[0][3].item<int64_t>()}));
  EXPECT_EQ(in->prompts[1], (std::vector<int64_t>{ids[1][3].item<int64_t>()}));
  EXPECT_EQ(in->prompts[2].size(), 4u);
  EXPECT_EQ(in->eos_token_ids, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(in->pad_token_id, 7);
  EXPECT_TRUE(in->do_sample);
  EXPECT_FALSE(in->validate);
}

void expect_error(proto::DataProto batch, const std::string& needle, ErrorCode code = ErrorCode::invalid_argument) {
  auto in = read_generation_inputs(batch, true);
  ASSERT_FALSE(in.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(in.status().code(), code) << in.status().to_string();
  EXPECT_NE(in.status().message().find(needle), std::string::npos) << in.status().to_string();
}

TEST(Contract, RejectsMalformedInputs) {
  proto::DataProto good = testing::prompt_batch({3, 2}, 4, 2, 2);
  proto::DataProto no_eos = good;
  no_eos.meta_info().erase("eos_token_id");
  expect_error(no_eos, "eos_token_id");
  proto::DataProto empty_eos = good;
  empty_eos.meta_info()["eos_token_id"] = nlohmann::json::array();
  expect_error(empty_eos, "eos_token_id");
  proto::DataProto no_pad = good;
  no_pad.meta_info().erase("pad_token_id");
  expect_error(no_pad, "pad_token_id");
  proto::DataProto bad_sample = good;
  bad_sample.meta_info()["do_sample"] = "yes";
  expect_error(bad_sample, "do_sample");
  proto::DataProto holes = good.select().value();
  ASSERT_TRUE(holes.set_tensor("attention_mask", longs({{1, 0, 1, 1}, {0, 0, 1, 1}})).ok());
  expect_error(holes, "row 0 is not left-padded");
  proto::DataProto empty_row = good.select().value();
  ASSERT_TRUE(empty_row.set_tensor("attention_mask", longs({{0, 1, 1, 1}, {0, 0, 0, 0}})).ok());
  expect_error(empty_row, "row 1 has an empty prompt");
  proto::DataProto mrope = good.select().value();
  ASSERT_TRUE(mrope.set_tensor("position_ids", at::zeros({2, 3, 4}, at::kLong)).ok());
  expect_error(mrope, "mrope", ErrorCode::unimplemented);
  proto::DataProto missing = good.select(std::vector<std::string>{"input_ids", "attention_mask"}).value();
  expect_error(missing, "position_ids", ErrorCode::not_found);
}

TEST(Contract, BuildsVerlsOutputLayout) {
  proto::DataProto batch = testing::prompt_batch({3, 1}, 4, 3, nlohmann::json::array({2, 9}), /*pad=*/0);
  ASSERT_TRUE(batch.set_column("raw_prompt_ids", proto::Column::jsons({nlohmann::json::array({1}), nlohmann::json::array({2})})).ok());
  ASSERT_TRUE(batch.set_column("data_source", proto::Column::strings({"a", "b"})).ok());
  auto in = read_generation_inputs(batch, true);
  ASSERT_TRUE(in.ok());
  std::vector<GeneratedRow> rows = {{{5, 9, 4}, {-0.5f, -1.5f, -2.5f}}, {{6, 7, 8, 3, 1}, {-1, -2, -3, -4, -5}}};
  auto out = build_generation_output(batch, *in, rows, /*response_length=*/5, /*with_logprobs=*/true);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(get(*out, "responses").equal(longs({{5, 9, 4, 0, 0}, {6, 7, 8, 3, 1}})));
  EXPECT_TRUE(get(*out, "prompts").is_same(get(batch, "input_ids")));
  EXPECT_TRUE(get(*out, "input_ids").equal(at::cat({get(batch, "input_ids"), get(*out, "responses")}, 1)));
  at::Tensor mask = get(*out, "attention_mask");
  EXPECT_TRUE(mask.narrow(1, 0, 4).equal(get(batch, "attention_mask")));
  EXPECT_TRUE(mask.narrow(1, 4, 5).equal(longs({{1, 1, 0, 0, 0}, {1, 1, 1, 1, 1}})));  // 9 is an EOS
  EXPECT_TRUE(get(*out, "position_ids").equal(longs({{0, 0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 0, 1, 2, 3, 4, 5}})));
  at::Tensor lp = get(*out, "rollout_log_probs");
  EXPECT_EQ(lp.scalar_type(), at::kFloat);
  EXPECT_TRUE(lp[0].equal(at::tensor({-0.5f, -1.5f, -2.5f, -1.0f, -1.0f})));
  EXPECT_FALSE(out->non_tensor_batch().contains("raw_prompt_ids"));
  EXPECT_TRUE(out->non_tensor_batch().contains("data_source"));
  EXPECT_TRUE(out->meta_info().empty());
  EXPECT_EQ(out->batch().keys(), (std::vector<std::string>{"prompts", "responses", "input_ids", "attention_mask",
                                                           "position_ids", "rollout_log_probs"}));
}

TEST(Contract, EmptyBatchGivesEmptyOutput) {
  auto model = testing::tiny_model(12);
  proto::DataProto prompts = testing::prompt_batch({3, 2}, 4, 1, 2);
  auto empty = prompts.slice(0, 0);
  ASSERT_TRUE(empty.ok());
  auto out = testing::make_engine(model, testing::test_config(/*response_length=*/5))->generate_sequences(*empty);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(get(*out, "responses").sizes(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(get(*out, "input_ids").sizes(), (std::vector<int64_t>{0, 9}));
}

TEST(Contract, EngineOutputFollowsTheContract) {
  auto model = testing::tiny_model(11);
  RolloutConfig cfg = testing::test_config(/*response_length=*/10);
  const int64_t P = 6;
  proto::DataProto prompts = testing::prompt_batch({6, 2, 4, 1}, P, 12, nlohmann::json::array({4, 8, 15, 16, 23, 42}), 1);
  ASSERT_TRUE(prompts.set_column("uid", proto::Column::int64s({10, 11, 12, 13})).ok());
  proto::DataProto out = testing::generate(*testing::make_engine(model, cfg, 2), prompts);
  at::Tensor resp = get(out, "responses"), mask = get(out, "attention_mask"), pos = get(out, "position_ids");
  ASSERT_EQ(resp.sizes(), (std::vector<int64_t>{4, 10}));
  ASSERT_EQ(get(out, "input_ids").sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(resp.scalar_type(), at::kLong);
  EXPECT_FALSE(out.batch().contains("rollout_log_probs"));
  EXPECT_TRUE(get_response_mask(resp, {4, 8, 15, 16, 23, 42}, at::kLong).equal(mask.narrow(1, P, 10)));
  at::Tensor in_pos = get(prompts, "position_ids");
  EXPECT_TRUE(pos.narrow(1, P, 10).equal(in_pos.narrow(1, P - 1, 1) + at::arange(1, 11, at::kLong)));
  std::vector<int64_t> valid = testing::valid_lengths(out, P);
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t t = valid[static_cast<size_t>(b)]; t < 10; ++t) EXPECT_EQ(resp[b][t].item<int64_t>(), 1);  // pad
  }
  auto uid = out.column("uid");
  ASSERT_TRUE(uid.ok());
  EXPECT_EQ(uid->i64(3), 13);
}

}  // namespace
}  // namespace tessera::rollout
