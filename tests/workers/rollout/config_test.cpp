// actor_rollout_ref.rollout parsing: verl's full default section is accepted, vLLM-only keys are
// reported (never silently dropped), unknown keys and wrong types are errors naming the key,
// unimplemented features are refused loudly.
#include <gtest/gtest.h>

#include <algorithm>

#include "workers/rollout/config.hpp"

namespace tessera::rollout {
namespace {

// verl v0.5.0's generated rollout defaults (ppo_trainer.yaml), as the driver hands them over.
nlohmann::json verl_defaults() {
  return nlohmann::json::parse(R"({
    "name": "vllm", "mode": "sync", "temperature": 1.0, "top_k": -1, "top_p": 1,
    "prompt_length": 512, "response_length": 512, "dtype": "bfloat16", "gpu_memory_utilization": 0.5,
    "ignore_eos": false, "enforce_eager": true, "free_cache_engine": true, "load_format": "dummy_dtensor",
    "layered_summon": false, "tensor_model_parallel_size": 2, "max_num_batched_tokens": 8192,
    "max_model_len": null, "max_num_seqs": 1024, "log_prob_micro_batch_size": null,
    "log_prob_micro_batch_size_per_gpu": null, "log_prob_use_dynamic_bsz": false,
    "log_prob_max_token_len_per_gpu": 16384, "disable_log_stats": true, "enable_chunked_prefill": true,
    "do_sample": true, "n": 1, "multi_stage_wake_up": false,
    "engine_kwargs": {"vllm": {"swap_space": null, "disable_mm_preprocessor_cache": false},
                      "sglang": {"attention_backend": null}},
    "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": false},
    "multi_turn": {"enable": false, "max_assistant_turns": null, "tool_config_path": null,
                   "max_user_turns": null, "max_parallel_calls": 1, "max_tool_response_length": 256,
                   "tool_response_truncate_side": "middle", "interaction_config_path": null,
                   "completion_callback": null, "use_inference_chat_template": false,
                   "tokenization_sanity_check_mode": "strict", "format": "hermes"},
    "calculate_log_probs": false,
    "agent": {"num_workers": 8, "custom_async_server": {"path": null, "name": null}},
    "update_weights_bucket_megabytes": 512,
    "trace": {"backend": null, "token2text": false}
  })");
}

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

Status parse_error(const nlohmann::json& j) {
  auto r = parse_rollout_config(j);
  return r.ok() ? Status() : r.status();
}

TEST(RolloutConfig, AcceptsVerlDefaultsAndReportsIgnoredKeys) {
  auto parsed = parse_rollout_config(verl_defaults());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const RolloutConfig& c = parsed->config;
  EXPECT_EQ(c.response_length, 512);
  EXPECT_EQ(c.tensor_model_parallel_size, 2);  // parsed as given; engine creation refuses it
  EXPECT_EQ(c.val_kwargs.temperature, 0.0);
  EXPECT_FALSE(c.val_kwargs.do_sample);
  EXPECT_FALSE(c.max_model_len.has_value());
  EXPECT_EQ(c.log_prob_max_token_len_per_gpu, 16384);
  EXPECT_EQ(c.batching, BatchingMode::continuous);
  const auto& ignored = parsed->ignored_keys;
  for (const char* key : {"load_format",
                          "disable_log_stats", "multi_stage_wake_up", "engine_kwargs.vllm", "engine_kwargs.sglang",
                          "multi_turn.use_inference_chat_template", "multi_turn.tokenization_sanity_check_mode",
                          "agent.num_workers", "trace", "name"}) {
    EXPECT_TRUE(has(ignored, std::string("actor_rollout_ref.rollout.") + key)) << key;
  }
  for (const char* key : {"temperature", "max_num_seqs", "dtype", "val_kwargs", "max_num_batched_tokens",
                          "enforce_eager", "enable_chunked_prefill", "gpu_memory_utilization", "multi_turn.enable",
                          "multi_turn.format", "multi_turn.max_tool_response_length"}) {
    EXPECT_FALSE(has(ignored, std::string("actor_rollout_ref.rollout.") + key)) << key;
  }
}

