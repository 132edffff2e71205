// LoRA adapters (Note [LoRA adapters]): the adapted model against the base model with merged
// weights W + B A * alpha / r (an independent formulation: one linear per layer, the maths of
// PEFT's merge), in values and gradients; PEFT's initialisation; target_modules / exclude_modules
// as PEFT selects them, and the refusals.
#include <map>
#include <set>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/lora.hpp"

namespace tessera::models {
namespace {

using json = nlohmann::json;

std::shared_ptr<CausalLM> tiny_model(const std::string& type = "qwen2", uint64_t seed = 7) {
  ModelInit init;
  init.seed = seed;
  auto m = CausalLM::create(testing::tiny_config(type), init);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return *m;
}

LoraConfig lora(const json& block) {
  auto c = lora_config_from_json(block, "actor_rollout_ref.model");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

std::string error_of(const json& block, const std::string& type = "qwen2") {
  auto c = lora_config_from_json(block, "actor_rollout_ref.model");
  if (!c.ok()) return c.status().message();
  auto m = tiny_model(type);
  Status st = apply_lora(*m, *c, "actor_rollout_ref.model");
  return st.ok() ? std::string() : st.message();
}

// B starts at zero; give it values so the adapters change the output.
void randomize_lora_b(CausalLM& m, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : m.named_parameters()) {
    if (item.key().find(".lora_B.") != std::string::npos) item.value().copy_(at::randn(item.value().sizes(), gen) * 0.1);
  }
}

TEST(Lora, AllLinearAdaptsEveryProjectionOfEveryLayerWithPeftInitialValues) {
  auto m = tiny_model();
  ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 4}, {"lora_alpha", 8}}), "m").ok());
  std::set<std::string> adapted;
  for (const auto& item : m->named_parameters()) {
    const std::string& name = item.key();
    if (!is_lora_parameter(name)) {
      EXPECT_FALSE(item.value().requires_grad()) << name;  // the base is frozen
      continue;
    }
    EXPECT_TRUE(item.value().requires_grad()) << name;
    adapted.insert(name.substr(0, name.rfind(".lora_")));
    if (name.find(".lora_B.") != std::string::npos) {
      EXPECT_EQ(item.value().abs().max().item<double>(), 0.0) << name;
    } else {  // kaiming_uniform_(a = sqrt(5)): uniform(-1/sqrt(in), 1/sqrt(in))
      const double bound = 1.0 / std::sqrt(static_cast<double>(item.value().size(1)));
      EXPECT_EQ(item.value().size(0), 4);
      EXPECT_LE(item.value().abs().max().item<double>(), bound) << name;
      EXPECT_GT(item.value().abs().max().item<double>(), 0.5 * bound) << name;
    }
  }
  EXPECT_EQ(adapted.size(), 2u * 7u);
  EXPECT_TRUE(adapted.count("model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(adapted.count("model.layers.0.self_attn.k_proj"));
  EXPECT_TRUE(has_lora(*m));
  // A fixed seed: the same adapters every time.
  auto again = tiny_model();
  ASSERT_TRUE(apply_lora(*again, lora({{"lora_rank", 4}, {"lora_alpha", 8}}), "m").ok());
  EXPECT_TRUE(at::equal(again->parameter_map().at("model.layers.0.self_attn.q_proj.lora_A.weight"),
                        m->parameter_map().at("model.layers.0.self_attn.q_proj.lora_A.weight")));
}

// On a MoE model (transformers 5's layout, which PEFT sees): the attention projections, and
// Qwen2-MoE's shared expert with its gate, are linear layers and adapted; the stacked experts and
// the router are parameters and stay frozen. Naming only the expert projections matches nothing
// on Qwen3-MoE and is refused as PEFT refuses it.
TEST(Lora, MoeModelsAdaptTheirLinearLayersOnly) {
  std::map<std::string, std::set<std::string>> adapted;
  for (const std::string type : {"qwen3_moe", "qwen2_moe"}) {
    auto m = tiny_model(type);
    ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 2}, {"lora_alpha", 4}}), "m").ok());
    for (const auto& item : m->named_parameters()) {
      const std::string& name = item.key();
      if (is_lora_parameter(name)) adapted[type].insert(name.substr(0, name.rfind(".lora_")));
      if (name.find(".mlp.experts.") != std::string::npos || name.find(".mlp.gate.") != std::string::npos) {
        EXPECT_FALSE(item.value().requires_grad()) << name;
      }
    }
  }
  const std::string l0 = "model.layers.0.";
  EXPECT_EQ(adapted["qwen3_moe"], (std::set<std::string>{l0 + "self_attn.q_proj", l0 + "self_attn.k_proj",
                                                          l0 + "self_attn.v_proj", l0 + "self_attn.o_proj",
                                                          "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                                                          "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.o_proj"}));
  EXPECT_EQ(adapted["qwen2_moe"].count(l0 + "mlp.shared_expert.down_proj"), 1u);
  EXPECT_EQ(adapted["qwen2_moe"].count(l0 + "mlp.shared_expert_gate"), 1u);
  EXPECT_NE(error_of({{"lora_rank", 2}, {"target_modules", {"gate_proj", "up_proj"}}}, "qwen3_moe"), "");
}

// A value model (verl's critic, which it wraps as a CAUSAL_LM task): all-linear adapts the score
// head too, as PEFT does on a TokenClassification model (it has no output embeddings to leave out).
TEST(Lora, AllLinearOnAValueModelAdaptsTheScoreHead) {
  auto critic = ValueModel::create(testing::tiny_config("qwen2"), ModelInit{at::kFloat, 3});
  ASSERT_TRUE(critic.ok());
  ASSERT_TRUE(apply_lora(**critic, lora({{"lora_rank", 2}}), "critic.model").ok());
  const TensorMap params = (*critic)->parameter_map();
  EXPECT_EQ(params.count("score.lora_A.weight"), 1u);
  EXPECT_EQ(params.at("score.lora_B.weight").size(0), 1);
  EXPECT_FALSE(params.at("score.weight").requires_grad());
  auto lm = tiny_model();
  ASSERT_TRUE(apply_lora(*lm, lora({{"lora_rank", 2}}), "m").ok());
  EXPECT_EQ(lm->parameter_map().count("lm_head.lora_A.weight"), 0u);
}

TEST(Lora, AdaptedModelEqualsTheMergedModelInValuesAndGradients) {
  for (const std::string type : {"qwen2", "llama", "gemma2", "gemma3_text", "qwen2_moe"}) {
    SCOPED_TRACE(type);
    auto m = tiny_model(type);
    ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 3}, {"lora_alpha", 6}}), "m").ok());
    randomize_lora_b(*m, 5);
    auto b = testing::left_padded_batch({6, 4}, 6, 64, 3);
    // B = 0 at start would hide A's gradient; randomized above. Untouched model: base + adapters.
    at::Tensor logits = m->forward(b.input_ids, b.attention_mask, b.position_ids);
    at::Tensor loss = logits.pow(2).mean();
    loss.backward();

    // The independent formulation: W' = W + B A * s with A and B leaves, one linear per layer.
    auto base = tiny_model(type);
    TensorMap adapters;
    for (const auto& [name, t] : m->parameter_map()) {
      if (is_lora_parameter(name)) adapters[name] = t.detach().clone().requires_grad_(true);
    }
    for (const auto& [name, a] : adapters) {
      if (name.find(".lora_A.") == std::string::npos) continue;
      const std::string module = name.substr(0, name.rfind(".lora_A."));
      const at::Tensor& bw = adapters.at(module + ".lora_B.weight");
      at::Tensor w = base->parameter_map().at(module + ".weight").detach();
      base->named_parameters()[module + ".weight"].set_data(w + at::matmul(bw, a).detach() * 2.0);
    }
    // Values.
    at::Tensor merged_logits = base->forward(b.input_ids, b.attention_mask, b.position_ids);
    EXPECT_LE(testing::masked_max_diff(logits, merged_logits, b.attention_mask), 2e-5);
    // merge_lora_weights gives the same merged weights.
    auto merged = merge_lora_weights(m->parameter_map(), 2.0, /*in_place=*/false);
    ASSERT_TRUE(merged.ok()) << merged.status().to_string();
    for (const auto& [name, t] : base->parameter_map()) {
      ASSERT_TRUE(merged->count(name)) << name;
      EXPECT_LE((merged->at(name) - t).abs().max().item<double>(), 1e-6) << name;
    }
    EXPECT_EQ(merged->size(), base->parameter_map().size());
    // Gradients: through W' = W + B A s, by the chain rule dA = s B^T dW', dB = s dW' A^T.
    for (auto& p : base->parameters()) p.set_requires_grad(true);
    base->zero_grad();
    base->forward(b.input_ids, b.attention_mask, b.position_ids).pow(2).mean().backward();
    double worst = 0;
    for (const auto& [name, a] : adapters) {
      if (name.find(".lora_A.") == std::string::npos) continue;
      const std::string module = name.substr(0, name.rfind(".lora_A."));
      at::Tensor dw = base->named_parameters()[module + ".weight"].grad();
      at::Tensor bw = adapters.at(module + ".lora_B.weight");
      at::Tensor want_da = at::matmul(bw.t(), dw) * 2.0, want_db = at::matmul(dw, a.t()) * 2.0;
      at::Tensor got_da = m->named_parameters()[module + ".lora_A.weight"].grad();
      at::Tensor got_db = m->named_parameters()[module + ".lora_B.weight"].grad();
      ASSERT_TRUE(got_da.defined() && got_db.defined()) << module;
      worst = std::max(worst, (got_da - want_da).abs().max().item<double>() / (want_da.abs().max().item<double>() + 1e-12));
      worst = std::max(worst, (got_db - want_db).abs().max().item<double>() / (want_db.abs().max().item<double>() + 1e-12));
    }
    EXPECT_LE(worst, 1e-4);
    // Base parameters get no gradient.
    EXPECT_FALSE(m->named_parameters()["model.layers.0.self_attn.q_proj.weight"].grad().defined());
  }
}

