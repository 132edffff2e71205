// init_model: a complete, deterministic HF directory; init -> load -> save -> load is bitwise
// identical with identical logits; bad options give one-line errors.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/init_model.hpp"
#include "workers/models/model_io.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

InitModelOptions small(const std::string& arch, const std::string& out) {
  InitModelOptions o;
  o.arch = arch;
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.intermediate = 64;
  o.tokenizer = "bytes";
  o.seed = 7;
  o.out = out;
  o.max_position = 256;
  return o;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(InitModel, WritesACompleteHfDirectory) {
  TempDir tmp;
  ASSERT_TRUE(init_model(small("qwen2", tmp / "m")).ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(tmp / "m") / f)) << f;
  }
  auto tok = tokenizer::Tokenizer::from_dir(tmp / "m");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto cfg = load_model_config(tmp / "m");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(cfg->vocab_size, tok->vocab_size());
  EXPECT_EQ(cfg->eos_token_ids, std::vector<int64_t>{*tok->eos_token_id()});
  EXPECT_EQ(cfg->pad_token_id, std::optional<int64_t>(*tok->pad_token_id()));
  EXPECT_EQ(cfg->num_key_value_heads, 2);
  // HF init: norms 1, biases 0, matrices ~ N(0, 0.02), pad row of the embedding zero.
  auto model = load_causal_lm(tmp / "m");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  TensorMap p = (*model)->parameter_map();
  EXPECT_TRUE(at::equal(p.at("model.norm.weight"), at::ones({32})));
  EXPECT_TRUE(at::equal(p.at("model.layers.0.self_attn.q_proj.bias"), at::zeros({32})));
  double sd = p.at("model.layers.0.mlp.up_proj.weight").std().item<double>();
  EXPECT_NEAR(sd, 0.02, 0.003);
  EXPECT_EQ(p.at("model.embed_tokens.weight")[*cfg->pad_token_id].abs().sum().item<double>(), 0.0);
  // No staging directory is left behind.
  for (const auto& e : fs::directory_iterator(tmp.path())) EXPECT_EQ(e.path().filename(), "m");
}

