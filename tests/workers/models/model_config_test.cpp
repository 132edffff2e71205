// config.json: HF field names in and out, per-family defaults, and one clear error (field + file)
// for each unsupported or malformed setting. Also the weight-loader registry.
#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/config.hpp"
#include "workers/models/decoder.hpp"
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
        Refusal{"yarn_without_factor", {{"rope_scaling", {{"rope_type", "yarn"}}}}, "rope_scaling"},
        Refusal{"yarn_string_beta", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", "32"}}}},
                "rope_scaling"},
        Refusal{"yarn_negative_attention_factor",
                {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1.0}}}}, "rope_scaling"},
        Refusal{"yarn_truncate_number",
                {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", 1}}}}, "rope_parameters"},
        Refusal{"longrope", {{"rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}}}, "rope_scaling"},
        Refusal{"linear_without_factor", {{"rope_scaling", {{"rope_type", "linear"}}}}, "rope_scaling"},
        Refusal{"llama3_inverted_band",
                {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0}}}},
                "rope_scaling"},
        Refusal{"per_layer_rope", {{"rope_parameters", {{"full_attention", {{"rope_type", "default"}}}}}}, "rope_parameters"},
        Refusal{"partial_rotary", {{"partial_rotary_factor", 0.5}}, "partial_rotary_factor"},
        Refusal{"sliding", {{"use_sliding_window", true}, {"sliding_window", 64}}, "use_sliding_window"},
        Refusal{"dropout", {{"attention_dropout", 0.1}}, "attention_dropout"},
        Refusal{"missing_hidden", {{"hidden_size", nullptr}}, "hidden_size"},
        Refusal{"string_layers", {{"num_hidden_layers", "2"}}, "num_hidden_layers"},
        Refusal{"kv_not_dividing", {{"num_key_value_heads", 3}}, "num_key_value_heads"},
        Refusal{"zero_vocab", {{"vocab_size", 0}}, "vocab_size"},
        Refusal{"model_type", {{"model_type", "gemma"}}, "model_type"},
        Refusal{"dtype", {{"torch_dtype", "float8"}}, "torch_dtype"},
        Refusal{"labels", {{"id2label", {{"0", "A"}, {"1", "B"}}}}, "id2label"},
        Refusal{"architectures", {{"architectures", json::array()}}, "architectures"}),
    [](const auto& info) { return info.param.name; });

json qwen3_json() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": null,
    "max_position_embeddings": 128, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "hidden_act": "silu",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "use_sliding_window": false, "sliding_window": null, "max_window_layers": 28, "transformers_version": "4.51.0"})");
}

TEST(ModelConfig, Qwen3ParsesAndRoundTrips) {
  auto c = parse_model_config(qwen3_json(), "q3/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);  // from the config, not hidden_size / num_attention_heads (8)
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->o_proj_bias());
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.rope_type, "default");
  json out = model_config_to_json(*c);
  EXPECT_EQ(out["head_dim"], 16);
  EXPECT_EQ(out["attention_bias"], false);
  EXPECT_EQ(out["max_window_layers"], 28);  // unmodelled fields survive
  EXPECT_TRUE(out["rope_scaling"].is_null());
  auto again = parse_model_config(out, "again");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_config_to_json(*again), out);
  EXPECT_EQ(architecture_name("qwen3", HeadKind::value).value(), "Qwen3ForTokenClassification");

  // Qwen3Config's defaults: head_dim 128 (written back explicitly), attention_bias read (o_proj too).
  json j = qwen3_json();
  j.erase("head_dim");
  j["attention_bias"] = true;
  auto d = parse_model_config(j, "q3/config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->head_dim, 128);
  EXPECT_TRUE(d->o_proj_bias());
  EXPECT_EQ(model_config_to_json(*d)["head_dim"], 128);
  EXPECT_EQ(model_config_to_json(*d)["attention_bias"], true);
}