TEST(RolloutConfig, ParsesValuesAndTesseraEngineKwargs) {
  nlohmann::json j = {{"name", "tessera"},
                      {"temperature", 0.7},
                      {"top_k", 50},
                      {"top_p", 0.95},
                      {"max_num_seqs", 64},
                      {"max_model_len", 2048},
                      {"seed", 17},
                      {"calculate_log_probs", true},
                      {"val_kwargs", {{"temperature", 0.3}, {"do_sample", true}, {"n", 4}}},
                      {"enforce_eager", false},
                      {"cudagraph_capture_sizes", {1, 8, 64}},
                      {"engine_kwargs", {{"tessera", {{"batching", "static"}, {"kv_block_size", 32}}}}}};
  auto parsed = parse_rollout_config(j);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const RolloutConfig& c = parsed->config;
  EXPECT_DOUBLE_EQ(c.temperature, 0.7);
  EXPECT_EQ(c.top_k, 50);
  EXPECT_EQ(c.max_num_seqs, 64);
  EXPECT_EQ(c.max_model_len, 2048);
  EXPECT_EQ(c.seed, 17u);
  EXPECT_TRUE(c.calculate_log_probs);
  EXPECT_DOUBLE_EQ(c.val_kwargs.temperature, 0.3);
  EXPECT_EQ(c.val_kwargs.n, 4);
  EXPECT_EQ(c.batching, BatchingMode::static_waves);
  EXPECT_FALSE(c.enforce_eager);
  EXPECT_EQ(c.cudagraph_capture_sizes, (std::vector<int64_t>{1, 8, 64}));
  EXPECT_EQ(c.kv_block_size, 32);
  EXPECT_TRUE(parsed->ignored_keys.empty());
  EXPECT_TRUE(parse_rollout_config({{"enforce_eager", true}})->config.enforce_eager);
  auto bad = parse_rollout_config({{"cudagraph_capture_sizes", {4, 0}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cudagraph_capture_sizes[1]=0"), std::string::npos) << bad.status().to_string();
  EXPECT_DOUBLE_EQ(parse_rollout_config({{"gpu_memory_utilization", 0.7}})->config.gpu_memory_utilization, 0.7);
  bad = parse_rollout_config({{"gpu_memory_utilization", 1.5}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gpu_memory_utilization=1.5"), std::string::npos);
  bad = parse_rollout_config({{"engine_kwargs", {{"tessera", {{"max_kv_blocks", -1}}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("max_kv_blocks"), std::string::npos);
  EXPECT_EQ(parse_rollout_config(nlohmann::json::object())->config.sampler, "fused");
  EXPECT_EQ(parse_rollout_config({{"engine_kwargs", {{"tessera", {{"sampler", "torch"}}}}}})->config.sampler, "torch");
  EXPECT_TRUE(parse_rollout_config(nlohmann::json::object())->config.fused_layers);
  EXPECT_TRUE(parse_rollout_config(nlohmann::json::object())->config.split_decode_attention);
  EXPECT_FALSE(parse_rollout_config({{"engine_kwargs", {{"tessera", {{"split_decode_attention", false}}}}}})
                   ->config.split_decode_attention);
  EXPECT_FALSE(parse_rollout_config({{"engine_kwargs", {{"tessera", {{"fused_layers", false}}}}}})->config.fused_layers);
  bad = parse_rollout_config({{"engine_kwargs", {{"tessera", {{"sampler", "gumbel"}}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("engine_kwargs.tessera.sampler='gumbel'"), std::string::npos)
      << bad.status().to_string();
  bad = parse_rollout_config({{"engine_kwargs", {{"tessera", {{"kv_block_size", 0}}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kv_block_size"), std::string::npos);
  EXPECT_EQ(parse_rollout_config({{"top_k", nullptr}})->config.top_k, -1);  // null keeps the default
}

TEST(RolloutConfig, UnknownKeysAndWrongTypesNameTheKey) {
  auto expect = [](const nlohmann::json& j, const std::string& needle, ErrorCode code) {
    Status st = parse_error(j);
    ASSERT_FALSE(st.ok()) << j.dump();
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  };
  const auto bad = ErrorCode::invalid_argument;
  expect({{"temprature", 1.0}}, "'actor_rollout_ref.rollout.temprature'", bad);
  expect({{"val_kwargs", {{"topk", 1}}}}, "'actor_rollout_ref.rollout.val_kwargs.topk'", bad);
  expect({{"engine_kwargs", {{"tessera", {{"slots", 4}}}}}}, "engine_kwargs.tessera.slots", bad);
  expect({{"engine_kwargs", {{"trtllm", {}}}}}, "engine_kwargs.trtllm", bad);
  expect({{"temperature", "hot"}}, "actor_rollout_ref.rollout.temperature", bad);
  expect({{"top_k", 1.5}}, "actor_rollout_ref.rollout.top_k", bad);
  expect({{"do_sample", 1}}, "actor_rollout_ref.rollout.do_sample", bad);
  expect({{"val_kwargs", 3}}, "actor_rollout_ref.rollout.val_kwargs", bad);
  expect({{"engine_kwargs", {{"tessera", {{"batching", "dynamic"}}}}}}, "batching", bad);
  expect(nlohmann::json::array(), "actor_rollout_ref.rollout", bad);
  expect({{"top_p", 0.0}}, "top_p", bad);
  expect({{"response_length", 0}}, "response_length", bad);
  expect({{"max_model_len", 100}}, "max_model_len", bad);
  expect({{"dtype", "int8"}}, "dtype", bad);
  expect({{"name", "trtllm"}}, "name", bad);
}

TEST(RolloutConfig, UnimplementedFeaturesAreRefused) {
  for (const nlohmann::json& j :
       {nlohmann::json{{"agent", {{"custom_async_server", {{"path", "server.py"}}}}}},
        nlohmann::json{{"calculate_log_probs", true}, {"mode", "async"}, {"agent", {{"agent_loop_config_path", "l.yaml"}}}},
        nlohmann::json{{"multi_turn", {{"completion_callback", "callbacks.Done"}}}},
        nlohmann::json{{"mode", "async"}, {"multi_turn", {{"interaction_config_path", "i.yaml"}}}},
        nlohmann::json{{"multi_turn", {{"format", "llama3_json"}}}},
        nlohmann::json{{"over_sample_rate", 0.1}}, nlohmann::json{{"pipeline_model_parallel_size", 2}},
        nlohmann::json{{"limit_images", 2}}, nlohmann::json{{"use_fire_sampling", true}}}) {
    Status st = parse_error(j);
    EXPECT_EQ(st.code(), ErrorCode::unimplemented) << j.dump() << " -> " << st.to_string();
    EXPECT_NE(st.message().find(j.begin().key()), std::string::npos) << st.to_string();
  }
  auto ok = parse_rollout_config({{"over_sample_rate", 0}, {"data_parallel_size", 1}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->ignored_keys.size(), 2u);
}

TEST(RolloutConfig, MultiTurnKeys) {
  auto parsed = parse_rollout_config({{"multi_turn",
                                       {{"enable", true},
                                        {"tool_config_path", "tools.yaml"},
                                        {"max_assistant_turns", 5},
                                        {"max_user_turns", nullptr},
                                        {"max_parallel_calls", 2},
                                        {"max_tool_response_length", 100},
                                        {"tool_response_truncate_side", "left"},
                                        {"format", "hermes"}}},
                                      {"engine_kwargs", {{"tessera", {{"tool_timeout_s", 30}}}}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const MultiTurnConfig& mt = parsed->config.multi_turn;
  EXPECT_TRUE(mt.enable);
  EXPECT_EQ(*mt.tool_config_path, "tools.yaml");
  EXPECT_EQ(mt.max_assistant_turns, 5);
  EXPECT_FALSE(mt.max_user_turns.has_value());
  EXPECT_EQ(mt.max_parallel_calls, 2);
  EXPECT_EQ(mt.max_tool_response_length, 100);
  EXPECT_EQ(mt.tool_response_truncate_side, "left");
  EXPECT_EQ(mt.tool_timeout_s, 30.0);
  auto qwen25 = parse_rollout_config({{"multi_turn", {{"format", "qwen25"}}}});
  ASSERT_TRUE(qwen25.ok()) << qwen25.status().to_string();
  EXPECT_EQ(qwen25->config.multi_turn.format, "hermes");
  auto async = parse_rollout_config({{"mode", "async"}, {"agent", {{"num_workers", 8}}}});
  ASSERT_TRUE(async.ok()) << async.status().to_string();
  EXPECT_EQ(async->config.mode, "async");
  auto loops = parse_rollout_config({{"mode", "async"}, {"agent", {{"agent_loop_config_path", "loops.yaml"}}}});
  ASSERT_TRUE(loops.ok()) << loops.status().to_string();
  EXPECT_EQ(*loops->config.agent_loop_config_path, "loops.yaml");
  auto traced = parse_rollout_config({{"mode", "async"}, {"agent", {{"agent_loop_config_path", "loops.yaml"}}},
                                      {"trace", {{"backend", "weave"}}}});
  ASSERT_TRUE(traced.ok());
  EXPECT_TRUE(traced->ignored_keys.empty());  // verl's loops set their traces up themselves
  auto blank = parse_rollout_config({{"agent", {{"agent_loop_config_path", ""}}}});  // verl: a falsy path is none
  ASSERT_TRUE(blank.ok()) << blank.status().to_string();
  EXPECT_FALSE(blank->config.agent_loop_config_path.has_value());
  // Read by verl's agent loops only: with mode=sync it would change nothing.
  auto sync_loops = parse_rollout_config({{"agent", {{"agent_loop_config_path", "loops.yaml"}}}});
  ASSERT_FALSE(sync_loops.ok());
  EXPECT_NE(sync_loops.status().message().find("agent.agent_loop_config_path needs"), std::string::npos)
      << sync_loops.status().to_string();
  EXPECT_FALSE(parse_rollout_config({{"mode", "server"}}).ok());
  for (const auto& [j, key] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"multi_turn", {{"enable", true}}}}, "multi_turn.enable"},
           {{{"multi_turn", {{"tool_response_truncate_side", "both"}}}}, "tool_response_truncate_side"},
           {{{"multi_turn", {{"max_assistant_turns", 0}}}}, "max_assistant_turns"},
           {{{"multi_turn", {{"max_parallel_calls", "2"}}}}, "max_parallel_calls"},
           {{{"engine_kwargs", {{"tessera", {{"tool_timeout_s", 0}}}}}}, "tool_timeout_s"}}) {
    Status st = parse_error(j);
    EXPECT_FALSE(st.ok()) << j.dump();
    EXPECT_NE(st.message().find(key), std::string::npos) << st.to_string();
  }
}

TEST(RolloutConfig, DtypeNames) {
  RolloutConfig c;
  EXPECT_EQ(*rollout_dtype(c), c10::ScalarType::BFloat16);
  c.dtype = "fp32";
  EXPECT_EQ(*rollout_dtype(c), c10::ScalarType::Float);
  c.dtype = "auto";
  EXPECT_FALSE(rollout_dtype(c)->has_value());
}

}  // namespace
}  // namespace tessera::rollout
