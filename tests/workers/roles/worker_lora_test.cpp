// ActorRolloutRefWorker with model.lora_rank > 0 (Note [LoRA adapters], verl's ref_in_actor):
// the reference log-probs are the base model file's (an independent forward) before and after
// training, with no second model loaded; the trained actor differs from it and only its adapters
// moved; the rollout's own log-probs of what it sampled (merged weights, KV-cache engine) equal
// the actor's recomputation with adapters (the training forward); the checkpoint holds a PEFT
// adapter (keys, values, config) and an HF model with the adapters merged, and round-trips; PEFT
// itself loads that adapter over the base model and computes the actor's log-probs; the
// combinations Tessera does not serve are refused naming the keys.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/model_io.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/critic_worker.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT

json lora_config(int64_t rank = 4, double alpha = 8) {
  json c = arr_config();
  c["model"]["lora_rank"] = rank;
  c["model"]["lora_alpha"] = alpha;
  c["model"]["target_modules"] = "all-linear";
  c["actor"]["optim"]["lr"] = 5e-2;  // adapters start at B = 0: a visible step
  return c;
}

at::Tensor base_log_probs(const proto::DataProto& d) {
  auto m = load_tiny_model();
  torch::NoGradGuard g;
  at::Tensor ids = *d.tensor("input_ids"), responses = *d.tensor("responses");
  at::Tensor logits = m->forward(ids, *d.tensor("attention_mask"), *d.tensor("position_ids"));
  const int64_t T = ids.size(1), R = responses.size(1);
  at::Tensor z = logits.slice(1, T - R - 1, T - 1).to(at::kDouble);
  return (z - z.logsumexp(-1, true)).gather(-1, responses.unsqueeze(-1)).squeeze(-1);
}

// Trains `w` for `steps` updates on a batch whose advantages push the policy somewhere.
void train(ActorRolloutRefWorker& w, int steps) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 31, kVocab);
  for (int s = 0; s < steps; ++s) {
    auto lp = w.compute_log_prob(batch);
    ASSERT_TRUE(lp.ok()) << lp.status().to_string();
    ASSERT_TRUE(batch.set_tensor("old_log_probs", *lp->tensor("old_log_probs")).ok());
    batch.meta_info()["temperature"] = 1.0;
    auto out = w.update_actor(batch);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
  }
}

TEST(LoraActor, TheReferenceIsTheBaseModelAndOnlyTheAdaptersTrain) {
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout_ref", lora_config());
  EXPECT_EQ(w->ref_module(), nullptr);  // no second model: the actor without its adapters
  ASSERT_TRUE(models::has_lora(w->actor_module()->model()));
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 23, kVocab);
  const at::Tensor want = base_log_probs(batch);
  auto ref = w->compute_ref_log_prob(batch);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_LE(max_diff(*ref->tensor("ref_log_prob"), want), 1e-5);
  EXPECT_TRUE(ref->meta_info().at("metrics").contains("timing_s/compute_ref_log_prob"));
  auto before = w->compute_log_prob(batch);  // B = 0: the adapted actor starts as the base
  ASSERT_TRUE(before.ok());
  EXPECT_LE(max_diff(*before->tensor("old_log_probs"), want), 1e-5);
  auto initial = w->actor_module()->engine().full_state_dict(at::kFloat);
  ASSERT_TRUE(initial.ok());

  train(*w, 2);
  auto after = w->compute_log_prob(batch);
  ASSERT_TRUE(after.ok());
  EXPECT_GT(max_diff(*after->tensor("old_log_probs"), want), 1e-3);
  ref = w->compute_ref_log_prob(batch);
  ASSERT_TRUE(ref.ok());
  EXPECT_LE(max_diff(*ref->tensor("ref_log_prob"), want), 1e-5);  // still the base model
  auto trained = w->actor_module()->engine().full_state_dict(at::kFloat);
  ASSERT_TRUE(trained.ok());
  int adapters = 0;
  for (const auto& [name, t] : *initial) {
    if (models::is_lora_parameter(name)) {
      adapters += name.find(".lora_B.") != std::string::npos;
      if (name.find(".lora_B.") != std::string::npos) {
        EXPECT_GT(trained->at(name).abs().max().item<double>(), 0) << name;
      }
    } else {
      EXPECT_TRUE(at::equal(trained->at(name), t)) << name << " changed";
    }
  }
  EXPECT_EQ(adapters, 2 * 7);
  // verl's is_lora flag on an actor without adapters is an error, not the trained policy.
  auto plain = make_worker(context(0, 1, next_port()), "actor", arr_config());
  proto::DataProto flagged = batch;
  flagged.meta_info()["is_lora"] = true;
  auto refused = plain->compute_log_prob(flagged);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("lora_rank = 0"), std::string::npos) << refused.status().message();
}