TEST(ModelConfig, Qwen3SlidingWindowOnlyWhereItChangesNothing) {
  for (const json& patch : {json{{"use_sliding_window", nullptr}, {"sliding_window", 16}},
                            json{{"use_sliding_window", true}, {"sliding_window", nullptr}},
                            json{{"use_sliding_window", true}, {"sliding_window", 128}}}) {
    json j = qwen3_json();
    j.update(patch);
    auto c = parse_model_config(j, "q3/config.json");
    EXPECT_TRUE(c.ok()) << patch.dump() << ": " << c.status().to_string();
  }
  json j = qwen3_json();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  auto c = parse_model_config(j, "/ckpt/q3/config.json");
  ASSERT_FALSE(c.ok());
  const std::string m = c.status().message();
  EXPECT_NE(m.find("/ckpt/q3/config.json"), std::string::npos) << m;
  EXPECT_NE(m.find("'use_sliding_window'"), std::string::npos) << m;
  EXPECT_NE(m.find("sliding_window = 64"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

json llama_json(const json& rope_patch) {
  json j = {{"model_type", "llama"}, {"vocab_size", 10}, {"hidden_size", 64}, {"intermediate_size", 32},
            {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 4096},
            {"rope_theta", 500000.0}};
  j.update(rope_patch);
  return j;
}

TEST(ModelConfig, RopeScalingLlama3LinearAndDynamicParseAndRoundTrip) {
  // Llama-3.1/3.2 as shipped (rope_type key, top-level rope_theta).
  auto l3 = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                                    {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}}),
      "l3/config.json");
  ASSERT_TRUE(l3.ok()) << l3.status().to_string();
  EXPECT_EQ(l3->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(l3->rope_scaling.factor, 32.0);
  EXPECT_EQ(l3->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l3->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l3->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l3->rope_theta, 500000.0);
  json out = model_config_to_json(*l3);
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(out["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(out["rope_theta"], 500000.0);
  EXPECT_FALSE(out.contains("rope_parameters"));
  auto again = parse_model_config(out, "again");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_config_to_json(*again), out);

  // The older "type" key; linear.
  auto linear = parse_model_config(llama_json({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}), "x");
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  EXPECT_EQ(linear->rope_scaling.rope_type, "linear");
  EXPECT_EQ(linear->rope_scaling.factor, 2.0);
  EXPECT_EQ(model_config_to_json(*linear)["rope_scaling"], (json{{"rope_type", "linear"}, {"factor", 2.0}}));

  // transformers >= 5: rope_parameters carries the type and rope_theta; written back the old way.
  auto dynamic = parse_model_config(
      llama_json({{"rope_theta", nullptr}, {"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e4}}}}),
      "x");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status().to_string();
  EXPECT_EQ(dynamic->rope_scaling.rope_type, "dynamic");
  EXPECT_EQ(dynamic->rope_theta, 1e4);
  json dyn_out = model_config_to_json(*dynamic);
  EXPECT_FALSE(dyn_out.contains("rope_parameters"));
  EXPECT_EQ(dyn_out["rope_theta"], 1e4);
  EXPECT_EQ(dyn_out["rope_scaling"], (json{{"rope_type", "dynamic"}, {"factor", 2.0}}));

  // llama3 without original_max_position_embeddings: HF defaults it to max_position_embeddings.
  auto l3_default = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}}}}),
      "x");
  ASSERT_TRUE(l3_default.ok()) << l3_default.status().to_string();
  EXPECT_EQ(l3_default->rope_scaling.original_max_position_embeddings, 4096);

  // As transformers 5: a non-empty rope_scaling wins over rope_parameters; its own rope_theta wins.
  auto both = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "linear"}, {"factor", 3.0}, {"rope_theta", 7.0}}},
                  {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 3.0}}}}),
      "x");
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ(both->rope_scaling.rope_type, "linear");
  EXPECT_EQ(both->rope_theta, 7.0);
  auto plain = parse_model_config(llama_json({{"rope_scaling", {{"rope_type", "default"}}}}), "x");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->rope_scaling.rope_type, "default");
  EXPECT_TRUE(model_config_to_json(*plain)["rope_scaling"].is_null());
}

