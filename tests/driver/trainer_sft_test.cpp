// FSDPSFTTrainer over the "sft" worker group (2 CPU ranks): a few steps, the checkpoint's HF export
// loads as a model, and the trainer's validation loss equals an independent computation (plain
// LibTorch cross-entropy over that exported model and the same collated validation rows).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "driver/data.hpp"
#include "driver/sft_trainer.hpp"
#include "tests/driver/trainer_test_util.hpp"
#include "workers/models/model_io.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

// Token-mean CE of `model` over `batch` (loss_mask[t] marks the prediction of token t+1).
double reference_loss(models::CausalLM& model, const proto::DataProto& batch) {
  torch::NoGradGuard g;
  at::Tensor ids = *batch.tensor("input_ids"), mask = *batch.tensor("attention_mask");
  at::Tensor pos = *batch.tensor("position_ids"), lm = *batch.tensor("loss_mask");
  at::Tensor logits = model.forward(ids, mask, pos);
  const int64_t T = ids.size(1);
  at::Tensor lp = torch::log_softmax(logits.narrow(1, 0, T - 1), -1)
                      .gather(2, ids.narrow(1, 1, T - 1).unsqueeze(-1))
                      .squeeze(-1);
  at::Tensor m = lm.narrow(1, 0, T - 1).to(torch::kFloat32);
  return (-(lp * m).sum() / m.sum()).item<double>();
}

TEST(SftTrainer, TrainsSavesAndValidatesLikeAReference) {
  TempDir dir("sft");
  testing::make_tiny_run(dir.path());
  auto cfg = load_config(ConfigKind::sft, "", testing::tiny_sft_overrides(dir.path(), 3));
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const nlohmann::json cfg_copy = *cfg;
  auto t = FSDPSFTTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE((*t)->fit().ok());
  const auto& h = (*t)->history();
  ASSERT_EQ(h.size(), 3u);
  for (const auto& [step, m] : h) {
    EXPECT_TRUE(std::isfinite(m.at("train/loss")));
    EXPECT_DOUBLE_EQ(m.at("train/lr"), 1e-3);
    EXPECT_GE(m.at("train/grad_norm"), 0.0);
  }
  ASSERT_TRUE(h.back().second.count("val/loss"));  // validation at the last step
  ASSERT_TRUE((*t)->last_hf_dir().has_value());
  auto model = models::load_causal_lm((*t)->last_hf_dir()->string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto tok = tokenizer::Tokenizer::from_dir((*t)->last_hf_dir()->string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto opts = SFTDatasetOptions::from_config(cfg_copy);
  ASSERT_TRUE(opts.ok());
  auto val = SFTDataset::load({dir.path() / "data" / "sft_val.jsonl"}, *tok, *opts);
  ASSERT_TRUE(val.ok()) << val.status().to_string();
  std::vector<int64_t> all;
  for (int64_t i = 0; i < val->size(); ++i) all.push_back(i);
  auto batch = val->collate(all);
  ASSERT_TRUE(batch.ok());
  // 10 validation rows over 2 ranks and batches of 8: padding is exercised and must not count.
  EXPECT_NEAR(h.back().second.at("val/loss"), reference_loss(**model, *batch), 1e-4);
}

// data.multiturn: a run over conversations (the dataset's tokens and masks are checked against
// verl's in data_test.cpp); the validation loss equals the reference over the dataset's batch,
// which trains on fewer positions than the conversation has.
TEST(SftTrainer, MultiTurnConversations) {
  TempDir dir("sft_multiturn");
  testing::make_tiny_run(dir.path());
  dir.write("model/chat_template.jinja", "{% for m in messages %}{{ m.content }}\n{% endfor %}");
  for (const char* split : {"train", "val"}) {
    std::ifstream in(dir.path() / "data" / (std::string("sft_") + split + ".jsonl"));
    std::string out;
    for (std::string line; std::getline(in, line);) {
      const auto row = nlohmann::json::parse(line);
      const std::string p = row["prompt"], r = row["response"];
      out += nlohmann::json{{"messages", {{{"role", "user"}, {"content", p}}, {{"role", "assistant"}, {"content", r}},
                                          {{"role", "user"}, {"content", "again"}},
                                          {{"role", "assistant"}, {"content", r}}}}}
                 .dump() +
             "\n";
    }
    dir.write(std::string("data/mt_") + split + ".jsonl", out);
  }
  auto overrides = testing::tiny_sft_overrides(dir.path(), 2);
  for (const std::string& o : {std::string("data.multiturn.enable=true"), std::string("data.max_length=48"),
                               "data.train_files=" + (dir.path() / "data" / "mt_train.jsonl").string(),
                               "data.val_files=" + (dir.path() / "data" / "mt_val.jsonl").string()}) {
    overrides.push_back(o);
  }
  auto cfg = load_config(ConfigKind::sft, "", overrides);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const nlohmann::json cfg_copy = *cfg;
  auto t = FSDPSFTTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE((*t)->fit().ok());
  const auto& h = (*t)->history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(std::isfinite(h.back().second.at("train/loss")));
  ASSERT_TRUE((*t)->last_hf_dir().has_value());
  auto model = models::load_causal_lm((*t)->last_hf_dir()->string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto tok = tokenizer::Tokenizer::from_dir((dir.path() / "model").string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto opts = SFTDatasetOptions::from_config(cfg_copy);
  ASSERT_TRUE(opts.ok());
  EXPECT_TRUE(opts->multiturn);
  auto val = SFTDataset::load({dir.path() / "data" / "mt_val.jsonl"}, *tok, *opts);
  ASSERT_TRUE(val.ok()) << val.status().to_string();
  std::vector<int64_t> all;
  for (int64_t i = 0; i < val->size(); ++i) all.push_back(i);
  auto batch = val->collate(all);
  ASSERT_TRUE(batch.ok());
  EXPECT_LT(batch->tensor("loss_mask")->sum().item<int64_t>(), batch->tensor("attention_mask")->sum().item<int64_t>() / 2);
  EXPECT_NEAR(h.back().second.at("val/loss"), reference_loss(**model, *batch), 1e-4);
}

}  // namespace
}  // namespace tessera::driver