// use_remove_padding (packed micro-batches) with adapters: the same training, log-probs and
// reference as the padded path.
TEST(LoraActor, PaddingFreeEqualsPadded) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 29, kVocab);
  at::Tensor mask = batch.tensor("response_mask")->to(at::kBool);
  std::vector<at::Tensor> old, ref;
  for (bool packed : {false, true}) {
    json c = lora_config();
    c["model"]["use_remove_padding"] = packed;
    auto w = make_worker(context(0, 1, next_port()), "actor_rollout_ref", c);
    train(*w, 2);
    auto lp = w->compute_log_prob(batch);
    auto r = w->compute_ref_log_prob(batch);
    ASSERT_TRUE(lp.ok() && r.ok());
    old.push_back(lp->tensor("old_log_probs")->masked_select(mask));
    ref.push_back(r->tensor("ref_log_prob")->masked_select(mask));
  }
  EXPECT_LE(max_diff(old[1], old[0]), 1e-4);
  EXPECT_LE(max_diff(ref[1], ref[0]), 1e-5);
  EXPECT_GT(max_diff(old[0], ref[0]), 1e-3);  // trained away from the reference
}

TEST(LoraActor, TheRolloutServesTheAdaptedPolicyFromMergedWeights) {
  json c = lora_config();
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout", c);
  train(*w, 2);
  proto::DataProto prompts = make_prompts({3, 8, 5, 6}, 8, 51, kVocab);
  auto out = w->generate_sequences(prompts);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  // The engine's log-probs of its own samples (merged weights) against the actor's recomputation
  // (base + adapters, the training forward).
  at::Tensor mask = out->tensor("attention_mask")->narrow(1, 8, 6).to(at::kFloat);
  at::Tensor rollout = *out->tensor("rollout_log_probs"), actor = *out->tensor("old_log_probs");
  EXPECT_LE(((rollout - actor) * mask).abs().max().item<double>(), 1e-4);
  // ... and they are not the base model's.
  EXPECT_GT(((actor - base_log_probs(*out)) * mask).abs().max().item<double>(), 1e-3);
  const rollout::ReshardStats st = w->sharding_manager()->last_reshard();
  EXPECT_EQ(st.handoff_copied_bytes, 0);
  // The shards themselves were not touched by the merge: the next recomputation is unchanged.
  auto again = w->compute_log_prob(*out);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(max_diff(*again->tensor("old_log_probs"), actor), 0.0);
}

