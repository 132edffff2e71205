// config.json: HF field names in and out, per-family defaults, and one clear error (field + file)
// for each unsupported or malformed setting. Also the weight-loader registry.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"
#include "workers/models/weight_loader.hpp"

namespace tessera::models {
namespace {

using nlohmann::json;

json qwen2_json() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 128,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 1,
    "eos_token_id": [2, 5], "use_sliding_window": false, "sliding_window": 4096, "transformers_version": "4.43.1"})");
}

TEST(ModelConfig, ParsesHfFieldsAndRoundTrips) {
  auto c = parse_model_config(qwen2_json(), "q/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_TRUE(c->attention_bias);  // Qwen2 always has q/k/v biases
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 5}));
  EXPECT_FALSE(c->pad_token_id.has_value());
  json out = model_config_to_json(*c);
  EXPECT_EQ(out["transformers_version"], "4.43.1");  // unmodelled fields survive
  EXPECT_EQ(out["eos_token_id"], json::array({2, 5}));
  EXPECT_EQ(out["torch_dtype"], "bfloat16");
  auto again = parse_model_config(out, "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(model_config_to_json(*again), out);
}

TEST(ModelConfig, LlamaDefaultsFollowHf) {
  json j = {{"model_type", "llama"}, {"vocab_size", 10}, {"hidden_size", 16}, {"intermediate_size", 32},
            {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  auto c = parse_model_config(j, "l/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->eos_token_ids.size(), 0u);
}

struct Refusal {
  std::string name;
  json patch;   // merged into the valid qwen2 config; null values erase the key
  std::string field;
};

class ModelConfigRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(ModelConfigRefusal, NamesTheFieldAndTheFile) {
  json j = qwen2_json();
  for (const auto& [k, v] : GetParam().patch.items()) {
    if (v.is_null()) {
      j.erase(k);
    } else {
      j[k] = v;
    }
  }
  auto c = parse_model_config(j, "/ckpt/config.json");
  ASSERT_FALSE(c.ok()) << GetParam().name;
  EXPECT_NE(c.status().message().find("/ckpt/config.json"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("'" + GetParam().field + "'"), std::string::npos) << c.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ModelConfigRefusal,
    ::testing::Values(
        Refusal{"gelu", {{"hidden_act", "gelu"}}, "hidden_act"},
        Refusal{"yarn", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, "rope_scaling"},
        Refusal{"linear", {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}, "rope_scaling"},
        Refusal{"sliding", {{"use_sliding_window", true}}, "use_sliding_window"},
        Refusal{"dropout", {{"attention_dropout", 0.1}}, "attention_dropout"},
        Refusal{"missing_hidden", {{"hidden_size", nullptr}}, "hidden_size"},
        Refusal{"string_layers", {{"num_hidden_layers", "2"}}, "num_hidden_layers"},
        Refusal{"kv_not_dividing", {{"num_key_value_heads", 3}}, "num_key_value_heads"},
        Refusal{"zero_vocab", {{"vocab_size", 0}}, "vocab_size"},
        Refusal{"model_type", {{"model_type", "mistral"}}, "model_type"},
        Refusal{"dtype", {{"torch_dtype", "float8"}}, "torch_dtype"},
        Refusal{"labels", {{"id2label", {{"0", "A"}, {"1", "B"}}}}, "id2label"},
        Refusal{"architectures", {{"architectures", json::array()}}, "architectures"}),
    [](const auto& info) { return info.param.name; });

TEST(ModelConfig, LlamaMlpBiasIsRefused) {
  json j = {{"model_type", "llama"}, {"vocab_size", 10}, {"hidden_size", 16}, {"intermediate_size", 32},
            {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"mlp_bias", true}};
  auto c = parse_model_config(j, "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'mlp_bias'"), std::string::npos);
}

TEST(ModelConfig, FilesThatAreMissingOrNotJson) {
  testing::TempDir dir;
  auto missing = load_model_config(dir.path());
  EXPECT_EQ(missing.status().code(), ErrorCode::not_found);
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos);
  std::ofstream(dir / "config.json") << "{\"model_type\": ";
  auto bad = load_model_config(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir / "config.json"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
}

TEST(WeightLoaderRegistry, KnowsBuiltinsAndListsThemForUnknownNames) {
  auto& r = WeightLoaderRegistry::global();
  for (const char* a : {"LlamaForCausalLM", "Qwen2ForCausalLM", "LlamaForTokenClassification",
                        "Qwen2ForTokenClassification"}) {
    EXPECT_TRUE(r.find(a).ok()) << a;
  }
  EXPECT_EQ(r.find("Qwen2ForTokenClassification")->head, HeadKind::value);
  auto unknown = r.find("MistralForCausalLM");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("MistralForCausalLM"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("Qwen2ForCausalLM"), std::string::npos);
  EXPECT_EQ(r.add("LlamaForCausalLM", {HeadKind::causal_lm, load_hf_decoder_weights}).code(),
            ErrorCode::already_exists);
}

TEST(WeightLoaderRegistry, NewArchitecturesAreAddedByRegistering) {
  // A loader for a checkpoint that prefixes names with "transformer." (a renaming loader).
  WeightLoaderFn renaming = [](const TensorMap& ckpt, const std::string& source, PretrainedModel& model,
                               const LoadOptions& options) {
    TensorMap renamed;
    for (const auto& [name, t] : ckpt) renamed.emplace(name.substr(std::string("transformer.").size()), t);
    return load_hf_decoder_weights(renamed, source, model, options);
  };
  auto& r = WeightLoaderRegistry::global();
  ASSERT_TRUE(r.add("TestPrefixedLlamaForCausalLM", {HeadKind::causal_lm, renaming}).ok());
  auto entry = r.find("TestPrefixedLlamaForCausalLM");
  ASSERT_TRUE(entry.ok());
  auto src = CausalLM::create(testing::tiny_config("llama"), ModelInit{at::kFloat, 1});
  auto dst = CausalLM::create(testing::tiny_config("llama"), ModelInit{at::kFloat, 2});
  TensorMap ckpt;
  for (const auto& [n, t] : (*src)->parameter_map()) ckpt.emplace("transformer." + n, t);
  ASSERT_TRUE(entry->load(ckpt, "mem", **dst, {}).ok());
  EXPECT_TRUE(at::equal((*dst)->parameter_map().at("model.norm.weight"), (*src)->parameter_map().at("model.norm.weight")));
  ckpt.emplace("transformer.extra.weight", at::ones({1}));
  Status st = entry->load(ckpt, "mem", **dst, {});
  EXPECT_NE(st.message().find("'extra.weight'"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tessera::models