TEST(Lora, DisabledAdaptersGiveTheBaseModelAndFreshAdaptersChangeNothing) {
  auto base = tiny_model();
  auto m = tiny_model();
  auto b = testing::left_padded_batch({5, 3}, 5, 64, 9);
  at::Tensor want = base->forward(b.input_ids, b.attention_mask, b.position_ids);
  ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 2}}), "m").ok());
  EXPECT_TRUE(at::equal(m->forward(b.input_ids, b.attention_mask, b.position_ids), want));  // B = 0
  randomize_lora_b(*m, 1);
  EXPECT_GT((m->forward(b.input_ids, b.attention_mask, b.position_ids) - want).abs().max().item<double>(), 1e-4);
  set_lora_enabled(*m, false);
  EXPECT_TRUE(at::equal(m->forward(b.input_ids, b.attention_mask, b.position_ids), want));
  set_lora_enabled(*m, true);
  EXPECT_FALSE(at::equal(m->forward(b.input_ids, b.attention_mask, b.position_ids), want));
}

TEST(Lora, TargetAndExcludeModulesSelectAsPeftDoes) {
  auto targets = [](const json& block) {
    auto m = tiny_model();
    auto t = lora_target_modules(*m, lora(block), "m");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? *t : std::vector<std::string>{};
  };
  // A list: a name or a "."-suffix.
  auto listed = targets({{"lora_rank", 2}, {"target_modules", {"q_proj", "mlp.up_proj"}}});
  EXPECT_EQ(listed, (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj",
                                              "model.layers.1.self_attn.q_proj", "model.layers.1.mlp.up_proj"}));
  // "proj" is no module's last component: a list entry never matches part of a name.
  EXPECT_NE(error_of({{"lora_rank", 2}, {"target_modules", {"proj"}}}).find("matches no linear layer"),
            std::string::npos);
  // A string is a regular expression over the whole name.
  auto regex = targets({{"lora_rank", 2}, {"target_modules", R"(.*\.1\.self_attn\.(k|v)_proj)"}});
  EXPECT_EQ(regex, (std::vector<std::string>{"model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"}));
  // Exclusions.
  auto excluded = targets({{"lora_rank", 2}, {"exclude_modules", {"mlp.down_proj", "o_proj"}}});
  EXPECT_EQ(excluded.size(), 2u * 5u);
  for (const auto& t : excluded) EXPECT_TRUE(t.find("down_proj") == std::string::npos && t.find("o_proj") == std::string::npos) << t;
  auto excluded_regex = targets({{"lora_rank", 2}, {"exclude_modules", R"(model\.layers\.0\..*)"}});
  EXPECT_EQ(excluded_regex.size(), 7u);
  // The recorded adapter config lists the whole names, so PEFT adapts exactly these on reload.
  json cfg = peft_adapter_config(lora({{"lora_rank", 2}, {"lora_alpha", 4}}), regex, "/models/q");
  EXPECT_EQ(cfg["target_modules"], json({"model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"}));
  EXPECT_EQ(cfg["r"], 2);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["base_model_name_or_path"], "/models/q");
}

