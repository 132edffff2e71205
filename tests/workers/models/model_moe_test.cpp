// Qwen3-MoE / Qwen2-MoE: config.json as transformers and the released checkpoints write it, the
// sparse block against a per-token formulation written independently here (values and gradients,
// including a weight that sits at an unaligned offset of a larger buffer, as an FSDP flat view
// may), and checkpoints: written per expert as released models are, read back from that form and
// from transformers 5's fused experts.gate_up_proj, with one-line errors for a missing or extra
// expert. Logits against transformers itself are in model_hf_parity_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/init_model.hpp"
#include "workers/models/model_io.hpp"
#include "workers/models/param_count.hpp"

namespace tessera::models {
namespace {

using nlohmann::json;

json qwen3_moe_json() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_local_experts", 8},
          {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 16},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 2},
          {"mlp_only_layers", {3}},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.001}};
}

TEST(MoeConfig, ReadsTheFieldsTransformersAndReleasesWrite) {
  auto c = parse_model_config(qwen3_moe_json(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->moe.num_experts, 8);  // transformers 5's num_local_experts
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->head_dim, 8);  // hidden / heads: Qwen3-MoE has no head_dim default of its own
  EXPECT_TRUE(c->qk_norm());
  // (i + 1) % 2 == 0 and not in mlp_only_layers: only layer 1 is sparse.
  EXPECT_FALSE(c->layer_is_sparse(0));
  EXPECT_TRUE(c->layer_is_sparse(1));
  EXPECT_FALSE(c->layer_is_sparse(2));
  EXPECT_FALSE(c->layer_is_sparse(3));
  // The router loss keys do not change the logits (verl never passes labels): kept as they are.
  EXPECT_EQ(c->extra.at("router_aux_loss_coef"), 0.001);
  // Written back with num_experts, which every transformers version reads; a round trip is exact.
  const json written = model_config_to_json(*c);
  EXPECT_EQ(written.at("num_experts"), 8);
  EXPECT_FALSE(written.contains("num_local_experts"));
  auto again = parse_model_config(written, "again");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_config_to_json(*again), written);

  json q2 = {{"model_type", "qwen2_moe"}, {"vocab_size", 64},       {"hidden_size", 32},
             {"intermediate_size", 48},   {"num_hidden_layers", 2}, {"num_attention_heads", 4},
             {"num_experts", 6},          {"moe_intermediate_size", 8}};
  auto q2c = parse_model_config(q2, "q2.json");
  ASSERT_TRUE(q2c.ok()) << q2c.status().to_string();
  EXPECT_TRUE(q2c->attention_bias);  // qkv_bias defaults to true
  EXPECT_FALSE(q2c->o_proj_bias());
  EXPECT_EQ(q2c->moe.num_experts_per_tok, 4);  // Qwen2MoeConfig's defaults
  EXPECT_EQ(q2c->moe.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(q2c->architecture, "Qwen2MoeForCausalLM");
  q2["qkv_bias"] = false;
  EXPECT_FALSE(parse_model_config(q2, "q2.json")->attention_bias);
  // Qwen2MoeConfig has no num_local_experts alias: the key is kept, num_experts stays.
  q2["num_local_experts"] = 3;
  auto aliased = parse_model_config(q2, "q2.json");
  ASSERT_TRUE(aliased.ok()) << aliased.status().to_string();
  EXPECT_EQ(aliased->moe.num_experts, 6);
  EXPECT_EQ(aliased->extra.at("num_local_experts"), 3);
}