TEST(ModelConfig, UnimplementedRopeTypesAreOneLineErrorsNamingKeyAndType) {
  for (const char* type : {"longrope", "mrope"}) {
    auto c = parse_model_config(llama_json({{"rope_scaling", {{"rope_type", type}, {"factor", 4.0}}}}), "/m/config.json");
    ASSERT_FALSE(c.ok()) << type;
    const std::string m = c.status().message();
    EXPECT_NE(m.find("'rope_scaling'"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("'") + type + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("/m/config.json"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // A programmatic config is checked the same way.
  ModelConfig c = testing::tiny_config("llama");
  c.rope_scaling.rope_type = "longrope";
  Status st = validate_model_config(c, "cfg");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'rope_scaling'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("'longrope'"), std::string::npos) << st.to_string();
}

// yarn as transformers 5 reads it (_compute_yarn_parameters): beta_fast / beta_slow default to 32 / 1
// when absent or 0, a null factor is max_position_embeddings / original_max_position_embeddings, a
// top-level original_max_position_embeddings wins over the dict's; written back whole.
TEST(ModelConfig, YarnRopeIsReadAsTransformersReadsIt) {
  auto qwen = parse_model_config(
      llama_json({{"max_position_embeddings", 131072},
                  {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}),
      "x");
  ASSERT_TRUE(qwen.ok()) << qwen.status().to_string();
  const RopeScaling& r = qwen->rope_scaling;
  EXPECT_EQ(r.rope_type, "yarn");
  EXPECT_EQ(r.factor, 4.0);
  EXPECT_EQ(r.original_max_position_embeddings, 32768);
  EXPECT_EQ(r.beta_fast, 32.0);
  EXPECT_EQ(r.beta_slow, 1.0);
  EXPECT_TRUE(r.truncate);
  EXPECT_FALSE(r.attention_factor.has_value());
  EXPECT_NEAR(rotary_attention_factor(*qwen), 0.1 * std::log(4.0) + 1.0, 1e-12);

  auto deepseek = parse_model_config(
      llama_json({{"max_position_embeddings", 16384},
                  {"original_max_position_embeddings", 4096},
                  {"rope_parameters", {{"rope_type", "yarn"}, {"factor", nullptr}, {"beta_fast", 0}, {"mscale", 0.707},
                                       {"mscale_all_dim", 1.0}, {"truncate", false}, {"rope_theta", 5000.0},
                                       {"original_max_position_embeddings", 2048}}}}),
      "x");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status().to_string();
  const RopeScaling& d = deepseek->rope_scaling;
  EXPECT_EQ(d.original_max_position_embeddings, 4096);  // the top-level one
  EXPECT_EQ(d.factor, 4.0);                            // 16384 / 4096
  EXPECT_EQ(d.beta_fast, 32.0);
  EXPECT_FALSE(d.truncate);
  EXPECT_EQ(deepseek->rope_theta, 5000.0);
  const double m = 0.1 * 0.707 * std::log(4.0) + 1.0, all = 0.1 * 1.0 * std::log(4.0) + 1.0;
  EXPECT_NEAR(rotary_attention_factor(*deepseek), m / all, 1e-12);

  const json back = model_config_to_json(*deepseek)["rope_scaling"];
  EXPECT_EQ(back["rope_type"], "yarn");
  EXPECT_EQ(back["mscale"], 0.707);
  EXPECT_EQ(back["truncate"], false);
  auto again = parse_model_config(model_config_to_json(*deepseek), "x");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->rope_scaling.factor, 4.0);
  EXPECT_NEAR(rotary_attention_factor(*again), m / all, 1e-12);

  auto given = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}, {"attention_factor", 1.25}}}}), "x");
  ASSERT_TRUE(given.ok()) << given.status().to_string();
  EXPECT_EQ(rotary_attention_factor(*given), 1.25);
  EXPECT_EQ(given->rope_scaling.original_max_position_embeddings, given->max_position_embeddings);

  // get("truncate", True): a null truncate is None, which does not truncate.
  auto null_truncate = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", nullptr}}}}), "x");
  ASSERT_TRUE(null_truncate.ok()) << null_truncate.status().to_string();
  EXPECT_FALSE(null_truncate->rope_scaling.truncate);
  // An integral float is an integer; zero is refused.
  auto float_original = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 64.0}}}}),
      "x");
  ASSERT_TRUE(float_original.ok()) << float_original.status().to_string();
  EXPECT_EQ(float_original->rope_scaling.original_max_position_embeddings, 64);
  auto zero_original = parse_model_config(
      llama_json({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 0}}}}),
      "x");
  ASSERT_FALSE(zero_original.ok());
  EXPECT_NE(zero_original.status().message().find("original_max_position_embeddings"), std::string::npos);
}

