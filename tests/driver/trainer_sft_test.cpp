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

// A fitted SFT run over `overrides`, and the config it ran with (trainer null on a failure).
struct SftRun {
  std::unique_ptr<FSDPSFTTrainer> trainer;
  nlohmann::json config;
};

SftRun fit_sft(const std::vector<std::string>& overrides) {
  SftRun run;
  auto cfg = load_config(ConfigKind::sft, "", overrides);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return run;
  run.config = *cfg;
  auto t = FSDPSFTTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return run;
  Status fitted = (*t)->fit();
  EXPECT_TRUE(fitted.ok()) << fitted.to_string();
  if (fitted.ok()) run.trainer = std::move(*t);
  return run;
}

// The run's last val/loss against reference_loss over every row of `val_file` (read with the
// run's dataset options and the tokenizer of `tokenizer_dir`) and the run's exported model.
// Returns that batch, for further checks.
proto::DataProto expect_reference_val_loss(const SftRun& run, const std::filesystem::path& val_file,
                                           const std::filesystem::path& tokenizer_dir) {
  const auto& h = run.trainer->history();
  EXPECT_TRUE(h.back().second.count("val/loss"));  // validation at the last step
  EXPECT_TRUE(run.trainer->last_hf_dir().has_value());
  if (!run.trainer->last_hf_dir()) return {};
  auto model = models::load_causal_lm(run.trainer->last_hf_dir()->string());
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  auto tok = tokenizer::Tokenizer::from_dir(tokenizer_dir.string());
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  auto opts = SFTDatasetOptions::from_config(run.config);
  EXPECT_TRUE(opts.ok());
  if (!model.ok() || !tok.ok() || !opts.ok()) return {};
  auto val = SFTDataset::load({val_file}, *tok, *opts);
  EXPECT_TRUE(val.ok()) << val.status().to_string();
  if (!val.ok()) return {};
  std::vector<int64_t> all;
  for (int64_t i = 0; i < val->size(); ++i) all.push_back(i);
  auto batch = val->collate(all);
  EXPECT_TRUE(batch.ok());
  if (!batch.ok()) return {};
  EXPECT_NEAR(h.back().second.at("val/loss"), reference_loss(**model, *batch), 1e-4);
  return *batch;
}

TEST(SftTrainer, TrainsSavesAndValidatesLikeAReference) {
  TempDir dir("sft");
  testing::make_tiny_run(dir.path());
  SftRun run = fit_sft(testing::tiny_sft_overrides(dir.path(), 3));
  ASSERT_NE(run.trainer, nullptr);
  const auto& h = run.trainer->history();
  ASSERT_EQ(h.size(), 3u);
  for (const auto& [step, m] : h) {
    EXPECT_TRUE(std::isfinite(m.at("train/loss")));
    EXPECT_DOUBLE_EQ(m.at("train/lr"), 1e-3);
    EXPECT_GE(m.at("train/grad_norm"), 0.0);
  }
  // 10 validation rows over 2 ranks and batches of 8: padding is exercised and must not count.
  expect_reference_val_loss(run, dir.path() / "data" / "sft_val.jsonl", *run.trainer->last_hf_dir());
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
  SftRun run = fit_sft(overrides);
  ASSERT_NE(run.trainer, nullptr);
  ASSERT_EQ(run.trainer->history().size(), 2u);
  EXPECT_TRUE(std::isfinite(run.trainer->history().back().second.at("train/loss")));
  proto::DataProto batch = expect_reference_val_loss(run, dir.path() / "data" / "mt_val.jsonl", dir.path() / "model");
  ASSERT_TRUE(batch.tensor("loss_mask").ok());
  EXPECT_LT(batch.tensor("loss_mask")->sum().item<int64_t>(), batch.tensor("attention_mask")->sum().item<int64_t>() / 2);
}

// data.custom_cls: the user's SFT class (here one that reads the JSONL pairs itself and trains on
// the response positions) feeds the run.
TEST(SftTrainer, CustomDatasetClass) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl) is not set";
  TempDir dir("sft_custom_cls");
  testing::make_tiny_run(dir.path());
  dir.write("py/ray/__init__.py", "ObjectRef = object\n");  // verl imports ray for DataProtoFuture only
  const auto module = dir.write("pairs.py", R"PY(
import json, torch
class Pairs(torch.utils.data.Dataset):
    def __init__(self, parquet_files, tokenizer, config):
        files = [parquet_files] if isinstance(parquet_files, str) else parquet_files  # as configured
        self.rows = [json.loads(line) for f in files for line in open(f) if line.strip()]
        self.tokenizer, self.width = tokenizer, config.max_length
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        row = self.rows[i]
        prompt = self.tokenizer.encode(row["prompt"], add_special_tokens=False)
        response = self.tokenizer.encode(row["response"], add_special_tokens=False) + [self.tokenizer.eos_token_id]
        ids = (prompt + response)[: self.width]
        n, pad = len(ids), self.width - len(ids)
        loss = [1 if len(prompt) - 1 <= j < n - 1 else 0 for j in range(n)]
        return {"input_ids": torch.tensor(ids + [self.tokenizer.pad_token_id] * pad),
                "attention_mask": torch.tensor([1] * n + [0] * pad),
                "position_ids": torch.tensor(list(range(n)) + [0] * pad), "loss_mask": torch.tensor(loss + [0] * pad)}
)PY");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_DATA_PYTHON", py);
  auto overrides = testing::tiny_sft_overrides(dir.path(), 2);
  overrides.push_back("data.custom_cls.path=" + module.string());
  overrides.push_back("data.custom_cls.name=Pairs");
  SftRun run = fit_sft(overrides);
  ASSERT_NE(run.trainer, nullptr);
  ASSERT_EQ(run.trainer->history().size(), 2u);
  EXPECT_TRUE(std::isfinite(run.trainer->history().back().second.at("train/loss")));
}

}  // namespace
}  // namespace tessera::driver