TEST(Lora, BadKeysAndUnsupportedTargetsAreOneLineNamingTheKey) {
  EXPECT_NE(error_of({{"lora_rank", -1}}).find("actor_rollout_ref.model.lora_rank"), std::string::npos);
  EXPECT_NE(error_of({{"lora_rank", "8"}}).find("actor_rollout_ref.model.lora_rank"), std::string::npos);
  EXPECT_NE(error_of({{"lora_rank", 8}, {"lora_alpha", 0}}).find("lora_alpha"), std::string::npos);
  EXPECT_NE(error_of({{"lora_rank", 8}, {"target_modules", 3}}).find("target_modules"), std::string::npos);
  EXPECT_NE(error_of({{"lora_rank", 8}, {"target_modules", "(("}}).find("regular expression"), std::string::npos);
  EXPECT_NE(error_of({{"lora_rank", 8}, {"target_modules", json::array()}}).find("target_modules is empty"),
            std::string::npos);
  std::string head = error_of({{"lora_rank", 8}, {"target_modules", {"q_proj", "lm_head"}}});
  EXPECT_NE(head.find("'lm_head'"), std::string::npos) << head;
  EXPECT_NE(head.find("leave it out of the targets"), std::string::npos) << head;
  std::string norm = error_of({{"lora_rank", 8}, {"target_modules", {"input_layernorm"}}});
  EXPECT_NE(norm.find("not a linear layer"), std::string::npos) << norm;
  // A container is refused too (PEFT: "Target module Qwen2MLP(...) is not supported"), not
  // silently dropped beside a linear target.
  std::string mlp = error_of({{"lora_rank", 8}, {"target_modules", {"q_proj", "mlp"}}});
  EXPECT_NE(mlp.find("'model.layers.0.mlp', which is not a linear layer"), std::string::npos) << mlp;
  // PEFT reads "all-linear" in any case.
  auto upper = tiny_model();
  ASSERT_TRUE(apply_lora(*upper, lora({{"lora_rank", 2}, {"target_modules", "ALL-LINEAR"}}), "m").ok());
  EXPECT_TRUE(has_lora(*upper));
  // Rank 0: nothing is added.
  auto m = tiny_model();
  ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 0}}), "m").ok());
  EXPECT_FALSE(has_lora(*m));
  // Twice: refused.
  ASSERT_TRUE(apply_lora(*m, lora({{"lora_rank", 2}}), "m").ok());
  EXPECT_FALSE(apply_lora(*m, lora({{"lora_rank", 2}}), "m").ok());
}