// The longest sequence a model serves, as vLLM derives max_model_len from the RoPE scaling.
TEST(ModelConfig, ContextLengthFollowsTheRopeScaling) {
  auto qwen25 = parse_model_config(
      llama_json({{"max_position_embeddings", 32768},
                  {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}),
      "x");
  ASSERT_TRUE(qwen25.ok()) << qwen25.status().to_string();
  EXPECT_EQ(qwen25->context_length(), 131072);
  auto linear = parse_model_config(llama_json({{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}), "x");
  ASSERT_TRUE(linear.ok());
  EXPECT_EQ(linear->context_length(), 8192);
  auto llama31 = parse_model_config(
      llama_json({{"max_position_embeddings", 131072},
                  {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                    {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}}),
      "x");
  ASSERT_TRUE(llama31.ok());
  EXPECT_EQ(llama31->context_length(), 131072);
  auto plain = parse_model_config(llama_json(json::object()), "x");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->context_length(), 4096);
}

TEST(ModelConfig, LlamaMlpBiasIsRefused) {
  json j = {{"model_type", "llama"}, {"vocab_size", 10}, {"hidden_size", 16}, {"intermediate_size", 32},
            {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"mlp_bias", true}};
  auto c = parse_model_config(j, "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'mlp_bias'"), std::string::npos);
}

json mistral_json() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "transformers_version": "4.42.0"})");
}

// As transformers 5.24 writes a Gemma2 config (gemma-2-2b's shape, shrunk).
json gemma2_json() {
  return json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 16, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "pad_token_id": 0,
    "bos_token_id": 2, "eos_token_id": [1, 107], "use_bidirectional_attention": null,
    "torch_dtype": "float32", "transformers_version": "5.24.0"})");
}

void expect_round_trip(const ModelConfig& c) {
  json out = model_config_to_json(c);
  auto again = parse_model_config(out, "again");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(model_config_to_json(*again).dump(2), out.dump(2));
}

TEST(ModelConfig, MistralParsesHonoursTheWindowAndRoundTrips) {
  auto c = parse_model_config(mistral_json(), "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_TRUE(c->layer_slides(0) && c->layer_slides(1));
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  json out = model_config_to_json(*c);
  EXPECT_EQ(out["sliding_window"], 4096);
  EXPECT_EQ(out["hidden_act"], "silu");
  EXPECT_FALSE(out.contains("attention_bias"));  // MistralConfig has no such key
  expect_round_trip(*c);
  // Absent: HF's MistralConfig default (4096); null: no window, written back as null.
  json j = mistral_json();
  j.erase("sliding_window");
  EXPECT_EQ(parse_model_config(j, "m")->sliding_window, 4096);
  j["sliding_window"] = nullptr;
  auto none = parse_model_config(j, "m");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->sliding_window.has_value());
  EXPECT_FALSE(none->layer_slides(0));
  EXPECT_TRUE(model_config_to_json(*none)["sliding_window"].is_null());
  expect_round_trip(*none);
}