// The merge with the shards cut over 2 ranks (fp32: as tight as one rank), with rollout TP 2 (each
// rank merges its slices), and in bf16 (the rollout's merged bf16 weights against the actor's
// bf16 base plus adapters: within bf16 rounding); the adapter a 2-rank actor saves is its
// gathered state.
TEST(LoraActor, TwoRanksAndBf16ServeTheAdaptedPolicy) {
  struct Variant {
    int world;
    bool bf16;
    double tolerance;
    int64_t tp = 1;
    bool no_shard = false;  // K == 1: every rank holds whole units
  };
  for (const Variant v : {Variant{2, false, 1e-4}, Variant{1, true, 0.1}, Variant{2, false, 1e-4, 2},
                          Variant{2, false, 1e-4, 2, true}, Variant{2, true, 0.1, 2}}) {
    SCOPED_TRACE(::testing::Message() << "world " << v.world << (v.bf16 ? " bf16" : " fp32") << " tp " << v.tp
                                      << (v.no_shard ? " NO_SHARD" : ""));
    json c = lora_config();
    if (v.no_shard) c["actor"]["fsdp_config"]["sharding_strategy"] = "NO_SHARD";
    if (v.bf16) {
      c["actor"]["fsdp_config"]["mixed_precision"]["param_dtype"] = "bf16";
      c["rollout"]["dtype"] = "bfloat16";
    }
    c["rollout"]["tensor_model_parallel_size"] = v.tp;
    const uint16_t port = next_port();
    char tmpl[] = "/tmp/tessera_lora_ranks_XXXXXX";
    const std::string root = mkdtemp(tmpl);
    proto::DataProto prompts = make_prompts({3, 8, 5, 6}, 8, 52, kVocab);
    auto halves = prompts.chunk(v.world);
    ASSERT_TRUE(halves.ok());
    run_ranks(v.world, [&](int r) {
      auto w = make_worker(context(r, v.world, port), "actor_rollout", c);
      train(*w, 2);
      auto out = w->generate_sequences((*halves)[static_cast<size_t>(r)]);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      at::Tensor mask = out->tensor("attention_mask")->narrow(1, 8, 6).to(at::kFloat);
      at::Tensor diff = (*out->tensor("rollout_log_probs") - *out->tensor("old_log_probs")) * mask;
      EXPECT_LE(diff.abs().max().item<double>(), v.tolerance);
      EXPECT_EQ(w->sharding_manager()->last_reshard().handoff_copied_bytes, 0);
      // The merge left the shards alone: the actor recomputes the same log-probs.
      auto again = w->compute_log_prob(*out);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(max_diff(*again->tensor("old_log_probs"), *out->tensor("old_log_probs")), 0.0);
      ASSERT_TRUE(w->save_checkpoint({root + "/ckpt", std::nullopt, 2, std::nullopt}).ok());
      auto state = w->actor_module()->engine().full_state_dict(at::kFloat);
      ASSERT_TRUE(state.ok());
      if (r != 0) return;
      auto file = models::read_safetensors(root + "/ckpt/lora_adapter/adapter_model.safetensors");
      ASSERT_TRUE(file.ok()) << file.status().to_string();
      for (const auto& [name, t] : *state) {
        if (models::is_lora_parameter(name)) {
          EXPECT_TRUE(at::equal(file->tensors.at("base_model.model." + name), t)) << name;
        }
      }
    });
    std::filesystem::remove_all(root);
  }
}