// Rollout tensor parallelism merges slices: the product of sliced factors (rows of B for a
// row-cut weight, columns of A for a column-cut one) is the slice of the full merge.
TEST(Lora, MergingSlicedFactorsGivesTheSliceOfTheFullMerge) {
  at::Generator gen = at::detail::createCPUGenerator(2);
  const at::Tensor w = at::randn({6, 8}, gen), a = at::randn({3, 8}, gen), b = at::randn({6, 3}, gen);
  auto full = merge_lora_weights({{"l.weight", w}, {"l.lora_A.weight", a}, {"l.lora_B.weight", b}}, 0.5, false);
  ASSERT_TRUE(full.ok());
  for (int64_t rank = 0; rank < 2; ++rank) {
    for (int64_t dim : {0, 1}) {
      const at::Tensor part = w.narrow(dim, rank * w.size(dim) / 2, w.size(dim) / 2).clone();
      auto sliced = merge_lora_weights({{"l.weight", part}, {"l.lora_A.weight", a}, {"l.lora_B.weight", b}}, 0.5, false,
                                       [&](const std::string& name, const at::Tensor& fa, const at::Tensor& fb) {
                                         EXPECT_EQ(name, "l.weight");
                                         if (dim == 0) return std::make_pair(fa, fb.narrow(0, rank * 3, 3));
                                         return std::make_pair(fa.narrow(1, rank * 4, 4), fb);
                                       });
      ASSERT_TRUE(sliced.ok()) << sliced.status().to_string();
      const at::Tensor want = full->at("l.weight").narrow(dim, rank * w.size(dim) / 2, w.size(dim) / 2);
      EXPECT_LE((sliced->at("l.weight") - want).abs().max().item<double>(), 1e-6) << "dim " << dim << " rank " << rank;
    }
  }
  // A slicer that disagrees with the weight's shape is an error, not a broadcast.
  auto bad = merge_lora_weights({{"l.weight", w.narrow(0, 0, 3)}, {"l.lora_A.weight", a}, {"l.lora_B.weight", b}}, 0.5,
                                false, [](const std::string&, const at::Tensor& fa, const at::Tensor& fb) {
                                  return std::make_pair(fa, fb);
                                });
  EXPECT_FALSE(bad.ok());
}

TEST(Lora, MergeRefusesAnIncompleteAdapter) {
  TensorMap params{{"l.weight", at::zeros({4, 3})}, {"l.lora_A.weight", at::zeros({2, 3})}};
  auto merged = merge_lora_weights(params, 1.0, false);
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("lora_B"), std::string::npos);
  params["l.lora_B.weight"] = at::ones({4, 2});
  params["l.lora_A.weight"] = at::ones({2, 3});
  merged = merge_lora_weights(params, 0.5, /*in_place=*/true);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->size(), 1u);
  EXPECT_TRUE(at::allclose(params.at("l.weight"), at::ones({4, 3})));  // 0 + (B A = 2) * 0.5, in place
}

}  // namespace
}  // namespace tessera::models
