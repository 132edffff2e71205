// Config: defaults, user file merge, typed Hydra overrides, interpolations, and verl's
// _validate_config rules, each error one line naming the key.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "driver/config.hpp"
#include "driver/model_paths.hpp"
#include "driver/ppo_trainer.hpp"
#include "driver/reward.hpp"
#include "driver/runtime_config.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

// A config that passes verl's rules on 2 GPUs: micro batch sizes set, small batches.
std::vector<std::string> valid_overrides() {
  return {"data.train_batch_size=8",
          "trainer.n_gpus_per_node=2",
          "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
          "critic.ppo_micro_batch_size_per_gpu=2"};
}

json load_ok(std::vector<std::string> overrides) {
  auto cfg = load_config(ConfigKind::ppo, {}, overrides);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  return cfg.ok() ? *cfg : json();
}

std::string load_error(std::vector<std::string> overrides, const std::filesystem::path& file = {}) {
  auto cfg = load_config(ConfigKind::ppo, file, overrides);
  EXPECT_FALSE(cfg.ok());
  std::string msg = cfg.status().message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

std::string validate_error(std::vector<std::string> extra) {
  auto overrides = valid_overrides();
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  json cfg = load_ok(overrides);
  Status st = validate_ppo_config(cfg);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  return st.message();
}

std::filesystem::path write_temp(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / ("tessera_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path) << text;
  return path;
}

TEST(Config, DefaultsHaveVerlValues) {
  json cfg = load_ok({});
  EXPECT_EQ(cfg["data"]["train_batch_size"], 1024);
  EXPECT_EQ(cfg["data"]["max_prompt_length"], 512);
  EXPECT_EQ(cfg["data"]["truncation"], "error");
  EXPECT_EQ(cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"], 256);
  EXPECT_DOUBLE_EQ(cfg["actor_rollout_ref"]["actor"]["optim"]["lr"].get<double>(), 1e-6);
  EXPECT_DOUBLE_EQ(cfg["critic"]["optim"]["lr"].get<double>(), 1e-5);
  EXPECT_EQ(cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"], "vanilla");
  EXPECT_EQ(cfg["algorithm"]["kl_ctrl"]["type"], "fixed");
  EXPECT_EQ(cfg["algorithm"]["adv_estimator"], "gae");
  EXPECT_EQ(cfg["trainer"]["total_epochs"], 30);
  EXPECT_TRUE(cfg["trainer"]["total_training_steps"].is_null());
  EXPECT_EQ(cfg["cluster"]["agents"], json::array());
  EXPECT_EQ(cfg["trainer"]["num_threads"], 0);
  EXPECT_EQ(cfg["actor_rollout_ref"]["rollout"]["n"], 1);
  EXPECT_EQ(cfg["actor_rollout_ref"]["rollout"]["val_kwargs"]["do_sample"], false);
}

TEST(Config, InterpolationsResolveAfterOverrides) {
  json cfg = load_ok({"data.max_prompt_length=64", "trainer.project_name=p", "trainer.experiment_name=e",
                      "critic.ppo_max_token_len_per_gpu=999", "actor_rollout_ref.rollout.n=4"});
  EXPECT_EQ(cfg["actor_rollout_ref"]["rollout"]["prompt_length"], 64);
  EXPECT_EQ(cfg["trainer"]["default_local_dir"], "checkpoints/p/e");
  EXPECT_EQ(cfg["critic"]["forward_max_token_len_per_gpu"], 999);  // ${.ppo_max_token_len_per_gpu}
  EXPECT_EQ(cfg["critic"]["rollout_n"], 4);
  EXPECT_EQ(cfg["actor_rollout_ref"]["actor"]["checkpoint"]["load_contents"],
            json::array({"model", "optimizer", "extra"}));
  // reward_model.use_dynamic_bsz -> critic.use_dynamic_bsz -> actor.use_dynamic_bsz (a chain).
  json chained = load_ok({"actor_rollout_ref.actor.use_dynamic_bsz=true"});
  EXPECT_EQ(chained["reward_model"]["use_dynamic_bsz"], true);
}

TEST(Config, OverridesAreTyped) {
  json cfg = load_ok({"actor_rollout_ref.actor.optim.lr=3e-4", "trainer.logger=[console,jsonl]",
                      "data.shuffle=False", "trainer.total_training_steps=7", "data.val_batch_size=null",
                      "trainer.experiment_name='123'", "algorithm.gamma=1", "cluster.agents=[a:1,b:2]",
                      "+trainer.extra_key=2.5", "++data.new_thing=[1, 2.5, x]"});
  EXPECT_DOUBLE_EQ(cfg["actor_rollout_ref"]["actor"]["optim"]["lr"].get<double>(), 3e-4);
  EXPECT_EQ(cfg["trainer"]["logger"], json::array({"console", "jsonl"}));
  EXPECT_EQ(cfg["data"]["shuffle"], false);
  EXPECT_EQ(cfg["trainer"]["total_training_steps"], 7);
  EXPECT_TRUE(cfg["data"]["val_batch_size"].is_null());
  EXPECT_EQ(cfg["trainer"]["experiment_name"], "123");  // quoted: stays a string
  EXPECT_EQ(cfg["algorithm"]["gamma"], 1);             // a float key accepts an integer
  EXPECT_EQ(cfg["cluster"]["agents"], json::array({"a:1", "b:2"}));
  EXPECT_DOUBLE_EQ(cfg["trainer"]["extra_key"].get<double>(), 2.5);
  EXPECT_EQ(cfg["data"]["new_thing"], json::array({1, 2.5, "x"}));
  EXPECT_EQ(*config_get<double>(cfg, "algorithm.gamma"), 1.0);
}

// The cluster block is the runtime's (runtime/config.hpp): nulls keep its defaults, set keys reach it.
TEST(Config, ClusterBlockConfiguresTheRuntime) {
  auto defaults = trainer_runtime_config(load_ok({"trainer.n_gpus_per_node=2", "trainer.device=cpu"}));
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->embedded_devices, "cpu:2");
  EXPECT_EQ(defaults->heartbeat_interval, runtime::RuntimeConfig{}.heartbeat_interval);
  auto set = trainer_runtime_config(load_ok({"trainer.n_gpus_per_node=1", "trainer.device=cpu",
                                             "cluster.heartbeat_interval_ms=100", "cluster.call_timeout_s=30",
                                             "cluster.data_plane.peer_mapping_bytes=1048576"}));
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->heartbeat_interval.count(), 100);
  EXPECT_EQ(set->call_timeout.count(), 30000);
  EXPECT_EQ(set->data_plane.peer_mapping_bytes, 1048576u);
}

TEST(Config, OverrideValueParsing) {
  EXPECT_EQ(*parse_override_value("12"), json(12));
  EXPECT_EQ(*parse_override_value("-3"), json(-3));
  EXPECT_EQ(*parse_override_value(".5"), json(0.5));
  EXPECT_EQ(*parse_override_value("1e-6"), json(1e-6));
  EXPECT_EQ(*parse_override_value("TRUE"), json(true));
  EXPECT_EQ(*parse_override_value("~"), json(nullptr));
  EXPECT_EQ(*parse_override_value("abc/def.jsonl"), json("abc/def.jsonl"));
  EXPECT_EQ(*parse_override_value("\"007\""), json("007"));
  EXPECT_EQ(*parse_override_value("[]"), json::array());
  EXPECT_EQ(*parse_override_value("{a: 1, b: [x]}"), json({{"a", 1}, {"b", {"x"}}}));
  // Hydra's own form, without the space YAML wants after a key's colon.
  EXPECT_EQ(*parse_override_value("{type:yarn,factor:4.0,original_max_position_embeddings:32768}"),
            json({{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}));
  EXPECT_EQ(*parse_override_value("{a:{b:1},c:[1,2],d:'f:g',h:i:j,a/b:1,$x:2}"),
            json({{"a", {{"b", 1}}}, {"c", {1, 2}}, {"d", "f:g"}, {"h", "i:j"}, {"a/b", 1}, {"$x", 2}}));
  EXPECT_EQ(*parse_override_value(R"({a:"x\"y",b:1})"), json({{"a", "x\"y"}, {"b", 1}}));
  // An interpolation as a whole element stays the text the config resolves.
  EXPECT_EQ(*parse_override_value("{a:${trainer.n_gpus_per_node},b:[${x.y}, 2]}"),
            json({{"a", "${trainer.n_gpus_per_node}"}, {"b", {"${x.y}", 2}}}));
  EXPECT_EQ(*parse_override_value("[{a:1},{b:x}]"), json::array({{{"a", 1}}, {{"b", "x"}}}));
  EXPECT_FALSE(parse_override_value("[1, 2").ok());
}