TEST(LoraActor, CheckpointsHoldAPeftAdapterAndAMergedHfModel) {
  char tmpl[] = "/tmp/tessera_lora_ckpt_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  json c = lora_config(4, 16);
  c["actor"]["checkpoint"] = {{"save_contents", {"model", "optimizer", "extra", "hf_model"}}};
  auto w = make_worker(context(0, 1, next_port()), "actor", c);
  train(*w, 2);
  const std::string dir = root + "/global_step_2";
  ASSERT_TRUE(w->save_checkpoint({dir, std::nullopt, 2, std::nullopt}).ok());
  // PEFT's adapter_config.json and adapter_model.safetensors.
  std::ifstream in(dir + "/lora_adapter/adapter_config.json");
  json adapter = json::parse(in);
  EXPECT_EQ(adapter["r"], 4);
  EXPECT_EQ(adapter["lora_alpha"], 16.0);
  EXPECT_EQ(adapter["peft_type"], "LORA");
  EXPECT_EQ(adapter["target_modules"].size(), 2u * 7u);
  EXPECT_EQ(adapter["target_modules"][0], "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(adapter["base_model_name_or_path"], tiny_model_dir());
  auto file = models::read_safetensors(dir + "/lora_adapter/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto state = w->actor_module()->engine().full_state_dict(at::kFloat);
  ASSERT_TRUE(state.ok());
  int keys = 0;
  for (const auto& [name, t] : state.value()) {
    if (!models::is_lora_parameter(name)) continue;
    ++keys;
    auto it = file->tensors.find("base_model.model." + name);
    ASSERT_NE(it, file->tensors.end()) << name;
    EXPECT_TRUE(at::equal(it->second, t)) << name;
  }
  EXPECT_EQ(static_cast<int64_t>(file->tensors.size()), keys);
  // The HF model has the adapters merged: a plain model of it gives the adapted log-probs.
  proto::DataProto batch = make_rollout({3, 5, 2}, {4, 2, 6}, 5, 6, 61, kVocab);
  auto adapted = w->compute_log_prob(batch);
  ASSERT_TRUE(adapted.ok());
  models::LoadOptions load;
  load.dtype = at::kFloat;
  auto merged = models::load_causal_lm(dir + "/huggingface", load);
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_FALSE(models::has_lora(**merged));
  {
    torch::NoGradGuard g;
    at::Tensor ids = *batch.tensor("input_ids"), responses = *batch.tensor("responses");
    at::Tensor z = (*merged)->forward(ids, *batch.tensor("attention_mask"), *batch.tensor("position_ids"))
                       .slice(1, ids.size(1) - 7, ids.size(1) - 1)
                       .to(at::kDouble);
    at::Tensor lp = (z - z.logsumexp(-1, true)).gather(-1, responses.unsqueeze(-1)).squeeze(-1);
    EXPECT_LE(max_diff(lp, *adapted->tensor("old_log_probs")), 1e-4);
  }
  // Round trip into a fresh adapted actor.
  auto fresh = make_worker(context(0, 1, next_port()), "actor", lora_config(4, 16));
  ASSERT_TRUE(fresh->load_checkpoint({dir, std::nullopt, false}).ok());
  auto loaded = fresh->compute_log_prob(batch);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(max_diff(*loaded->tensor("old_log_probs"), *adapted->tensor("old_log_probs")), 0.0);
  // A plain actor cannot load it (its units differ), and says so.
  auto plain = make_worker(context(0, 1, next_port()), "actor", arr_config());
  EXPECT_FALSE(plain->load_checkpoint({dir, std::nullopt, false}).ok());
  std::filesystem::remove_all(root);
}

// PEFT itself ($TESSERA_PYTHON with transformers and peft, as deploy/dev.sh installs them) loads
// the saved adapter over the base model file: its log-probs of a batch are the trained actor's.
constexpr const char* kPeftScript = R"PY(
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base, adapter, batch_path, out_path = sys.argv[1:5]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
model.eval()
b = {k: torch.tensor(v) for k, v in json.load(open(batch_path)).items()}
with torch.no_grad():
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
T, R = b["input_ids"].shape[1], b["responses"].shape[1]
z = logits[:, T - R - 1:T - 1].double()
lp = torch.log_softmax(z, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
json.dump(lp.tolist(), open(out_path, "w"))
)PY";

TEST(LoraActor, PeftLoadsTheSavedAdapterAndComputesTheActorsLogProbs) {
  const char* env = std::getenv("TESSERA_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  if (std::system((python + " -c 'import torch, transformers, peft' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import torch, transformers and peft (deploy/dev.sh installs them)";
  }
  char tmpl[] = "/tmp/tessera_lora_peft_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  auto w = make_worker(context(0, 1, next_port()), "actor", lora_config(4, 16));
  train(*w, 3);
  ASSERT_TRUE(w->save_checkpoint({root + "/ckpt", std::nullopt, 3, std::nullopt}).ok());
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 71, kVocab);
  auto adapted = w->compute_log_prob(batch);
  ASSERT_TRUE(adapted.ok());
  json b;
  for (const char* key : {"input_ids", "attention_mask", "position_ids", "responses"}) {
    at::Tensor t = batch.tensor(key)->to(at::kLong).contiguous();
    std::vector<std::vector<int64_t>> rows;
    for (int64_t i = 0; i < t.size(0); ++i) rows.emplace_back(t[i].data_ptr<int64_t>(), t[i].data_ptr<int64_t>() + t.size(1));
    b[key] = rows;
  }
  std::ofstream(root + "/batch.json") << b.dump();
  std::ofstream(root + "/load_adapter.py") << kPeftScript;
  const std::string cmd = python + " " + root + "/load_adapter.py " + tiny_model_dir() + " " + root + "/ckpt/lora_adapter " +
                          root + "/batch.json " + root + "/out.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(root + "/out.json");
  const json got = json::parse(in);
  at::Tensor peft = at::zeros({4, 6}, at::kDouble);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) peft[i][j] = got[i][j].get<double>();
  }
  at::Tensor mask = batch.tensor("response_mask")->to(at::kDouble);
  at::Tensor mine = adapted->tensor("old_log_probs")->to(at::kDouble);
  EXPECT_LE(((peft - mine) * mask).abs().max().item<double>(), 1e-4);
  // Not the base model's: PEFT applied the trained adapters.
  EXPECT_GT(((peft - base_log_probs(batch)) * mask).abs().max().item<double>(), 1e-3);
  std::filesystem::remove_all(root);
}