TEST(ModelConfig, Gemma2ParsesAndRoundTrips) {
  auto c = parse_model_config(gemma2_json(), "g/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Gemma2ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c->query_pre_attn_scalar, 16.0);
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma2Config's default
  EXPECT_TRUE(c->gemma_norms());
  EXPECT_TRUE(c->layer_slides(0));
  EXPECT_FALSE(c->layer_slides(1));
  EXPECT_TRUE(c->layer_slides(2));
  json out = model_config_to_json(*c);
  EXPECT_EQ(out["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(out["hidden_act"], "gelu_pytorch_tanh");  // ignored by HF's Gemma2: kept verbatim in extra
  EXPECT_EQ(out["layer_types"], gemma2_json()["layer_types"]);
  EXPECT_EQ(out["head_dim"], 16);
  expect_round_trip(*c);
}

TEST(ModelConfig, Gemma2DefaultsFollowHf) {
  json j = {{"model_type", "gemma2"}, {"vocab_size", 10}, {"hidden_size", 16}, {"intermediate_size", 32},
            {"num_hidden_layers", 2}, {"num_attention_heads", 2}};
  auto c = parse_model_config(j, "g/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->max_position_embeddings, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(c->layer_slides(0));  // Gemma2Config: layer i slides iff (i + 1) % 2
  EXPECT_FALSE(c->layer_slides(1));
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  auto off = parse_model_config(j, "g/config.json");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->attn_logit_softcapping.has_value());
  EXPECT_FALSE(off->final_logit_softcapping.has_value());
  expect_round_trip(*off);
}

// gemma-3-1b-it's config.json as released (transformers 4.50): legacy RoPE keys (rope_theta for
// the full layers, rope_local_base_freq for the sliding ones) and sliding_window_pattern.
json gemma3_1b_json() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
    "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");
}

TEST(ModelConfig, Gemma3AsReleasedParsesAndRoundTrips) {
  auto c = parse_model_config(gemma3_1b_json(), "g3/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Gemma3ForCausalLM");
  EXPECT_TRUE(c->gemma_norms());
  EXPECT_TRUE(c->qk_norm());
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma3TextConfig's default
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_local_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.rope_type, "default");
  EXPECT_EQ(c->sliding_window, 512);
  EXPECT_FALSE(c->attn_logit_softcapping.has_value());
  EXPECT_FALSE(c->final_logit_softcapping.has_value());
  ASSERT_EQ(c->layer_types.size(), 26u);
  for (int64_t i = 0; i < 26; ++i) {  // every 6th layer full
    const bool full = (i + 1) % 6 == 0;
    EXPECT_EQ(c->layer_slides(i), !full) << i;
    EXPECT_EQ(c->layer_local_rope(i), !full) << i;
  }
  EXPECT_EQ(c->extra.count("sliding_window_pattern"), 0u);  // modelled: written as layer_types
  EXPECT_EQ(c->extra["cache_implementation"], "hybrid");
  json out = model_config_to_json(*c);
  EXPECT_EQ(out["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(out["rope_theta"], 1e6);
  EXPECT_EQ(out["layer_types"].size(), 26u);
  EXPECT_EQ(out["hidden_activation"], "gelu_pytorch_tanh");
  expect_round_trip(*c);
  // No Gemma3ForTokenClassification in transformers: no critic or reward model of this family.
  auto value = architecture_name("gemma3_text", HeadKind::value);
  ASSERT_FALSE(value.ok());
  EXPECT_NE(value.status().message().find("no value model"), std::string::npos) << value.status().message();
}

// As transformers 5 writes it: RoPE per layer type; the sliding layers' must be the default type.
TEST(ModelConfig, Gemma3RopePerLayerType) {
  json j = gemma3_1b_json();
  for (const char* k : {"rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern"}) j.erase(k);
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 5e5}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 2e4}}}};
  auto c = parse_model_config(j, "g3/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_theta, 5e5);
  EXPECT_EQ(c->rope_scaling.rope_type, "linear");
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_local_theta, 2e4);
  EXPECT_FALSE(c->layer_local_rope(1));
  expect_round_trip(*c);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  auto bad = parse_model_config(j, "g3/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("g3/config.json: field 'rope_parameters.sliding_attention'"),
            std::string::npos)
      << bad.status().message();
}

struct FamilyRefusal {
  std::string name;
  bool gemma;   // patch gemma2_json(), else mistral_json()
  json patch;
  std::string field;
};

class FamilyConfigRefusal : public ::testing::TestWithParam<FamilyRefusal> {};