TEST(InitModel, Qwen3WithItsOwnHeadDim) {
  TempDir tmp;
  InitModelOptions o = small("qwen3", tmp / "q3");
  o.head_dim = 16;  // 4 heads x 16 != hidden 32, as Qwen3 allows
  ASSERT_TRUE(init_model(o).ok());
  auto raw = nlohmann::json::parse(std::ifstream(tmp / "q3/config.json"));
  EXPECT_EQ(raw["model_type"], "qwen3");
  EXPECT_EQ(raw["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(raw["head_dim"], 16);
  EXPECT_EQ(raw["attention_bias"], false);
  auto model = load_causal_lm(tmp / "q3");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  TensorMap p = (*model)->parameter_map();
  EXPECT_TRUE(at::equal(p.at("model.layers.0.self_attn.q_norm.weight"), at::ones({16})));
  EXPECT_TRUE(at::equal(p.at("model.layers.1.self_attn.k_norm.weight"), at::ones({16})));
  EXPECT_EQ(p.at("model.layers.0.self_attn.q_proj.weight").sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(p.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  // init -> load -> save -> load keeps every byte and the logits.
  ASSERT_TRUE(save_pretrained(**model, tmp / "q3b").ok());
  EXPECT_EQ(read_bytes(tmp / "q3/model.safetensors"), read_bytes(tmp / "q3b/model.safetensors"));
  auto again = load_causal_lm(tmp / "q3b");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ((*again)->config().head_dim, 16);
  testing::Batch batch = testing::left_padded_batch({5, 2}, 5, (*model)->config().vocab_size, 3);
  torch::NoGradGuard g;
  EXPECT_TRUE(at::equal((*model)->forward(batch.input_ids, batch.attention_mask, batch.position_ids),
                        (*again)->forward(batch.input_ids, batch.attention_mask, batch.position_ids)));
}

// init -> load -> save: every byte of config.json and model.safetensors again, and the same logits.
void expect_export_stable(const std::string& dir, const std::string& copy) {
  auto model = load_causal_lm(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  ASSERT_TRUE(save_pretrained(**model, copy).ok());
  EXPECT_EQ(read_bytes(dir + "/model.safetensors"), read_bytes(copy + "/model.safetensors"));
  EXPECT_EQ(read_bytes(dir + "/config.json"), read_bytes(copy + "/config.json"));
  auto again = load_causal_lm(copy);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  testing::Batch batch = testing::left_padded_batch({7, 2}, 7, (*model)->config().vocab_size, 3);
  torch::NoGradGuard g;
  at::Tensor logits = (*model)->forward(batch.input_ids, batch.attention_mask, batch.position_ids);
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
  EXPECT_TRUE(at::equal(logits, (*again)->forward(batch.input_ids, batch.attention_mask, batch.position_ids)));
}

TEST(InitModel, MistralWithASlidingWindow) {
  TempDir tmp;
  InitModelOptions o = small("mistral", tmp / "m");
  o.sliding_window = 4;
  ASSERT_TRUE(init_model(o).ok());
  auto raw = nlohmann::json::parse(std::ifstream(tmp / "m/config.json"));
  EXPECT_EQ(raw["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(raw["sliding_window"], 4);
  EXPECT_EQ(raw["hidden_act"], "silu");
  expect_export_stable(tmp / "m", tmp / "m2");
  o = small("mistral", tmp / "n");  // no window: null, which HF reads as none (absent would be 4096)
  ASSERT_TRUE(init_model(o).ok());
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(tmp / "n/config.json"))["sliding_window"].is_null());
}

TEST(InitModel, Gemma2WithHfDefaults) {
  TempDir tmp;
  InitModelOptions o = small("gemma2", tmp / "g");
  o.head_dim = 16;
  o.layers = 3;
  o.sliding_window = 4;
  ASSERT_TRUE(init_model(o).ok());
  auto raw = nlohmann::json::parse(std::ifstream(tmp / "g/config.json"));
  EXPECT_EQ(raw["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ(raw["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(raw["tie_word_embeddings"], true);
  EXPECT_EQ(raw["head_dim"], 16);
  EXPECT_EQ(raw["query_pre_attn_scalar"], 16.0);
  EXPECT_EQ(raw["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(raw["final_logit_softcapping"], 30.0);
  EXPECT_EQ(raw["layer_types"], nlohmann::json({"sliding_attention", "full_attention", "sliding_attention"}));
  auto model = load_causal_lm(tmp / "g");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  TensorMap p = (*model)->parameter_map();
  EXPECT_EQ(p.count("lm_head.weight"), 0u);
  for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                        "post_feedforward_layernorm"}) {
    ASSERT_EQ(p.count(std::string("model.layers.2.") + n + ".weight"), 1u) << n;
    EXPECT_TRUE(at::equal(p.at(std::string("model.layers.2.") + n + ".weight"), at::zeros({32}))) << n;  // 1 + 0
  }
  EXPECT_TRUE(at::equal(p.at("model.norm.weight"), at::zeros({32})));
  expect_export_stable(tmp / "g", tmp / "g2");
}

TEST(InitModel, Gemma3WithHfDefaults) {
  TempDir tmp;
  InitModelOptions o = small("gemma3_text", tmp / "g");
  o.head_dim = 16;
  o.layers = 7;
  o.sliding_window = 4;  // rope_theta unset: Gemma3TextConfig's 1e6
  ASSERT_TRUE(init_model(o).ok());
  auto raw = nlohmann::json::parse(std::ifstream(tmp / "g/config.json"));
  EXPECT_EQ(raw["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(raw["model_type"], "gemma3_text");
  EXPECT_EQ(raw["tie_word_embeddings"], true);
  EXPECT_EQ(raw["query_pre_attn_scalar"], 16.0);
  EXPECT_TRUE(raw["attn_logit_softcapping"].is_null());
  EXPECT_TRUE(raw["final_logit_softcapping"].is_null());
  EXPECT_EQ(raw["rope_theta"], 1e6);
  EXPECT_EQ(raw["rope_local_base_freq"], 10000.0);
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 7; ++i) types.push_back(i == 5 ? "full_attention" : "sliding_attention");
  EXPECT_EQ(raw["layer_types"], types);
  auto model = load_causal_lm(tmp / "g");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  TensorMap p = (*model)->parameter_map();
  for (const char* n : {"self_attn.q_norm", "self_attn.k_norm", "pre_feedforward_layernorm"}) {
    ASSERT_EQ(p.count(std::string("model.layers.0.") + n + ".weight"), 1u) << n;
    EXPECT_EQ(p.at(std::string("model.layers.0.") + n + ".weight").abs().max().item<double>(), 0.0) << n;  // 1 + 0
  }
  expect_export_stable(tmp / "g", tmp / "g2");
}

TEST(InitModel, RoundTripIsBitwiseIdenticalWithIdenticalLogits) {
  TempDir tmp;
  ASSERT_TRUE(init_model(small("llama", tmp / "a")).ok());
  auto a = load_causal_lm(tmp / "a");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(save_pretrained(**a, tmp / "b").ok());
  auto b = load_causal_lm(tmp / "b");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  TensorMap pa = (*a)->parameter_map(), pb = (*b)->parameter_map();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, t] : pa) {
    const at::Tensor& u = pb.at(name);
    ASSERT_EQ(t.sizes(), u.sizes()) << name;
    EXPECT_EQ(std::memcmp(t.data_ptr(), u.data_ptr(), t.nbytes()), 0) << name;
  }
  EXPECT_EQ(read_bytes(tmp / "a/model.safetensors"), read_bytes(tmp / "b/model.safetensors"));
  testing::Batch batch = testing::left_padded_batch({6, 3}, 6, (*a)->config().vocab_size, 5);
  torch::NoGradGuard g;
  at::Tensor la = (*a)->forward(batch.input_ids, batch.attention_mask, batch.position_ids);
  at::Tensor lb = (*b)->forward(batch.input_ids, batch.attention_mask, batch.position_ids);
  EXPECT_TRUE(at::equal(la, lb));
  // The same model saved as shards (HF index layout) loads back identically.
  ASSERT_TRUE(save_pretrained(**a, tmp / "s", CheckpointWriteOptions{/*max_shard_bytes=*/20000, "model"}).ok());
  EXPECT_TRUE(fs::exists(tmp / "s/model.safetensors.index.json"));
  auto s = load_causal_lm(tmp / "s");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  for (const auto& [name, t] : pa) EXPECT_TRUE(at::equal(t, (*s)->parameter_map().at(name))) << name;
}

TEST(InitModel, SeededAndDeterministic) {
  TempDir tmp;
  InitModelOptions o = small("qwen2", tmp / "x");
  ASSERT_TRUE(init_model(o).ok());
  o.out = tmp / "y";
  ASSERT_TRUE(init_model(o).ok());
  o.out = tmp / "z";
  o.seed = 8;
  ASSERT_TRUE(init_model(o).ok());
  EXPECT_EQ(read_bytes(tmp / "x/model.safetensors"), read_bytes(tmp / "y/model.safetensors"));
  EXPECT_NE(read_bytes(tmp / "x/model.safetensors"), read_bytes(tmp / "z/model.safetensors"));
  EXPECT_EQ(read_bytes(tmp / "x/config.json"), read_bytes(tmp / "y/config.json"));
}

TEST(InitModel, CharTokenizerTiedBf16AndCopiedTokenizer) {
  TempDir tmp;
  InitModelOptions o = small("llama", tmp / "c");
  o.tokenizer = "chars:0123456789+-= ";
  o.tie_word_embeddings = true;
  o.dtype = "bfloat16";
  o.vocab_size = 64;
  ASSERT_TRUE(init_model(o).ok());
  auto m = load_causal_lm(tmp / "c");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config().vocab_size, 64);
  EXPECT_EQ((*m)->config().torch_dtype, "bfloat16");
  EXPECT_EQ((*m)->parameter_map().at("model.norm.weight").scalar_type(), at::kBFloat16);
  EXPECT_EQ((*m)->parameter_map().count("lm_head.weight"), 0u);
  // PATH: the tokenizer files are copied from an existing directory.
  InitModelOptions copy = small("qwen2", tmp / "d");
  copy.tokenizer = tmp / "c";
  copy.vocab_size = 64;
  ASSERT_TRUE(init_model(copy).ok());
  EXPECT_EQ(read_bytes(tmp / "c/tokenizer.json"), read_bytes(tmp / "d/tokenizer.json"));
}

TEST(InitModel, BadOptionsAreOneLineErrors) {
  TempDir tmp;
  InitModelOptions o = small("gemma", tmp / "e");
  Status st = init_model(o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gemma"), std::string::npos) << st.to_string();
  o = small("llama", tmp / "e");
  o.sliding_window = 8;
  st = init_model(o);
  EXPECT_NE(st.message().find("--sliding-window"), std::string::npos) << st.to_string();
  o = small("llama", tmp / "e");
  o.heads = 5;
  EXPECT_FALSE(init_model(o).ok());
  o = small("llama", tmp / "e");
  o.vocab_size = 10;
  st = init_model(o);
  EXPECT_NE(st.message().find("--vocab-size 10"), std::string::npos) << st.to_string();
  o = small("llama", tmp / "e");
  o.tokenizer = tmp / "nowhere";
  st = init_model(o);
  EXPECT_NE(st.message().find("no tokenizer.json"), std::string::npos) << st.to_string();
  EXPECT_FALSE(fs::exists(tmp / "e"));
  ASSERT_TRUE(init_model(small("llama", tmp / "f")).ok());
  st = init_model(small("llama", tmp / "f"));
  EXPECT_EQ(st.code(), ErrorCode::already_exists);
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace tessera::models