// Qwen3-30B-A3B's config.json as released: 48 sparse layers of 128 experts, 8 per token; about
// 3.3B weights per token ("A3B") of 30.5B.
TEST(MoeConfig, ReadsQwen3_30B_A3B) {
  const json released = json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  auto c = parse_model_config(released, "Qwen3-30B-A3B/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->head_dim, 128);
  for (int64_t i = 0; i < 48; ++i) EXPECT_TRUE(c->layer_is_sparse(i)) << i;
  const double active = decoder_matmul_params(*c) + 2.0 * 151936 * 2048;
  EXPECT_GT(active, 3.2e9);
  EXPECT_LT(active, 3.5e9);
}

TEST(MoeConfig, RefusesWhatItCannotRunNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"num_experts", 4}}, "'num_experts' = 4 but num_local_experts = 8"},
      {{{"num_experts_per_tok", 9}}, "'num_experts_per_tok' = 9 must lie in [1, num_experts = 8]"},
      {{{"moe_intermediate_size", 12}}, "'moe_intermediate_size' = 12 must be a positive multiple of 8"},
      {{{"hidden_size", 36}, {"num_attention_heads", 2}, {"num_key_value_heads", 2}}, "'hidden_size' = 36 must be a multiple of 8"},
      {{{"mlp_only_layers", {4}}}, "'mlp_only_layers' holds 4, not a layer of 4"},
      {{{"decoder_sparse_step", 0}}, "'decoder_sparse_step' must be positive"},
  };
  for (const auto& [patch, want] : cases) {
    json j = qwen3_moe_json();
    for (const auto& [k, v] : patch.items()) j[k] = v;
    auto c = parse_model_config(j, "config.json");
    ASSERT_FALSE(c.ok()) << patch.dump();
    EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status().to_string();
    EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
  }
  json dense = {{"model_type", "qwen3"}, {"vocab_size", 64}, {"hidden_size", 32}, {"intermediate_size", 48},
                {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  ModelConfig c = *parse_model_config(dense, "q3");
  EXPECT_FALSE(c.layer_is_sparse(0));
}

// The sparse block, token by token: softmax over the router in fp32, the top k, renormalised or
// not, each chosen expert's SwiGLU from its own slices of the stacked weights, weighted and summed;
// Qwen2-MoE adds its gated shared expert.
at::Tensor per_token_reference(const SparseMoeBlock& b, const ModelConfig& c, const at::Tensor& x) {
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < flat.size(0); ++t) {
    const at::Tensor xt = flat[t];
    const at::Tensor probs = at::softmax(at::matmul(b.router, xt), 0, at::kFloat);
    auto [p, e] = at::topk(probs, c.moe.num_experts_per_tok);
    if (c.moe.norm_topk_prob) p = p / p.sum();
    at::Tensor y = at::zeros_like(xt);
    for (int64_t j = 0; j < e.size(0); ++j) {
      const int64_t k = e[j].item<int64_t>();
      const at::Tensor h = at::silu(at::matmul(b.gate_proj[k], xt)) * at::matmul(b.up_proj[k], xt);
      y = y + p[j] * at::matmul(b.down_proj[k], h);
    }
    if (b.shared_expert) {
      y = y + at::sigmoid(b.shared_expert_gate->forward(xt)) * b.shared_expert->forward(xt);
    }
    rows.push_back(y);
  }
  return at::stack(rows).view(x.sizes());
}

TEST(SparseMoeBlock, EqualsAPerTokenFormulationInValuesAndGradients) {
  for (const char* type : {"qwen3_moe", "qwen2_moe"}) {
    SCOPED_TRACE(type);
    ModelConfig c = testing::tiny_config(type);
    auto lm = CausalLM::create(c, ModelInit{at::kFloat, 5});
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    testing::randomise(**lm, 6);
    ASSERT_TRUE((*lm)->backbone().layers[0]->moe);
    EXPECT_FALSE((*lm)->backbone().layers[0]->mlp);
    SparseMoeBlock& block = *(*lm)->backbone().layers[0]->moe;
    // A weight at an odd offset of a larger buffer, as a view into an FSDP flat parameter may be.
    at::Tensor buffer = at::empty({block.up_proj.numel() + 1});
    buffer.narrow(0, 1, block.up_proj.numel()).copy_(block.up_proj.detach().reshape(-1));
    block.up_proj.set_data(buffer.narrow(0, 1, block.up_proj.numel()).view(block.up_proj.sizes()));

    at::Tensor x = at::randn({3, 5, c.hidden_size}, at::detail::createCPUGenerator(7)).requires_grad_(true);
    at::Tensor got = block.forward(x);
    at::Tensor g = at::randn(got.sizes(), at::detail::createCPUGenerator(8));
    std::vector<at::Tensor> params = block.parameters();
    params.push_back(x);
    const std::vector<at::Tensor> got_grads = torch::autograd::grad({(got * g).sum()}, params);
    at::Tensor want = per_token_reference(block, c, x);
    const std::vector<at::Tensor> want_grads = torch::autograd::grad({(want * g).sum()}, params);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-5);
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(got_grads[i].defined()) << i;
      EXPECT_LT((got_grads[i] - want_grads[i]).abs().max().item<double>(), 1e-5) << "parameter " << i;
    }
    // Every expert got some tokens (15 tokens x 2 choices over 4 experts), so all gradients show.
    EXPECT_GT(block.gate_proj.numel(), 0);
    EXPECT_TRUE(got_grads[1].abs().sum(/*dim=*/{1, 2}).gt(0).all().item<bool>());
  }
}