TEST_P(FamilyConfigRefusal, IsOneLineNamingTheKeyAndTheFile) {
  json j = GetParam().gemma ? gemma2_json() : mistral_json();
  for (const auto& [k, v] : GetParam().patch.items()) j[k] = v;
  auto c = parse_model_config(j, "/ckpt/config.json");
  ASSERT_FALSE(c.ok()) << GetParam().name;
  const std::string m = c.status().message();
  EXPECT_NE(m.find("/ckpt/config.json"), std::string::npos) << m;
  EXPECT_NE(m.find("'" + GetParam().field + "'"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(
    MistralGemma2, FamilyConfigRefusal,
    ::testing::Values(
        FamilyRefusal{"mistral_act", false, {{"hidden_act", "gelu"}}, "hidden_act"},
        FamilyRefusal{"mistral_window_zero", false, {{"sliding_window", 0}}, "sliding_window"},
        FamilyRefusal{"mistral_window_text", false, {{"sliding_window", "4096"}}, "sliding_window"},
        FamilyRefusal{"gemma_act", true, {{"hidden_activation", "gelu"}}, "hidden_activation"},
        FamilyRefusal{"gemma_window", true, {{"sliding_window", -1}}, "sliding_window"},
        FamilyRefusal{"gemma_layer_type", true,
                      {{"layer_types", {"sliding_attention", "chunked_attention", "full_attention"}}}, "layer_types"},
        FamilyRefusal{"gemma_layer_count", true, {{"layer_types", {"full_attention"}}}, "layer_types"},
        FamilyRefusal{"gemma_softcap", true, {{"attn_logit_softcapping", 0}}, "attn_logit_softcapping"},
        FamilyRefusal{"gemma_final_softcap", true, {{"final_logit_softcapping", "30"}}, "final_logit_softcapping"},
        FamilyRefusal{"gemma_scalar", true, {{"query_pre_attn_scalar", 0}}, "query_pre_attn_scalar"},
        FamilyRefusal{"gemma_bidirectional", true, {{"use_bidirectional_attention", true}},
                      "use_bidirectional_attention"},
        FamilyRefusal{"gemma_dropout", true, {{"attention_dropout", 0.1}}, "attention_dropout"}),
    [](const auto& info) { return info.param.name; });

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

// model.override_config over config.json, as verl's update_model_config sets it: each field is
// replaced whole (rope_scaling too); what the override makes invalid names the file "with" the key.
TEST(ModelConfig, OverrideConfigIsMergedOverTheFile) {
  testing::TempDir dir;
  std::ofstream(dir / "config.json") << llama_json({{"max_position_embeddings", 32768},
                                                    {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}})
                                            .dump();
  const std::string key = "actor_rollout_ref.model.override_config";
  auto plain = load_model_config(dir.path(), nlohmann::json::object(), key);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->rope_scaling.rope_type, "linear");
  // Qwen2.5's long context: yarn over the file's RoPE, keeping what the override leaves alone.
  auto yarn = load_model_config(
      dir.path(),
      {{"rms_norm_eps", 1e-5},
       {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}},
      key);
  ASSERT_TRUE(yarn.ok()) << yarn.status().to_string();
  EXPECT_EQ(yarn->rms_norm_eps, 1e-5);
  EXPECT_EQ(yarn->rope_scaling.rope_type, "yarn");
  EXPECT_EQ(yarn->context_length(), 131072);
  EXPECT_EQ(yarn->num_attention_heads, 4);  // untouched
  // The file's RoPE is replaced, not merged: a legacy "type" over the file's "rope_type" is yarn.
  auto legacy = load_model_config(
      dir.path(), {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}},
      key);
  ASSERT_TRUE(legacy.ok()) << legacy.status().to_string();
  EXPECT_EQ(legacy->rope_scaling.rope_type, "yarn");
  auto refused = load_model_config(dir.path(), {{"attention_dropout", 0.1}}, key);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("config.json with " + key), std::string::npos) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("attention_dropout"), std::string::npos) << refused.status().to_string();
  auto not_a_mapping = load_model_config(dir.path(), nlohmann::json::array({1}), key);
  ASSERT_FALSE(not_a_mapping.ok());
  EXPECT_NE(not_a_mapping.status().message().find(key + " = [1]: expected a mapping"), std::string::npos)
      << not_a_mapping.status().to_string();
}

TEST(WeightLoaderRegistry, KnowsBuiltinsAndListsThemForUnknownNames) {
  auto& r = WeightLoaderRegistry::global();
  for (const char* a : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                        "Gemma2ForCausalLM", "LlamaForTokenClassification", "Qwen2ForTokenClassification",
                        "Qwen3ForTokenClassification", "MistralForTokenClassification",
                        "Gemma2ForTokenClassification"}) {
    EXPECT_TRUE(r.find(a).ok()) << a;
  }
  EXPECT_EQ(r.find("Qwen2ForTokenClassification")->head, HeadKind::value);
  auto unknown = r.find("GemmaForCausalLM");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("GemmaForCausalLM"), std::string::npos);
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
