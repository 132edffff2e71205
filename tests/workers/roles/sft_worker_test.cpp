// The "sft" worker type through WorkerGroups on the embedded runtime: its losses against plain
// LibTorch cross-entropy over the same model, data-parallel invariance of an update (2 ranks vs
// 1 rank give the same weights), the HF export, LoRA, and one-line errors for bad inputs.
#include <gtest/gtest.h>

#include <map>
#include <torch/torch.h>

#include <filesystem>

#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/models/model_io.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/roles/sft_worker.hpp"

namespace tessera::workers {
namespace {

using json = nlohmann::json;
using dispatch::Value;

const runtime::WorkerTypeRegistry& sft_registry() {
  static const runtime::WorkerTypeRegistry r = [] {
    runtime::WorkerTypeRegistry reg;
    EXPECT_TRUE(register_sft_worker(reg).ok());
    return reg;
  }();
  return r;
}

json init_config(const std::string& model) {
  return {{"config",
           {{"model", {{"partial_pretrain", model}, {"fsdp_config", {{"model_dtype", "fp32"}}}}},
            {"optim", {{"lr", 1e-2}, {"lr_scheduler", "constant"}, {"warmup_steps_ratio", 0.0}, {"weight_decay", 0.0}}},
            {"data", {{"micro_batch_size_per_gpu", 2}}}}},
          {"total_training_steps", 10},
          {"seed", 1}};
}

// 8 right-padded rows of random tokens; loss on the second half of each row's valid tokens.
proto::DataProto sft_batch() {
  at::Generator g = at::detail::createCPUGenerator(5);
  const int64_t B = 8, T = 12;
  at::Tensor ids = torch::randint(0, 40, {B, T}, g, torch::kInt64);
  at::Tensor mask = torch::zeros({B, T}, torch::kInt64), loss = torch::zeros({B, T}, torch::kInt64);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t len = 6 + i % 6;
    mask[i].narrow(0, 0, len).fill_(1);
    loss[i].narrow(0, len / 2, len - len / 2 - 1).fill_(1);
  }
  at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
  auto d = proto::DataProto::from_dict({{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}, {"loss_mask", loss}});
  EXPECT_TRUE(d.ok());
  return *d;
}

double reference_loss(const std::string& model_dir, const proto::DataProto& b) {
  auto model = models::load_causal_lm(model_dir);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  torch::NoGradGuard g;
  at::Tensor logits = (*model)->forward(*b.tensor("input_ids"), *b.tensor("attention_mask"), *b.tensor("position_ids"));
  at::Tensor ids = *b.tensor("input_ids"), lm = *b.tensor("loss_mask");
  const int64_t T = ids.size(1);
  auto terms = sft_loss_terms(logits.narrow(1, 0, T - 1), ids, lm);
  EXPECT_TRUE(terms.ok());
  // Independent of sft_loss_terms: log_softmax + gather.
  at::Tensor lp = torch::log_softmax(logits.narrow(1, 0, T - 1), -1).gather(2, ids.narrow(1, 1, T - 1).unsqueeze(-1)).squeeze(-1);
  at::Tensor m = lm.narrow(1, 0, T - 1).to(torch::kFloat32);
  const double want = (-(lp * m).sum() / m.sum()).item<double>();
  EXPECT_NEAR(terms->loss_sum.item<double>() / terms->tokens.item<double>(), want, 1e-5);
  return want;
}

struct Group {
  std::unique_ptr<runtime::Runtime> rt;
  std::shared_ptr<dispatch::WorkerGroup> wg;
};

Group spawn(int ranks, const json& init) {
  runtime::RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:" + std::to_string(ranks);
  auto rt = runtime::Runtime::start(cfg, sft_registry());
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  Group g{std::move(*rt), nullptr};
  auto wg = dispatch::WorkerGroup::spawn(*g.rt, "sft", *g.rt->resource_pool(), {{"", "sft", init.dump()}});
  EXPECT_TRUE(wg.ok()) << wg.status().to_string();
  g.wg = *wg;
  return g;
}

double metric(const Result<Value>& v, const std::string& key) {
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  if (!v.ok()) return NAN;
  // Collected from every rank (DataProto.concat keeps each rank's metrics): all ranks agree.
  const json& m = v->proto().meta_info()["metrics"].at(key);
  if (!m.is_array()) return m.get<double>();
  for (const auto& x : m) EXPECT_DOUBLE_EQ(x.get<double>(), m[0].get<double>()) << key;
  return m[0].get<double>();
}

// One train step on `ranks` ranks; returns (loss, exported HF dir).
std::pair<double, std::string> train_once(int ranks, const std::string& out) {
  Group g = spawn(ranks, init_config(testing::tiny_model_dir()));
  EXPECT_TRUE(g.wg->call("init_model", {}).ok());
  const double loss = metric(g.wg->call("train_batch", {Value(sft_batch())}), "train/loss");
  json args{{"local_path", out}, {"global_step", 1}};
  auto saved = g.wg->call("save_checkpoint", {Value(args)});
  EXPECT_TRUE(saved.ok()) << saved.status().to_string();
  return {loss, out + "/huggingface"};
}

TEST(SftWorker, ValidationLossMatchesReference) {
  Group g = spawn(2, init_config(testing::tiny_model_dir()));
  ASSERT_TRUE(g.wg->call("init_model", {}).ok());
  const proto::DataProto b = sft_batch();
  EXPECT_NEAR(metric(g.wg->call("validate_batch", {Value(b)}), "val/loss"), reference_loss(testing::tiny_model_dir(), b), 1e-5);
}

TEST(SftWorker, UpdateIsDataParallelInvariantAndExportsHf) {
  char tmpl[] = "/tmp/tessera_sft_worker_XXXXXX";
  const std::string base = ::mkdtemp(tmpl);
  auto [loss2, hf2] = train_once(2, base + "/dp2");
  auto [loss1, hf1] = train_once(1, base + "/dp1");
  const double before = reference_loss(testing::tiny_model_dir(), sft_batch());
  EXPECT_NEAR(loss2, before, 1e-5);  // the loss is reported before the update
  EXPECT_NEAR(loss1, before, 1e-5);
  auto m1 = models::load_causal_lm(hf1), m2 = models::load_causal_lm(hf2), m0 = models::load_causal_lm(testing::tiny_model_dir());
  ASSERT_TRUE(m1.ok() && m2.ok() && m0.ok()) << m1.status().to_string() << m2.status().to_string();
  auto p0 = (*m0)->parameter_map(), p1 = (*m1)->parameter_map(), p2 = (*m2)->parameter_map();
  double moved = 0;
  for (const auto& [name, t] : p1) {
    ASSERT_TRUE(p2.count(name)) << name;
    EXPECT_TRUE(torch::allclose(t, p2.at(name), 1e-5, 1e-6)) << name;
    moved = std::max(moved, (t - p0.at(name)).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-4);  // the step changed the weights
  // The trained model's loss on the batch went down (lr 1e-2, one step).
  EXPECT_LT(reference_loss(hf2, sft_batch()), before);
  EXPECT_TRUE(std::filesystem::exists(hf2 + "/tokenizer.json"));
  std::filesystem::remove_all(base);
}

// use_remove_padding: the packed SFT worker reports the same validation loss as the reference,
// and one training step moves the weights as the padded worker's step does.
TEST(SftWorker, PaddingFreeMatchesPadded) {
  std::map<std::string, at::Tensor> after[2];
  for (bool packed : {false, true}) {
    json init = init_config(testing::tiny_model_dir());
    init["config"]["use_remove_padding"] = packed;
    Group g = spawn(1, init);
    ASSERT_TRUE(g.wg->call("init_model", {}).ok());
    const proto::DataProto b = sft_batch();
    EXPECT_NEAR(metric(g.wg->call("validate_batch", {Value(b)}), "val/loss"),
                reference_loss(testing::tiny_model_dir(), b), 1e-5);
    metric(g.wg->call("train_batch", {Value(b)}), "train/loss");
    char tmpl[] = "/tmp/tessera_sft_rmpad_XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    ASSERT_TRUE(g.wg->call("save_checkpoint", {Value(json{{"local_path", dir}, {"global_step", 1}})}).ok());
    auto m = models::load_causal_lm(dir + "/huggingface");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (const auto& [name, t] : (*m)->parameter_map()) after[packed][name] = t.clone();
    std::filesystem::remove_all(dir);
  }
  // Adam's first step is lr * g / (|g| + eps), which magnifies float noise in gradients near zero
  // (k_proj biases get none in exact arithmetic: softmax ignores a shift of every key): the two
  // runs, whose float sums differ in order, agree to a few 1e-6 after a 1e-2 step.
  for (const auto& [name, t] : after[0]) EXPECT_TRUE(torch::allclose(after[1].at(name), t, 1e-5, 2e-5)) << name;
  json bad = init_config(testing::tiny_model_dir());
  bad["config"]["use_remove_padding"] = "yes";
  Group g = spawn(1, bad);
  auto st = g.wg->call("init_model", {});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("use_remove_padding"), std::string::npos) << st.status().to_string();
}

// ulysses_sequence_parallel_size (Note [Ulysses sequence parallelism]): 2 ranks in one group of 2,
// and 4 ranks in two groups of 2, split each packed micro-batch's tokens; they report the
// reference loss and take the step that 1 rank takes on the whole batch.
TEST(SftWorker, SequenceParallelRanksTrainAsOneRank) {
  std::map<int, std::map<std::string, at::Tensor>> after;
  for (int ranks : {1, 2, 4}) {  // 1 rank; one group of 2; two groups of 2
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    json init = init_config(testing::tiny_model_dir());
    init["config"]["use_remove_padding"] = true;
    init["config"]["ulysses_sequence_parallel_size"] = std::min(ranks, 2);
    Group g = spawn(ranks, init);
    ASSERT_TRUE(g.wg->call("init_model", {}).ok());
    const proto::DataProto b = sft_batch();
    EXPECT_NEAR(metric(g.wg->call("validate_batch", {Value(b)}), "val/loss"),
                reference_loss(testing::tiny_model_dir(), b), 1e-5);
    EXPECT_NEAR(metric(g.wg->call("train_batch", {Value(b)}), "train/loss"),
                reference_loss(testing::tiny_model_dir(), b), 1e-5);
    char tmpl[] = "/tmp/tessera_sft_ulysses_XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    ASSERT_TRUE(g.wg->call("save_checkpoint", {Value(json{{"local_path", dir}, {"global_step", 1}})}).ok());
    auto m = models::load_causal_lm(dir + "/huggingface");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (const auto& [name, t] : (*m)->parameter_map()) after[ranks][name] = t.clone();
    std::filesystem::remove_all(dir);
  }
  // Adam's first step magnifies float noise in gradients near zero (see PaddingFreeMatchesPadded).
  for (int ranks : {2, 4}) {
    for (const auto& [name, t] : after[1]) {
      EXPECT_TRUE(torch::allclose(after[ranks].at(name), t, 1e-5, 2e-5)) << ranks << " ranks: " << name;
    }
  }
  json bad = init_config(testing::tiny_model_dir());
  bad["config"]["ulysses_sequence_parallel_size"] = 2;
  Group g = spawn(2, bad);
  auto st = g.wg->call("init_model", {});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("ulysses_sequence_parallel_size = 2 > 1 requires use_remove_padding"),
            std::string::npos) << st.status().to_string();
}