TEST(Config, UnknownKeyNamesTheKey) {
  std::string msg = load_error({"actor_rollout_ref.actor.ppo_mini_batch_sise=3"});
  EXPECT_NE(msg.find("actor_rollout_ref.actor.ppo_mini_batch_sise"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'ppo_mini_batch_size'"), std::string::npos) << msg;
  msg = load_error({"nosuch.section=1"});
  EXPECT_NE(msg.find("'nosuch.section'"), std::string::npos) << msg;
  msg = load_error({"+trainer.total_epochs=3"});  // + on an existing key
  EXPECT_NE(msg.find("trainer.total_epochs"), std::string::npos) << msg;
  msg = load_error({"~trainer.not_there"});
  EXPECT_NE(msg.find("trainer.not_there"), std::string::npos) << msg;
  msg = load_error({"trainer.total_epochs"});
  EXPECT_NE(msg.find("key=value"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesTheKey) {
  std::string msg = load_error({"data.train_batch_size=abc"});
  EXPECT_NE(msg.find("data.train_batch_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an integer"), std::string::npos) << msg;
  msg = load_error({"data.train_batch_size=1.5"});
  EXPECT_NE(msg.find("data.train_batch_size"), std::string::npos) << msg;
  msg = load_error({"data.shuffle=3"});
  EXPECT_NE(msg.find("data.shuffle"), std::string::npos) << msg;
  msg = load_error({"algorithm.kl_ctrl=5"});
  EXPECT_NE(msg.find("algorithm.kl_ctrl"), std::string::npos) << msg;
}

TEST(Config, UserFileMergesOverDefaults) {
  auto file = write_temp("user.yaml",
                         "data:\n  train_batch_size: 16\n  max_prompt_length: 32\n"
                         "actor_rollout_ref:\n  actor:\n    _target_: verl.Something\n    optim:\n      lr: 2.0e-5\n"
                         "trainer:\n  logger: [jsonl]\n  project_name: proj\n");
  auto cfg = load_config(ConfigKind::ppo, file, {"data.train_batch_size=32"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ((*cfg)["data"]["train_batch_size"], 32);  // override beats file
  EXPECT_EQ((*cfg)["data"]["max_prompt_length"], 32);
  EXPECT_EQ((*cfg)["data"]["max_response_length"], 512);  // default kept beside merged keys
  EXPECT_DOUBLE_EQ((*cfg)["actor_rollout_ref"]["actor"]["optim"]["lr"].get<double>(), 2e-5);
  EXPECT_EQ((*cfg)["actor_rollout_ref"]["actor"]["optim"]["weight_decay"], 0.01);
  EXPECT_FALSE((*cfg)["actor_rollout_ref"]["actor"].contains("_target_"));
  EXPECT_EQ((*cfg)["actor_rollout_ref"]["rollout"]["prompt_length"], 32);
  EXPECT_EQ((*cfg)["trainer"]["default_local_dir"], "checkpoints/proj/gsm8k");
}

TEST(Config, UserFileErrorsNameFileAndKey) {
  auto bad_key = write_temp("bad_key.yaml", "trainer:\n  totl_epochs: 3\n");
  std::string msg = load_error({}, bad_key);
  EXPECT_NE(msg.find("bad_key.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trainer.totl_epochs"), std::string::npos) << msg;
  auto bad_yaml = write_temp("bad_yaml.yaml", "trainer:\n  total_epochs: [1, 2\n");
  msg = load_error({}, bad_yaml);
  EXPECT_NE(msg.find("bad_yaml.yaml:"), std::string::npos) << msg;
  msg = load_error({}, "/nonexistent/cfg.yaml");
  EXPECT_NE(msg.find("/nonexistent/cfg.yaml"), std::string::npos) << msg;
  auto bad_type = write_temp("bad_type.yaml", "critic:\n  optim:\n    lr: fast\n");
  msg = load_error({}, bad_type);
  EXPECT_NE(msg.find("critic.optim.lr"), std::string::npos) << msg;
}

TEST(Config, InterpolationErrors) {
  std::string msg = load_error({"trainer.project_name=${oc.env:HOME}"});
  EXPECT_NE(msg.find("oc.env"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trainer.project_name"), std::string::npos) << msg;
  msg = load_error({"trainer.project_name=${no.such.key}"});
  EXPECT_NE(msg.find("no.such.key"), std::string::npos) << msg;
  msg = load_error({"+trainer.a=${trainer.b}", "+trainer.b=${trainer.a}"});
  EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
  // An interpolation that produces the wrong type is caught after resolution.
  // (The first key in sorted order that holds the bad value is named: here the rollout's copy.)
  msg = load_error({"data.max_prompt_length=${trainer.project_name}"});
  EXPECT_NE(msg.find("prompt_length' must be an integer"), std::string::npos) << msg;
  // oc.select with a default.
  json cfg = load_ok({"+trainer.sel=${oc.select:trainer.missing,17}", "+trainer.sel2=${oc.select:data.prompt_key,x}"});
  EXPECT_EQ(cfg["trainer"]["sel"], 17);
  EXPECT_EQ(cfg["trainer"]["sel2"], "prompt");
}

TEST(Config, ValidConfigPasses) {
  json cfg = load_ok(valid_overrides());
  EXPECT_TRUE(validate_ppo_config(cfg).ok()) << validate_ppo_config(cfg).to_string();
  EXPECT_TRUE(need_critic(cfg));
  EXPECT_FALSE(need_reference_policy(cfg));
}

TEST(Config, ValidateRulesNameKeys) {
  std::string msg = validate_error({"actor_rollout_ref.rollout.n=3", "data.train_batch_size=7"});
  EXPECT_NE(msg.find("data.train_batch_size * actor_rollout_ref.rollout.n = 7 * 3 = 21"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.ppo_micro_batch_size=2"});
  EXPECT_NE(msg.find("actor_rollout_ref.actor.ppo_micro_batch_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("both"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"});
  EXPECT_NE(msg.find("set one of 'actor_rollout_ref.actor.ppo_micro_batch_size'"), std::string::npos) << msg;
  msg = validate_error({"critic.ppo_micro_batch_size_per_gpu=null"});
  EXPECT_NE(msg.find("[critic]"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.ppo_mini_batch_size=16"});
  EXPECT_NE(msg.find("data.train_batch_size = 8 must be >= actor_rollout_ref.actor.ppo_mini_batch_size = 16"),
            std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.loss_agg_mode=sum"});
  EXPECT_NE(msg.find("actor_rollout_ref.actor.loss_agg_mode"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.temperature=0"});
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.temperature"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"});
  EXPECT_NE(msg.find("use_remove_padding"), std::string::npos) << msg;
  msg = validate_error({"reward_model.enable=true", "reward_model.model.path=/m", "reward_model.micro_batch_size_per_gpu=2",
                        "reward_model.ulysses_sequence_parallel_size=2"});
  EXPECT_NE(msg.find("reward_model.ulysses_sequence_parallel_size = 2 > 1 requires reward_model.model.use_remove_padding"),
            std::string::npos) << msg;
  msg = validate_error({"data.truncation=sideways"});
  EXPECT_NE(msg.find("data.truncation"), std::string::npos) << msg;
  msg = validate_error({"algorithm.adv_estimator=magic"});
  EXPECT_NE(msg.find("algorithm.adv_estimator"), std::string::npos) << msg;
  msg = validate_error({"trainer.resume_mode=sometimes"});
  EXPECT_NE(msg.find("trainer.resume_mode"), std::string::npos) << msg;
  // The deprecated global micro batch: mini % micro and micro * sp >= GPUs.
  msg = validate_error({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                        "actor_rollout_ref.actor.ppo_micro_batch_size=3"});
  EXPECT_NE(msg.find("divisible by actor_rollout_ref.actor.ppo_micro_batch_size = 3"), std::string::npos) << msg;
  msg = validate_error({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                        "actor_rollout_ref.actor.ppo_micro_batch_size=1", "trainer.n_gpus_per_node=4"});
  EXPECT_NE(msg.find("GPU count 4"), std::string::npos) << msg;
}

TEST(Config, RunsWithoutAConfigFileLikeVerlScripts) {
  auto split = split_config_args({"trainer.logger=console", "+x.y=1", "~a.b"});
  ASSERT_TRUE(split.ok());
  EXPECT_TRUE(split->file.empty());
  EXPECT_EQ(split->overrides.size(), 3u);
  split = split_config_args({"run.yaml", "a.b=c"});
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->file, "run.yaml");
  EXPECT_EQ(split->overrides, std::vector<std::string>{"a.b=c"});
  split = split_config_args({"a.b=c"}, "conf", "ppo");  // Hydra's --config-path / --config-name
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->file, std::filesystem::path("conf/ppo.yaml"));
  auto bad = split_config_args({"a.b=c", "oops"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'oops' is not an override"), std::string::npos);
  EXPECT_FALSE(split_config_args({}, "conf", "").ok());
}

TEST(Config, StringWhereAListIsExpectedIsOneElement) {
  json cfg = load_ok({"trainer.logger=console", "data.train_files=[a.parquet,b.parquet]", "data.val_files=c.parquet"});
  EXPECT_EQ(cfg["trainer"]["logger"], json::array({"console"}));
  EXPECT_EQ(cfg["data"]["train_files"], json::array({"a.parquet", "b.parquet"}));
  EXPECT_EQ(cfg["data"]["val_files"], "c.parquet");
  std::string msg = load_error({"trainer.logger=3"});
  EXPECT_NE(msg.find("trainer.logger"), std::string::npos) << msg;
}

TEST(Config, ResolvedYamlReadsBackToTheSameConfig) {
  json cfg = load_ok({"trainer.experiment_name='1e-6'", "trainer.project_name=true_story", "+extra.s=''",
                      "+extra.t='null'", "actor_rollout_ref.actor.optim.lr=3e-06", "+extra.f=2.0"});
  auto back = yaml_to_json(config_to_yaml(cfg), "config.yaml");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, cfg);
  EXPECT_TRUE((*back)["extra"]["f"].is_number_float());
}

// verl's DAPO recipe writes the overlong penalty as reward_model.overlong_buffer (max_resp_len
// from data.max_response_length); newer scripts as reward_kwargs.overlong_buffer_cfg. Both read
// the same.
TEST(Config, DapoRecipeOverlongBufferEqualsTheRewardKwargsForm) {
  auto recipe = valid_overrides();
  for (const char* o : {"reward_model.reward_manager=dapo", "data.max_response_length=16",
                        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
                        "reward_model.overlong_buffer.penalty_factor=0.5", "reward_model.overlong_buffer.log=true"}) {
    recipe.push_back(o);
  }
  auto kwargs = valid_overrides();
  for (const char* o : {"reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=16",
                        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
                        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
                        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=true"}) {
    kwargs.push_back(o);
  }
  auto a = reward_manager_options(load_ok(recipe));
  auto b = reward_manager_options(load_ok(kwargs));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  for (const RewardManagerOptions* o : {&*a, &*b}) {
    EXPECT_TRUE(o->overlong.enable);
    EXPECT_EQ(o->overlong.len, 4);
    EXPECT_EQ(o->overlong.penalty_factor, 0.5);
    EXPECT_TRUE(o->overlong.log);
    EXPECT_EQ(o->max_resp_len, 16);
  }
  recipe.push_back("reward_model.overlong_buffer.len=32");
  auto too_long = reward_manager_options(load_ok(recipe));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("reward_model.overlong_buffer.len = 32 must lie in (0, "
                                             "data.max_response_length = 16]"),
            std::string::npos)
      << too_long.status().message();
}

TEST(Config, WhatTesseraDoesNotSupportIsRefusedNamingTheKey) {
  for (const auto& [override_text, key] : std::vector<std::pair<std::string, std::string>>{
           {"data.datagen.path=gen.py", "data.datagen.path"},
           {"algorithm.pf_ppo.reweight_method=softmax", "algorithm.pf_ppo.reweight_method"},
           {"trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir"},
           {"reward_model.reward_manager=fancy", "reward_model.reward_manager"},
           {"+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true", "reward_model.reward_kwargs"},
           {"reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.enable=true needs "
                                                        "reward_model.reward_manager=dapo"},
           {"critic.strategy=megatron", "critic.strategy"},
           {"reward_model.strategy=megatron", "reward_model.strategy"},
           {"algorithm.kl_penalty=full", "algorithm.kl_penalty"},
           {"trainer.logger=[console,trackio]", "trainer.logger"},
           {"trainer.log_val_generations=-2", "trainer.log_val_generations = -2 must be >= 0"},
           {"actor_rollout_ref.actor.checkpoint.save_contents=[model,extra]", "save_contents"},
           {"critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]", "critic.checkpoint.save_contents"},
       }) {
    std::string msg = validate_error({override_text});
    EXPECT_NE(msg.find(key), std::string::npos) << override_text << ": " << msg;
  }
  json cfg = load_ok(valid_overrides());
  cfg["actor_rollout_ref"]["actor"]["checkpoint"]["save_contents"] = {"model", "optimizer", "extra", "hf_model"};
  cfg["actor_rollout_ref"]["actor"]["checkpoint"]["load_contents"] = {"model", "optimizer", "extra", "hf_model"};
  EXPECT_TRUE(validate_ppo_config(cfg).ok()) << validate_ppo_config(cfg).to_string();

  auto sft = load_config(ConfigKind::sft, {}, {"data.balance_dp_token=true"});
  ASSERT_TRUE(sft.ok());
  EXPECT_NE(validate_sft_config(*sft).message().find("data.balance_dp_token"), std::string::npos);
  sft = load_config(ConfigKind::sft, {}, {"ulysses_sequence_parallel_size=2"});
  ASSERT_TRUE(sft.ok());
  EXPECT_NE(validate_sft_config(*sft).message().find("ulysses_sequence_parallel_size = 2 > 1 requires use_remove_padding"),
            std::string::npos) << validate_sft_config(*sft).message();
  sft = load_config(ConfigKind::sft, {}, {"ulysses_sequence_parallel_size=3", "use_remove_padding=true"});
  ASSERT_TRUE(sft.ok());
  EXPECT_NE(validate_sft_config(*sft).message().find("ulysses_sequence_parallel_size = 3 must divide"), std::string::npos)
      << validate_sft_config(*sft).message();
  sft = load_config(ConfigKind::sft, {}, {"ulysses_sequence_parallel_size=2", "use_remove_padding=true"});
  ASSERT_TRUE(sft.ok());
  EXPECT_TRUE(validate_sft_config(*sft).ok()) << validate_sft_config(*sft).to_string();
  sft = load_config(ConfigKind::sft, {}, {"model.strategy=megatron"});
  ASSERT_TRUE(sft.ok());
  EXPECT_NE(validate_sft_config(*sft).message().find("model.strategy"), std::string::npos);
}

// Tessera's own keys (the rollout engine's, FSDP's sharding_strategy and wrap_policy, use_liger of
// every model) are in the built-in defaults, so they are set like verl's keys, without `+`: the
// keys the kernels' self-check errors name among them.
TEST(Config, TesseraKeysAreSetWithoutAPlus) {
  const std::string r = "actor_rollout_ref.rollout.";
  std::vector<std::string> overrides = valid_overrides();
  for (const std::string& o : std::vector<std::string>{r + "engine_kwargs.tessera.sampler=torch", r + "engine_kwargs.tessera.fused_layers=false",
                      r + "engine_kwargs.tessera.decode_attention=gather",
                      r + "engine_kwargs.tessera.split_decode_attention=false", r + "engine_kwargs.tessera.kv_block_size=32",
                      r + "engine_kwargs.tessera.max_kv_blocks=100", r + "enable_prefix_caching=false",
                      "actor_rollout_ref.actor.fsdp_config.sharding_strategy=NO_SHARD",
                      "actor_rollout_ref.ref.fsdp_config.wrap_policy.disable=true",
                      "critic.model.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer]",
                      "critic.model.use_liger=true", "reward_model.model.use_liger=true"}) {
    overrides.push_back(o);
  }
  json cfg = load_ok(overrides);
  const json& tessera = cfg["actor_rollout_ref"]["rollout"]["engine_kwargs"]["tessera"];
  EXPECT_EQ(tessera["sampler"], "torch");
  EXPECT_EQ(tessera["fused_layers"], false);
  EXPECT_EQ(tessera["split_decode_attention"], false);
  EXPECT_EQ(tessera["kv_block_size"], 32);
  EXPECT_EQ(cfg["actor_rollout_ref"]["actor"]["fsdp_config"]["sharding_strategy"], "NO_SHARD");
  EXPECT_EQ(cfg["critic"]["model"]["use_liger"], true);
  EXPECT_TRUE(validate_ppo_config(cfg).ok()) << validate_ppo_config(cfg).to_string();
  auto sft = load_config(ConfigKind::sft, {}, {"model.fsdp_config.sharding_strategy=NO_SHARD",
                                               "model.fsdp_config.wrap_policy.disable=true"});
  EXPECT_TRUE(sft.ok()) << sft.status().to_string();
}

TEST(Config, GrpoNeedsNoCriticMicroBatch) {
  auto overrides = valid_overrides();
  overrides.push_back("algorithm.adv_estimator=grpo");
  overrides.push_back("critic.ppo_micro_batch_size_per_gpu=null");
  overrides.push_back("actor_rollout_ref.actor.use_kl_loss=true");
  json cfg = load_ok(overrides);
  EXPECT_FALSE(need_critic(cfg));
  EXPECT_TRUE(need_reference_policy(cfg));
  EXPECT_TRUE(validate_ppo_config(cfg).ok()) << validate_ppo_config(cfg).to_string();
}

TEST(Config, SftDefaultsAndRules) {
  auto cfg = load_config(ConfigKind::sft, {}, {"trainer.n_gpus_per_node=2", "data.train_batch_size=8"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ((*cfg)["data"]["prompt_key"], "question");
  EXPECT_EQ((*cfg)["data"]["response_key"], "answer");
  EXPECT_EQ((*cfg)["trainer"]["checkpoint"]["load_contents"], json::array({"model", "optimizer", "extra"}));
  EXPECT_TRUE(validate_sft_config(*cfg).ok()) << validate_sft_config(*cfg).to_string();
  auto bad = load_config(ConfigKind::sft, {}, {"trainer.n_gpus_per_node=2", "data.train_batch_size=12"});
  ASSERT_TRUE(bad.ok());
  Status st = validate_sft_config(*bad);
  EXPECT_NE(st.message().find("data.micro_batch_size_per_gpu = 4"), std::string::npos) << st.message();
}

TEST(Config, TypedGetters) {
  json cfg = load_ok({});
  EXPECT_EQ(*config_get<int64_t>(cfg, "data.train_batch_size"), 1024);
  EXPECT_EQ(*config_get<std::string>(cfg, "data.prompt_key"), "prompt");
  EXPECT_FALSE(config_get<std::optional<int64_t>>(cfg, "trainer.total_training_steps")->has_value());
  EXPECT_EQ(*config_get_or<int64_t>(cfg, "data.seed", 1), 1);
  auto missing = config_get<int64_t>(cfg, "data.nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::not_found);
  EXPECT_NE(missing.status().message().find("data.nope"), std::string::npos);
  auto wrong = config_get<int64_t>(cfg, "data.prompt_key");
  EXPECT_NE(wrong.status().message().find("data.prompt_key"), std::string::npos);
  auto list = config_get<std::vector<std::string>>(cfg, "trainer.logger");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

using testing::ScopedEnv;

TEST(Config, ModelPathsExpandHomeAndFindHubRepoIdsInTheLocalCache) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera_model_paths_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path repo = root / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots" / "abc123");
  fs::create_directories(repo / "snapshots" / "old456");
  std::ofstream(repo / "refs" / "main") << "abc123\n";
  const fs::path single = root / "hub" / "models--org--one" / "snapshots" / "only";
  fs::create_directories(single);
  fs::create_directories(root / "local" / "Org" / "model");
  ScopedEnv hub("HF_HUB_CACHE", (root / "hub").string());
  ScopedEnv home("HOME", root.string());
  const json cfg = load_ok({"actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "critic.model.path=~/models/critic",
                            "reward_model.model.path=Org/not-cached", "data.tokenizer=org/one"});
  const std::string snapshot = (repo / "snapshots" / "abc123").string();
  EXPECT_EQ(cfg["actor_rollout_ref"]["model"]["path"], snapshot);       // refs/main's snapshot
  EXPECT_EQ(cfg["critic"]["model"]["tokenizer_path"], snapshot);        // interpolated from it
  EXPECT_EQ(cfg["reward_model"]["model"]["input_tokenizer"], snapshot);
  EXPECT_EQ(cfg["critic"]["model"]["path"], (root / "models" / "critic").string());
  EXPECT_EQ(cfg["reward_model"]["model"]["path"], "Org/not-cached");  // left for the loader to name
  EXPECT_EQ(cfg["data"]["tokenizer"], single.string());                // no refs/main: the only snapshot
  // A directory that exists is taken as written, even when it reads like a repo id.
  const fs::path cwd = fs::current_path();
  fs::current_path(root / "local");
  const json local = load_ok({"actor_rollout_ref.model.path=Org/model"});
  fs::current_path(cwd);
  EXPECT_EQ(local["actor_rollout_ref"]["model"]["path"], "Org/model");
  const auto sft = load_config(ConfigKind::sft, {}, {"model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct"});
  ASSERT_TRUE(sft.ok()) << sft.status().to_string();
  EXPECT_EQ((*sft)["model"]["partial_pretrain"], snapshot);
  EXPECT_EQ(expand_user("~"), root.string());
  EXPECT_EQ(expand_user("a/~/b"), "a/~/b");
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera::driver