// On a GPU in bf16 (LibTorch's CUTLASS grouped GEMM on sm90/sm100, its fallback elsewhere) the
// block's output and every gradient match the CPU's fp32 within bf16 rounding: groups of a few
// rows each, at unaligned sorted offsets, so the weight-gradient GEMMs see the padded layout.
TEST(SparseMoeBlock, OnCudaBf16ValuesAndGradientsMatchTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  ModelConfig c = testing::tiny_config("qwen2_moe");
  auto cpu = CausalLM::create(c, ModelInit{at::kFloat, 5});
  ASSERT_TRUE(cpu.ok());
  testing::randomise(**cpu, 6);
  TensorMap bf16;
  for (const auto& [name, t] : (*cpu)->parameter_map()) bf16[name] = t.detach().to(at::Device("cuda:0"), at::kBFloat16);
  auto gpu = CausalLM::from_parameters(c, bf16);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  for (auto& p : (*gpu)->parameters()) p.set_requires_grad(true);
  const at::Tensor x = at::randn({3, 7, c.hidden_size}, at::detail::createCPUGenerator(7));
  const at::Tensor g = at::randn({3, 7, c.hidden_size}, at::detail::createCPUGenerator(8));
  std::vector<at::Tensor> grads[2];
  at::Tensor outs[2];
  for (int d = 0; d < 2; ++d) {
    SparseMoeBlock& block = *(d == 0 ? *cpu : *gpu)->backbone().layers[0]->moe;
    const at::Tensor xd = d == 0 ? x.clone() : x.to(at::Device("cuda:0"), at::kBFloat16);
    xd.requires_grad_(true);
    outs[d] = block.forward(xd);
    std::vector<at::Tensor> params = block.parameters();
    params.push_back(xd);
    for (const at::Tensor& t : torch::autograd::grad({(outs[d] * g.to(outs[d].options())).sum()}, params)) {
      grads[d].push_back(t.to(at::kCPU, at::kFloat));
    }
  }
  auto relative = [](const at::Tensor& got, const at::Tensor& want) {
    return (got - want).abs().max().item<double>() / (want.abs().max().item<double>() + 1e-12);
  };
  EXPECT_LT(relative(outs[1].to(at::kCPU, at::kFloat), outs[0].detach()), 3e-2);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_LT(relative(grads[1][i], grads[0][i]), 3e-2) << "gradient " << i;
}

// Expert groups start on multiples of 8 rows (the weight-gradient GEMMs' TMA alignment), an
// empty group is empty, the last group runs to the buffer's fixed end.
TEST(SparseMoeBlock, ExpertGroupsStartOnAlignedRowsInAFixedSizeBuffer) {
  const at::Tensor ids = at::tensor({0, 0, 0, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3}, at::kLong);
  const ExpertGroups g = group_rows_by_expert(ids, 5);
  EXPECT_EQ(g.capacity, 14 + 5 * 7);
  EXPECT_TRUE(at::equal(g.ends, at::tensor({8, 8, 16, 32, 49}, at::kInt))) << g.ends;
  EXPECT_TRUE(at::equal(g.destination, at::tensor({0, 1, 2, 8, 9, 16, 17, 18, 19, 20, 21, 22, 23, 24}, at::kLong)))
      << g.destination;
}

TEST(SparseMoeBlock, ActiveParametersCountTheChosenExpertsOnly) {
  ModelConfig c = testing::tiny_config("qwen2_moe");
  const double attention = 32.0 * (32 + 2 * 32) + 32.0 * 32;
  // router 4 x 32, two experts of 3 x 32 x 16, the shared expert 3 x 32 x 24 and its gate 32.
  EXPECT_DOUBLE_EQ(layer_matmul_params(c, 0), attention + 4 * 32 + 2 * 3 * 32 * 16 + 3 * 32 * 24 + 32);
  EXPECT_DOUBLE_EQ(decoder_matmul_params(c), 2 * layer_matmul_params(c, 0));
}