// model.lora_rank (verl's SFT trainer with PEFT): 2 ranks train the adapters as 1 rank does; the
// HF export has them merged, so only the adapted projections moved (embeddings, norms and head are
// bitwise the base model's) and the loss went down; the PEFT adapter is saved beside it.
TEST(SftWorker, LoraTrainsTheAdaptersAndExportsTheMergedModel) {
  char tmpl[] = "/tmp/tessera_sft_lora_XXXXXX";
  const std::string base = ::mkdtemp(tmpl);
  std::map<std::string, at::Tensor> merged[2];
  for (int ranks : {1, 2}) {
    json init = init_config(testing::tiny_model_dir());
    init["config"]["model"]["lora_rank"] = 4;
    init["config"]["model"]["lora_alpha"] = 8;
    init["config"]["model"]["target_modules"] = json::array({"q_proj", "v_proj", "down_proj"});
    Group g = spawn(ranks, init);
    ASSERT_TRUE(g.wg->call("init_model", {}).ok());
    for (int step = 0; step < 2; ++step) metric(g.wg->call("train_batch", {Value(sft_batch())}), "train/loss");
    const std::string out = base + "/dp" + std::to_string(ranks);
    auto saved = g.wg->call("save_checkpoint", {Value(json{{"local_path", out}, {"global_step", 2}})});
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    EXPECT_TRUE(std::filesystem::exists(out + "/lora_adapter/adapter_model.safetensors"));
    auto m = models::load_causal_lm(out + "/huggingface");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (const auto& [name, t] : (*m)->parameter_map()) merged[ranks - 1][name] = t.clone();
    // The export is the base plus B A * alpha / r of the adapter saved beside it.
    auto adapter = models::read_safetensors(out + "/lora_adapter/adapter_model.safetensors");
    ASSERT_TRUE(adapter.ok()) << adapter.status().to_string();
    auto base_model = models::load_causal_lm(testing::tiny_model_dir());
    ASSERT_TRUE(base_model.ok());
    for (const char* module : {"model.layers.1.self_attn.q_proj", "model.layers.0.mlp.down_proj"}) {
      const std::string prefix = std::string("base_model.model.") + module;
      const at::Tensor want = (*base_model)->parameter_map().at(std::string(module) + ".weight") +
                              at::matmul(adapter->tensors.at(prefix + ".lora_B.weight"),
                                         adapter->tensors.at(prefix + ".lora_A.weight")) * 2.0;
      EXPECT_LE((merged[ranks - 1].at(std::string(module) + ".weight") - want).abs().max().item<double>(), 1e-6) << module;
    }
    EXPECT_LT(reference_loss(out + "/huggingface", sft_batch()), reference_loss(testing::tiny_model_dir(), sft_batch()));
  }
  auto m0 = models::load_causal_lm(testing::tiny_model_dir());
  ASSERT_TRUE(m0.ok());
  for (const auto& [name, t] : (*m0)->parameter_map()) {
    ASSERT_TRUE(merged[0].count(name) && merged[1].count(name)) << name;
    EXPECT_TRUE(torch::allclose(merged[0].at(name), merged[1].at(name), 1e-5, 1e-6)) << name;
    const bool adapted = name.find("q_proj.weight") != std::string::npos || name.find("v_proj.weight") != std::string::npos ||
                         name.find("down_proj.weight") != std::string::npos;
    if (adapted) {
      EXPECT_GT((merged[0].at(name) - t).abs().max().item<double>(), 1e-5) << name << " did not move";
    } else {
      EXPECT_TRUE(at::equal(merged[0].at(name), t)) << name << " moved";
    }
  }
  std::filesystem::remove_all(base);
  json bad = init_config(testing::tiny_model_dir());
  bad["config"]["model"]["lora_rank"] = 4;
  bad["config"]["model"]["target_modules"] = json::array({"lm_head"});
  Group g = spawn(1, bad);
  auto st = g.wg->call("init_model", {});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("model.target_modules"), std::string::npos) << st.status().to_string();
}

TEST(SftWorker, BadInputsGiveOneLineErrors) {
  json bad = init_config(testing::tiny_model_dir());
  bad["config"]["model"].erase("partial_pretrain");
  Group g = spawn(1, bad);
  auto r = g.wg->call("init_model", {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.partial_pretrain"), std::string::npos) << r.status().to_string();

  Group ok = spawn(1, init_config(testing::tiny_model_dir()));
  ASSERT_TRUE(ok.wg->call("init_model", {}).ok());
  proto::DataProto b = sft_batch();
  ASSERT_TRUE(b.pop(std::vector<std::string>{"loss_mask"}).ok());
  auto t = ok.wg->call("train_batch", {Value(b)});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("loss_mask"), std::string::npos) << t.status().to_string();
  EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tessera::workers