// With a bf16 compute dtype (and a bf16 rollout), the frozen base is kept in bf16 and the adapters
// in fp32 (FsdpOptions::frozen_units_in_param_dtype, wired through the worker), and the HF export
// is the exact fp32 merge of that base and the saved adapter.
TEST(LoraActor, ABf16BaseExportsTheExactFp32Merge) {
  char tmpl[] = "/tmp/tessera_lora_bf16_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  json c = lora_config(4, 8);
  c["actor"]["fsdp_config"]["mixed_precision"]["param_dtype"] = "bf16";
  c["rollout"]["dtype"] = "bfloat16";
  c["actor"]["checkpoint"] = {{"save_contents", {"model", "optimizer", "extra", "hf_model"}}};
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout", c);
  fsdp::FsdpModule& e = w->actor_module()->engine();
  for (size_t u = 0; u < e.layouts().size(); ++u) {
    EXPECT_EQ(e.shard(static_cast<int>(u)).scalar_type(), fsdp::is_adapter_unit(e.layouts()[u]) ? at::kFloat : at::kBFloat16)
        << e.layouts()[u].unit;
  }
  train(*w, 2);
  ASSERT_TRUE(w->save_checkpoint({root + "/ckpt", std::nullopt, 2, std::nullopt}).ok());
  auto adapter = models::read_safetensors(root + "/ckpt/lora_adapter/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok()) << adapter.status().to_string();
  auto exported = models::read_safetensors_checkpoint(root + "/ckpt/huggingface");
  ASSERT_TRUE(exported.ok()) << exported.status().to_string();
  auto base = models::load_causal_lm(tiny_model_dir());
  ASSERT_TRUE(base.ok());
  for (const char* module : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"}) {
    const std::string prefix = std::string("base_model.model.") + module;
    const at::Tensor w_bf16 = (*base)->parameter_map().at(std::string(module) + ".weight").to(at::kBFloat16);
    const at::Tensor want = w_bf16.to(at::kFloat) + at::matmul(adapter->tensors.at(prefix + ".lora_B.weight"),
                                                              adapter->tensors.at(prefix + ".lora_A.weight")) * 2.0;
    const at::Tensor& got = exported->at(std::string(module) + ".weight");
    EXPECT_EQ(got.scalar_type(), at::kFloat) << module;
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-6) << module;
  }
  EXPECT_EQ(exported->at("model.embed_tokens.weight").scalar_type(), at::kFloat);
  std::filesystem::remove_all(root);
}

std::string init_error(const runtime::WorkerContext& ctx, const std::string& role, const json& config) {
  auto w = ActorRolloutRefWorker::create(ctx, json{{"role", role}, {"config", config}, {"seed", 3},
                                                   {"comm_backend", "inproc"}});
  if (!w.ok()) return w.status().message();
  Status st = (*w)->init_model();
  return st.ok() ? std::string() : st.message();
}

TEST(LoraActor, WhatTesseraDoesNotServeIsRefusedNamingTheKeys) {
  json bad = lora_config();
  bad["model"]["target_modules"] = json::array({"lm_head"});
  const std::string head = init_error(context(0, 1, next_port()), "actor", bad);
  EXPECT_NE(head.find("actor_rollout_ref.model.target_modules"), std::string::npos) << head;

  // The critic takes LoRA too (trainer_run_test.cpp trains one); a target it lacks is named.
  json critic = {{"model", {{"path", tiny_model_dir()}, {"fsdp_config", fp32_fsdp()}, {"lora_rank", 8},
                            {"target_modules", json::array({"lm_head"})}}},
                 {"optim", {{"lr", 5e-3}}},
                 {"rollout_n", 1},
                 {"ppo_mini_batch_size", 4},
                 {"ppo_micro_batch_size_per_gpu", 2}};
  auto cw = CriticWorker::create(context(0, 1, next_port()), json{{"config", critic}, {"seed", 3}, {"comm_backend", "inproc"}});
  ASSERT_TRUE(cw.ok()) << cw.status().to_string();
  Status st = (*cw)->init_model();
  EXPECT_NE(st.message().find("critic.model.target_modules"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera::workers