TEST(MoeCheckpoint, WritesPerExpertTensorsAndReadsThemBack) {
  testing::TempDir dir;
  auto lm = CausalLM::create(testing::tiny_config("qwen3_moe"), ModelInit{at::kFloat, 9});
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  ASSERT_TRUE(save_pretrained(**lm, dir.path()).ok());
  auto files = read_safetensors_checkpoint(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  // Released checkpoints' names, as transformers of every version reads them.
  ASSERT_EQ(files->count("model.layers.1.mlp.experts.3.down_proj.weight"), 1u);
  EXPECT_EQ(files->at("model.layers.1.mlp.experts.3.down_proj.weight").sizes(), at::IntArrayRef({32, 16}));
  EXPECT_EQ(files->count("model.layers.1.mlp.experts.down_proj"), 0u);
  EXPECT_EQ(files->count("model.layers.1.mlp.gate.weight"), 1u);
  auto back = load_causal_lm(dir.path());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  for (const auto& [name, t] : (*lm)->parameter_map()) {
    EXPECT_TRUE(at::equal(t, (*back)->parameter_map().at(name))) << name;
  }
  // A critic from the same checkpoint (Qwen3MoeForTokenClassification): the experts load, the
  // value head is seeded.
  LoadOptions seeded;
  seeded.score_seed = 4;
  auto critic = load_value_model(dir.path(), seeded);
  ASSERT_TRUE(critic.ok()) << critic.status().to_string();
  EXPECT_EQ((*critic)->config().architecture, "Qwen3MoeForTokenClassification");
  EXPECT_TRUE(at::equal((*critic)->parameter_map().at("model.layers.1.mlp.experts.up_proj"),
                        (*lm)->parameter_map().at("model.layers.1.mlp.experts.up_proj")));
}

TEST(MoeCheckpoint, ReadsTransformers5FusedExpertsAndNamesAMissingOrExtraExpert) {
  auto lm = CausalLM::create(testing::tiny_config("qwen3_moe"), ModelInit{at::kFloat, 10});
  ASSERT_TRUE(lm.ok());
  const TensorMap params = (*lm)->parameter_map();
  auto write = [&](const TensorMap& tensors) {
    auto dir = std::make_unique<testing::TempDir>();
    EXPECT_TRUE(save_model_config((*lm)->config(), dir->path()).ok());
    EXPECT_TRUE(write_safetensors_checkpoint(dir->path(), tensors).ok());
    return dir;
  };
  TensorMap fused;
  for (const auto& [name, t] : params) {
    const auto at = name.find(".mlp.experts.gate_proj");
    if (at != std::string::npos) {
      const std::string layer = name.substr(0, at);
      fused[layer + ".mlp.experts.gate_up_proj"] = at::cat({t, params.at(layer + ".mlp.experts.up_proj")}, 1);
    } else if (name.find(".mlp.experts.up_proj") == std::string::npos) {
      fused[name] = t;  // down_proj [E, hidden, I] is the same in both forms
    }
  }
  auto dir = write(fused);
  auto back = load_causal_lm(dir->path());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  for (const auto& [name, t] : params) EXPECT_TRUE(at::equal(t, (*back)->parameter_map().at(name))) << name;

  TensorMap missing = to_hf_checkpoint_tensors(params);
  missing.erase("model.layers.0.mlp.experts.2.up_proj.weight");
  auto no = load_causal_lm(write(missing)->path());
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("tensor 'model.layers.0.mlp.experts.2.up_proj.weight' missing"),
            std::string::npos)
      << no.status().to_string();

  TensorMap none = to_hf_checkpoint_tensors(params);  // a layer without any expert tensor
  for (auto it = none.begin(); it != none.end();) {
    it = it->first.rfind("model.layers.1.mlp.experts.", 0) == 0 ? none.erase(it) : std::next(it);
  }
  auto bare = load_causal_lm(write(none)->path());
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("tensor 'model.layers.1.mlp.experts.0."), std::string::npos)
      << bare.status().to_string();

  TensorMap extra = to_hf_checkpoint_tensors(params);
  extra["model.layers.0.mlp.experts.4.up_proj.weight"] = at::zeros({16, 32});
  auto five = load_causal_lm(write(extra)->path());
  ASSERT_FALSE(five.ok());
  EXPECT_NE(five.status().message().find("expert 4 but the model has 4 (num_experts)"), std::string::npos)
      << five.status().to_string();
}

TEST(MoeInitModel, WritesATinyMoeModelThatLoads) {
  testing::TempDir tmp;
  InitModelOptions o;
  o.arch = "qwen2_moe";
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.moe_intermediate = 16;
  o.seed = 3;
  o.out = tmp / "m";
  ASSERT_TRUE(init_model(o).ok());
  auto lm = load_causal_lm(o.out);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  EXPECT_EQ((*lm)->config().moe.shared_expert_intermediate_size, 64);
  EXPECT_TRUE((*lm)->backbone().layers[1]->moe->shared_expert);
  o.arch = "qwen3";
  o.out = tmp / "dense";
  Status st = init_model(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--experts"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tessera::models
