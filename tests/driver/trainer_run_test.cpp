// RayPPOTrainer end to end on the embedded runtime (2 CPU ranks, a tiny Qwen2): a GRPO run and a
// PPO run (GAE + critic + reference policy with KL in the reward), a few steps each, through every
// worker group. The checks are structural (every step's metrics, verl's names, the jsonl log) plus
// invariants that follow from the data: scores are 0/1 accuracies, response lengths are within
// [1, max_response_length], GRPO advantages have zero mean per group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "driver/plot.hpp"
#include "driver/ppo_trainer.hpp"
#include "driver/profiler.hpp"
#include "proto/device.hpp"
#include "tests/driver/trainer_test_util.hpp"
#include "tests/workers/rollout/verl_agent_stubs.hpp"
#include "workers/models/model_io.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

void expect_step_metrics(const Metrics& m, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    auto it = m.find(k);
    ASSERT_NE(it, m.end()) << "missing metric " << k;
    EXPECT_TRUE(std::isfinite(it->second)) << k << " = " << it->second;
  }
  EXPECT_GE(m.at("critic/score/min"), 0.0);
  EXPECT_LE(m.at("critic/score/max"), 1.0);
  EXPECT_GE(m.at("response_length/min"), 1.0);
  EXPECT_LE(m.at("response_length/max"), 4.0);
}

TEST(TrainerRun, GrpoThreeSteps) {
  TempDir dir("grpo");
  testing::make_tiny_run(dir.path());
  auto t = testing::fit_trainer(testing::tiny_ppo_overrides(dir.path(), "grpo", 3));
  ASSERT_NE(t, nullptr);
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 4u);  // validation before training + 3 steps
  EXPECT_EQ(h[0].first, 0);
  bool has_val = false;
  for (const auto& [k, v] : h[0].second) has_val |= k.rfind("val-core/tessera/arith/", 0) == 0;
  EXPECT_TRUE(has_val);
  for (int64_t step = 1; step <= 3; ++step) {
    const Metrics& m = h[static_cast<size_t>(step)].second;
    EXPECT_EQ(h[static_cast<size_t>(step)].first, step);
    expect_step_metrics(m, {"timing_s/gen", "timing_s/reward", "actor/entropy", "timing_s/adv",
                            "timing_s/update_actor", "timing_s/step", "actor/pg_loss", "actor/grad_norm",
                            "critic/score/mean", "critic/advantages/mean", "response_length/mean",
                            "prompt_length/mean", "global_seqlen/balanced_max", "perf/throughput",
                            "training/global_step"});
    EXPECT_EQ(m.count("timing_s/values"), 0u);  // no critic for GRPO
    EXPECT_EQ(m.at("training/global_step"), static_cast<double>(step));
  }
  // test_freq=2: validation at step 2 and at the last step.
  for (int64_t step : {2, 3}) {
    bool val = false;
    for (const auto& [k, v] : h[static_cast<size_t>(step)].second) val |= k.rfind("val-core/", 0) == 0;
    EXPECT_TRUE(val) << "step " << step;
  }
  auto rows = read_metrics_jsonl(dir.path() / "run" / "metrics.jsonl");
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_EQ(rows->size(), 4u);
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A verl run as verl users write it: parquet data (written by pandas), their Python reward
// function, trainer.logger as a plain string; and what it writes besides metrics: generation
// dumps, logged validation samples, an HF model beside the checkpoint (save_contents: hf_model),
// the resolved config, and the start-up summary.
TEST(TrainerRun, VerlStyleRunWithParquetAndPythonReward) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with pandas) is not set";
  TempDir dir("grpo_outputs");
  testing::make_tiny_run(dir.path());
  const std::string d = dir.path().string();
  std::ofstream(dir.path() / "to_parquet.py") << "import sys, pandas as pd\n"
                                                 "for name in ('rl_train', 'rl_val'):\n"
                                                 "    df = pd.read_json(f'{sys.argv[1]}/{name}.jsonl', lines=True)\n"
                                                 "    df.to_parquet(f'{sys.argv[1]}/{name}.parquet')\n";
  ASSERT_EQ(std::system(fmt::format("{} {}/to_parquet.py {}/data", py, d, d).c_str()), 0);
  std::ofstream(dir.path() / "reward.py")
      << "import re\n"
         "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
         "    m = re.search(r'-?[0-9]+', solution_str)\n"
         "    ok = m is not None and m.group(0) == str(ground_truth)\n"
         "    return {'score': float(ok), 'acc': ok}\n";
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 2);
  for (const std::string& o : std::vector<std::string>{"data.train_files=" + d + "/data/rl_train.parquet",
                        "data.val_files=" + d + "/data/rl_val.parquet",
                        "custom_reward_function.path=" + d + "/reward.py", "custom_reward_function.processes=2",
                        "trainer.logger=console", "trainer.rollout_data_dir=" + d + "/rollouts",
                        "trainer.validation_data_dir=" + d + "/val", "trainer.log_val_generations=3",
                        "trainer.save_freq=2",
                        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"}) {
    overrides.push_back(o);
  }
  std::FILE* console = std::tmpfile();
  auto t = testing::fit_trainer(overrides, console);
  ASSERT_NE(t, nullptr);
  std::rewind(console);
  std::string out;
  for (int c; (c = std::fgetc(console)) != EOF;) out += static_cast<char>(c);
  std::fclose(console);
  EXPECT_NE(out.find("tessera: GRPO on cpu in this process: global_pool/actor_rollout (2 ranks)"), std::string::npos) << out;
  EXPECT_NE(out.find("tessera: starting at step 1"), std::string::npos) << out;
  EXPECT_NE(out.find("tessera: model: Qwen2ForCausalLM at " + d + "/model: 2 layers, "), std::string::npos) << out;
  EXPECT_NE(out.find("[validation sample 3]"), std::string::npos) << out;
  EXPECT_EQ(out.find("[validation sample 4]"), std::string::npos) << out;
  EXPECT_NE(out.find("step:2 - "), std::string::npos) << out;  // the console backend, from a string

  for (int step : {1, 2}) {  // 4 prompts x n=2 per step
    auto rows = read_jsonl(dir.path() / "rollouts" / (std::to_string(step) + ".jsonl"));
    ASSERT_EQ(rows.size(), 8u) << step;
    for (const auto& r : rows) {
      EXPECT_EQ(r["step"], step);
      EXPECT_TRUE(r["input"].is_string() && r["output"].is_string());
      EXPECT_TRUE(r["score"] == 0.0 || r["score"] == 1.0) << r.dump();
      EXPECT_TRUE(r["gts"].is_string()) << r.dump();
      EXPECT_NE(r["input"].get<std::string>().find('='), std::string::npos) << r.dump();  // "3+4=" prompts
    }
  }
  for (int step : {0, 2}) {  // before training and at the last step: the 8 validation prompts
    auto rows = read_jsonl(dir.path() / "val" / (std::to_string(step) + ".jsonl"));
    ASSERT_EQ(rows.size(), 8u) << step;
    EXPECT_TRUE(rows[0].contains("acc")) << rows[0].dump();  // the reward extra info
  }
  const auto hf = dir.path() / "run" / "global_step_2" / "actor" / "huggingface";
  EXPECT_TRUE(std::filesystem::exists(hf / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(hf / "model.safetensors") || std::filesystem::exists(hf / "model.safetensors.index.json"));
  auto yaml = read_yaml_file(dir.path() / "run" / "config.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status().to_string();
  EXPECT_EQ((*yaml)["trainer"]["log_val_generations"], 3);
  EXPECT_EQ((*yaml)["trainer"]["logger"], nlohmann::json::array({"console"}));
}

// rollout.multi_turn: the rollout worker renders each prompt with the tools' schemas (here a
// template that marks their presence with "t"), hosts verl's tools, and the step trains on its
// output. The tiny model never writes a <tool_call>; multi_turn_test.cpp drives the tool turns.
TEST(TrainerRun, MultiTurnRolloutRendersTheToolsAndTrains) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl) is not set";
  TempDir dir("multi_turn");
  testing::make_tiny_run(dir.path());
  dir.write("model/chat_template.jinja",
            "{% if tools %}t{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}");
  dir.write("py/ray/__init__.py", "ObjectRef = object\n");  // verl imports ray for DataProtoFuture only
  const auto tools = dir.write("tools.yaml", R"(tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: reward
        parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
)");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_TOOL_PYTHON", py);
  for (int tp : {1, 2}) {  // with rollout TP, rank 0 of each TP group hosts the tools for both peers
    const std::string gen = dir.path().string() + "/gen" + std::to_string(tp);
    auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
    for (const std::string& o : std::vector<std::string>{"actor_rollout_ref.rollout.multi_turn.enable=true",
                                 "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + tools.string(),
                                 "actor_rollout_ref.rollout.tensor_model_parallel_size=" + std::to_string(tp),
                                 "trainer.val_before_train=false", "trainer.rollout_data_dir=" + gen}) {
      overrides.push_back(o);
    }
    auto t = testing::fit_trainer(overrides);
    ASSERT_NE(t, nullptr) << "tp " << tp;
    const Metrics& m = t->history().back().second;
    EXPECT_EQ(m.at("rollout/tool_calls_mean"), 0.0);
    EXPECT_EQ(m.at("rollout/assistant_turns_mean"), 1.0);
    EXPECT_EQ(m.at("num_turns/mean"), 2.0);  // one assistant turn + 1, as verl counts
    EXPECT_TRUE(std::isfinite(m.at("actor/pg_loss")));
    auto rows = read_jsonl(std::filesystem::path(gen) / "1.jsonl");
    ASSERT_EQ(rows.size(), 8u);
    for (const auto& r : rows) EXPECT_EQ(r["input"].get<std::string>().rfind('t', 0), 0u) << r.dump();
  }
}

// rollout.mode=async: verl's agent loops; rows without agent_name are single_turn_agent ones.
TEST(TrainerRun, AsyncModeRunsTheSingleTurnAgentLoop) {
  TempDir dir("async");
  testing::make_tiny_run(dir.path());
  dir.write("model/chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  overrides.push_back("actor_rollout_ref.rollout.mode=async");
  overrides.push_back("trainer.val_before_train=false");
  auto t = testing::fit_trainer(overrides);
  ASSERT_NE(t, nullptr);
  const Metrics& m = t->history().back().second;
  EXPECT_EQ(m.at("num_turns/mean"), 2.0);  // single_turn_agent's
  EXPECT_EQ(m.at("rollout/assistant_turns_mean"), 1.0);
  EXPECT_TRUE(std::isfinite(m.at("actor/pg_loss")));
}

// rollout.agent.agent_loop_config_path: the user's loop (here registered as single_turn_agent,
// replacing verl's, so the dataset's rows without agent_name run it) generates with the engine,
// through rank 0 of each TP group with rollout TP, and the step trains on what it returned.
TEST(TrainerRun, CustomAgentLoopsGenerateAndTrain) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl and hydra) is not set";
  TempDir dir("agent_loops");
  testing::make_tiny_run(dir.path());
  dir.write("model/chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  dir.write("py/sitecustomize.py", rollout::testing::kVerlAgentStubs);
  dir.write("py/echo_agent.py", R"PY(
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
class EchoAgent(AgentLoopBase):
    """Asks twice, the second time with the first answer and its prompt (whose blocks the engine reuses)."""
    async def run(self, messages, sampling_params):
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        first = await self.server_manager.generate("r", prompt_ids=prompt, sampling_params=sampling_params)
        ids = await self.server_manager.generate("r", prompt_ids=prompt + first, sampling_params=sampling_params)
        ids = ids[: self.config.actor_rollout_ref.rollout.response_length]
        return AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=[1] * len(ids), num_turns=3,
                               metrics={"generate_sequences": 0.1, "tool_calls": 0.0})
)PY");
  const auto loops = dir.write("loops.yaml", "- name: single_turn_agent\n  _target_: echo_agent.EchoAgent\n");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_AGENT_PYTHON", py);
  for (int tp : {1, 2}) {
    auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
    for (const std::string& o : std::vector<std::string>{
             "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.agent_loop_config_path=" + loops.string(),
             "actor_rollout_ref.rollout.tensor_model_parallel_size=" + std::to_string(tp), "trainer.val_before_train=false",
             "actor_rollout_ref.rollout.engine_kwargs.tessera.kv_block_size=2"}) {  // the prompts are a few tokens
      overrides.push_back(o);
    }
    auto t = testing::fit_trainer(overrides);
    ASSERT_NE(t, nullptr) << "tp " << tp;
    const Metrics& m = t->history().back().second;
    EXPECT_EQ(m.at("num_turns/mean"), 3.0) << tp;  // the loop's num_turns
    EXPECT_NEAR(m.at("timing_s/agent_loop/generate_sequences/mean"), 0.1, 1e-9) << tp;
    EXPECT_GT(m.at("rollout/cached_prompt_tokens"), 0.0) << tp;  // the second asks reuse the first's blocks
    EXPECT_TRUE(std::isfinite(m.at("actor/pg_loss"))) << tp;
    EXPECT_GT(m.at("response_length/mean"), 0.0) << tp;
  }
}

// examples/agent_loop: the self-check loop (registered here as single_turn_agent, so the rows
// without agent_name run it) answers, is asked to check, answers again; the follow-up is masked.
TEST(TrainerRun, TheSelfCheckAgentLoopExampleTrains) {
  const std::string py = testing::tessera_python();
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  if (py.empty() || src == nullptr) GTEST_SKIP() << "TESSERA_PYTHON (with verl and hydra) and TESSERA_SOURCE_DIR";
  TempDir dir("self_check");
  testing::make_tiny_run(dir.path());
  dir.write("model/chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  dir.write("py/sitecustomize.py", rollout::testing::kVerlAgentStubs);
  const auto loops = dir.write("loops.yaml", "- name: single_turn_agent\n  _target_: self_check.SelfCheckAgentLoop\n"
                                             "  follow_up: check\n");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string() + ":" + src + "/examples/agent_loop");
  testing::ScopedEnv python("TESSERA_AGENT_PYTHON", py);
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  for (const std::string& o : std::vector<std::string>{
           "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.agent_loop_config_path=" + loops.string(),
           "data.max_response_length=16", "trainer.val_before_train=false",
           "actor_rollout_ref.rollout.engine_kwargs.tessera.kv_block_size=2"}) {
    overrides.push_back(o);
  }
  auto t = testing::fit_trainer(overrides);
  ASSERT_NE(t, nullptr);
  const Metrics& m = t->history().back().second;
  EXPECT_EQ(m.at("num_turns/mean"), 4.0);  // both answers, 8 tokens at most each, fit the 16
  EXPECT_GT(m.at("rollout/cached_prompt_tokens"), 0.0);
  EXPECT_TRUE(std::isfinite(m.at("actor/pg_loss")));
}

// data.custom_cls: the user's dataset class (here one that reads the JSONL rows itself and puts an
// "x" before each question) builds the train and validation sets, and the step trains on them.
TEST(TrainerRun, CustomDatasetClassFeedsTheRun) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl) is not set";
  TempDir dir("custom_cls");
  testing::make_tiny_run(dir.path());
  dir.write("py/ray/__init__.py", "ObjectRef = object\n");  // verl imports ray for DataProtoFuture only
  const auto module = dir.write("prompts.py", R"PY(
import json, torch
from torch.utils.data import Dataset
class MarkedPrompts(Dataset):
    def __init__(self, data_files, tokenizer, processor, config):
        files = [data_files] if isinstance(data_files, str) else data_files  # as configured, as verl passes it
        self.rows = [json.loads(line) for f in files for line in open(f) if line.strip()]
        self.tokenizer, self.width = tokenizer, config.max_prompt_length
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        row = dict(self.rows[i])
        messages = [{**m, "content": "x" + m["content"]} for m in row.pop("prompt")]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        pad = self.width - len(ids)
        row.update(input_ids=torch.tensor([0] * pad + ids), attention_mask=torch.tensor([0] * pad + [1] * len(ids)),
                   raw_prompt=messages)
        return row
)PY");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_DATA_PYTHON", py);
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  for (const std::string& o : std::vector<std::string>{"data.custom_cls.path=" + module.string(),
                                                       "data.custom_cls.name=MarkedPrompts",
                                                       "trainer.rollout_data_dir=" + dir.path().string() + "/gen"}) {
    overrides.push_back(o);
  }
  auto t = testing::fit_trainer(overrides);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(std::isfinite(t->history().back().second.at("actor/pg_loss")));
  auto rows = read_jsonl(dir.path() / "gen" / "1.jsonl");
  ASSERT_EQ(rows.size(), 8u);
  for (const auto& r : rows) EXPECT_NE(r["input"].get<std::string>().find("userx"), std::string::npos) << r.dump();
}

// data.sampler.class_path: a curriculum sampler (verl's AbstractCurriculumSampler) over verl's own
// RLHFDataset of the parquet training files picks every batch (here the rows in reverse order),
// and after each step sees that step's batch as a verl DataProto: the rows it drew, n samples
// each, with the scores, advantages and the other columns verl's batch has. A run resumed from
// step 2's checkpoint draws the batches the uninterrupted run drew next (the sampler's order
// depends on its state when the epoch's iterator is taken) and restores its state_dict.
TEST(TrainerRun, CurriculumSamplerPicksTheBatchesAndSeesEachStep) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl) is not set";
  TempDir dir("sampler");
  testing::make_tiny_run(dir.path());
  const std::string d = dir.path().string();
  dir.write("py/ray/__init__.py", "ObjectRef = object\n");  // verl imports ray for DataProtoFuture only
  dir.write("to_parquet.py", "import sys, pandas as pd\n"
                             "df = pd.read_json(f'{sys.argv[1]}/rl_train.jsonl', lines=True)\n"
                             "df.to_parquet(f'{sys.argv[1]}/rl_train.parquet')\n");
  ASSERT_EQ(std::system(fmt::format("{} {}/to_parquet.py {}/data", py, d, d).c_str()), 0);
  const auto module = dir.write("curriculum.py", R"PY(
import json, os
from verl.experimental.dataset.sampler import AbstractCurriculumSampler

class ReverseCurriculum(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.n, self.drawn, self.updates, self.iters = len(data_source), [], 0, 0
        self.log = os.environ["TESSERA_TEST_SAMPLER_LOG"]
    def __iter__(self):  # odd iterations backwards, even ones forwards: the order depends on the state
        self.iters += 1
        for i in (reversed(range(self.n)) if self.iters % 2 else range(self.n)):
            self.drawn.append(i)
            yield i
    def __len__(self):
        return self.n
    def update(self, batch):
        self.updates += 1
        with open(self.log, "a") as f:
            f.write(json.dumps({"drawn": self.drawn, "updates": self.updates,
                                "rows": [int(e["index"]) for e in batch.non_tensor_batch["extra_info"]],
                                "uids": len(set(batch.non_tensor_batch["uid"])), "keys": sorted(batch.batch.keys()),
                                "scores": batch.batch["token_level_scores"].shape[0]}) + "\n")
        self.drawn = []
    def state_dict(self):
        return {"updates": self.updates, "iters": self.iters}
    def load_state_dict(self, state):
        self.updates, self.iters = state["updates"], state["iters"]
)PY");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_DATA_PYTHON", py);
  auto run = [&](const std::string& log, int steps, const std::string& local_dir) {
    testing::ScopedEnv log_env("TESSERA_TEST_SAMPLER_LOG", log);
    auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", steps);
    for (const std::string& o : std::vector<std::string>{
             "data.train_files=" + d + "/data/rl_train.parquet", "data.sampler.class_path=" + module.string(),
             "data.sampler.class_name=ReverseCurriculum", "trainer.save_freq=2", "trainer.default_local_dir=" + local_dir,
             "trainer.resume_mode=auto"}) {
      overrides.push_back(o);
    }
    return testing::fit_trainer(overrides);
  };
  ASSERT_NE(run(d + "/full.jsonl", 3, d + "/full"), nullptr);
  const auto full = read_jsonl(dir.path() / "full.jsonl");
  ASSERT_EQ(full.size(), 3u);
  for (size_t step = 0; step < full.size(); ++step) {
    const auto& u = full[step];
    std::vector<int64_t> want;  // rows 63, 62, ... four per batch, each sampled n=2 times
    for (int64_t i = 0; i < 4; ++i) want.push_back(63 - 4 * static_cast<int64_t>(step) - i);
    std::vector<int64_t> rows = u["rows"].get<std::vector<int64_t>>(), twice;
    for (int64_t r : want) twice.insert(twice.end(), {r, r});
    std::sort(rows.begin(), rows.end());  // balance_batch reorders the batch's rows
    std::sort(twice.begin(), twice.end());
    EXPECT_EQ(u["drawn"], nlohmann::json(want)) << u.dump();
    EXPECT_EQ(rows, twice) << u.dump();
    EXPECT_EQ(u["uids"], 4);
    EXPECT_EQ(u["scores"], 8);
    for (const char* key : {"responses", "attention_mask", "old_log_probs", "token_level_scores", "advantages"}) {
      EXPECT_NE(std::find(u["keys"].begin(), u["keys"].end(), key), u["keys"].end()) << key << ": " << u.dump();
    }
  }
  // Steps 1-2, then a resumed run from step 2's checkpoint: its step 3 is the full run's.
  ASSERT_NE(run(d + "/first.jsonl", 2, d + "/resumed"), nullptr);
  ASSERT_NE(run(d + "/second.jsonl", 3, d + "/resumed"), nullptr);
  const auto second = read_jsonl(dir.path() / "second.jsonl");
  ASSERT_EQ(second.size(), 1u);
  auto sorted = [](const nlohmann::json& rows) {
    std::vector<int64_t> v = rows.get<std::vector<int64_t>>();
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(second[0]["rows"]), sorted(full[2]["rows"])) << second[0].dump();
  EXPECT_EQ(second[0]["updates"], 3);  // the restored state_dict counted steps 1 and 2
}

// A sampler that is not verl's AbstractSampler, one that yields a row the training set does not
// have, and one over a dataset other than the training set's are refused in one line naming
// data.sampler.class_path: at start, or at the step that draws the row.
TEST(TrainerRun, BadSamplersAreNamedInOneLine) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl) is not set";
  TempDir dir("bad_sampler");
  testing::make_tiny_run(dir.path());
  const std::string d = dir.path().string();
  dir.write("py/ray/__init__.py", "ObjectRef = object\n");
  dir.write("to_parquet.py", "import sys, pandas as pd\n"
                             "df = pd.read_json(f'{sys.argv[1]}/rl_train.jsonl', lines=True)\n"
                             "df.to_parquet(f'{sys.argv[1]}/rl_train.parquet')\n"
                             "df[:40].to_parquet(f'{sys.argv[1]}/short.parquet')\n");
  ASSERT_EQ(std::system(fmt::format("{} {}/to_parquet.py {}/data", py, d, d).c_str()), 0);
  const auto module = dir.write("samplers.py", R"PY(
from torch.utils.data import Sampler
from verl.experimental.dataset.sampler import AbstractSampler
class Plain(Sampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
    def __iter__(self):
        return iter(range(self.n))
    def __len__(self):
        return self.n
class Beyond(AbstractSampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
    def __iter__(self):
        return iter(range(self.n, 2 * self.n))
    def __len__(self):
        return self.n
)PY");
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "py").string());
  testing::ScopedEnv python("TESSERA_DATA_PYTHON", py);
  // (data.val_files is null: the shrinking class is built once for the training set, then once
  // for the sampler.)
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"Plain", "rl_train", "must subclass verl.experimental.dataset.sampler.AbstractSampler"},
      {"Beyond", "rl_train", "the sampler yielded index 64 of a training set of 64 rows"},
      {"Beyond", "short", "the dataset the sampler reads has 40 rows but the training set has 64"}};
  for (const auto& [name, files, want] : cases) {
    auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
    o.push_back("data.sampler.class_path=" + module.string());
    o.push_back("data.sampler.class_name=" + name);
    o.push_back("data.train_files=" + d + "/data/rl_train.parquet");
    o.push_back("data.val_files=null");
    o.push_back("trainer.val_before_train=false");
    if (files == "short") {  // a class that reads fewer rows the second time it is built (the sampler's)
      const auto other = dir.write("shrinking.py", R"PY(
import os
from verl.utils.dataset.rl_dataset import RLHFDataset
class Shrinking(RLHFDataset):
    def __init__(self, data_files, **kw):
        marker = data_files + ".seen"
        if os.path.exists(marker):
            data_files = data_files.replace("rl_train", "short")
        open(marker, "w").close()
        super().__init__(data_files=data_files, **kw)
)PY");
      o.push_back("data.custom_cls.path=" + other.string());
      o.push_back("data.custom_cls.name=Shrinking");
    }
    auto cfg = load_config(ConfigKind::ppo, "", o);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    Status st;
    auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr, {}});
    if (!t.ok()) {
      st = t.status();
    } else {
      st = (*t)->init_workers();
      if (st.ok()) st = (*t)->fit();
    }
    ASSERT_FALSE(st.ok()) << name;
    EXPECT_NE(st.message().find("data.sampler.class_path (" + name), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(want), std::string::npos) << st.to_string();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.to_string();
  }
}

// data.reward_fn_key naming a column of the dataset's own (here `task`, the scorer's name): the
// batch carries the column, and the reward manager picks each row's scorer by it.
TEST(TrainerRun, RewardFnKeyNamesADatasetColumn) {
  TempDir dir("reward_fn_key");
  testing::make_tiny_run(dir.path());
  const auto train = dir.path() / "data" / "rl_train.jsonl";
  std::vector<nlohmann::json> rows = read_jsonl(train);
  std::ofstream out(train, std::ios::trunc);
  for (auto& r : rows) {
    r["task"] = r["data_source"];
    r["data_source"] = "not-a-scorer";
    out << r.dump() << "\n";
  }
  out.close();
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  for (const char* s : {"data.reward_fn_key=task", "trainer.val_before_train=false", "data.val_files=null"}) o.push_back(s);
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(std::isfinite(t->history().back().second.at("critic/score/mean")));
  // A key some row lacks is named at start, with the row.
  o.push_back("data.reward_fn_key=difficulty");
  auto cfg = load_config(ConfigKind::ppo, "", o);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto refused = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr, {}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("data.reward_fn_key = difficulty"), std::string::npos)
      << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("rl_train.jsonl:1"), std::string::npos) << refused.status().to_string();
}

TEST(TrainerRun, PpoWithCriticAndKlInReward) {
  TempDir dir("ppo");
  testing::make_tiny_run(dir.path());
  auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 3);
  o.push_back("algorithm.use_kl_in_reward=true");
  o.push_back("algorithm.kl_ctrl.type=adaptive");
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(t->critic_wg(), nullptr);
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 4u);
  for (int64_t step = 1; step <= 3; ++step) {
    const Metrics& m = h[static_cast<size_t>(step)].second;
    expect_step_metrics(m, {"timing_s/ref", "timing_s/values", "timing_s/update_critic", "timing_s/update_actor",
                            "critic/vf_loss", "critic/values/mean", "critic/returns/mean", "critic/rewards/mean",
                            "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "actor/pg_loss"});
  }
  // The adaptive controller starts at kl_coef (0.001) and moves once per step.
  EXPECT_DOUBLE_EQ(h[1].second.at("actor/reward_kl_penalty_coeff"), 0.001);
}

// LoRA (actor_rollout_ref.model.lora_rank) with a KL loss: verl's ref_in_actor, so no reference
// group is spawned and the actor group answers compute_ref_log_prob with its adapters disabled;
// the adapters start at B = 0, so step 1's KL against the reference is zero; the checkpoint holds
// the PEFT adapter.
TEST(TrainerRun, LoraGrpoTakesTheReferenceFromTheActor) {
  TempDir dir("lora");
  testing::make_tiny_run(dir.path());
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 2);
  for (const char* s : {"actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
                        "actor_rollout_ref.actor.optim.lr=5e-2", "trainer.save_freq=2"}) {
    o.push_back(s);
  }
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  for (const auto& [name, wg] : t->worker_groups()) EXPECT_NE(name, "ref");
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 3u);
  for (int64_t step = 1; step <= 2; ++step) {
    expect_step_metrics(h[static_cast<size_t>(step)].second, {"timing_s/ref", "actor/kl_loss", "actor/pg_loss", "actor/grad_norm"});
  }
  EXPECT_LE(std::abs(h[1].second.at("actor/kl_loss")), 1e-6);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "run" / "global_step_2" / "actor" / "lora_adapter" / "adapter_config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "run" / "global_step_2" / "actor" / "lora_adapter" / "adapter_model.safetensors"));
}

// critic.model.lora_rank (verl's critic under PEFT): adapters on every linear layer of the critic,
// its score head included, the base frozen. Its first values are the base critic's (the adapters
// start at B = 0, so they equal a run without LoRA), its adapters then train, and its checkpoint
// holds them as PEFT saves them.
TEST(TrainerRun, PpoWithACriticLoraTrainsItsAdapters) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (bool lora : {false, true}) {
    TempDir dir(lora ? "critic_lora" : "critic_plain");
    testing::make_tiny_run(dir.path());
    auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 2);
    o.push_back("trainer.save_freq=2");
    if (lora) {
      for (const char* s : {"critic.model.lora_rank=4", "critic.model.lora_alpha=8", "critic.optim.lr=5e-2"}) o.push_back(s);
    }
    auto t = testing::fit_trainer(o);
    ASSERT_NE(t, nullptr);
    runs.push_back(t->history());
    if (!lora) continue;
    const auto adapter = dir.path() / "run" / "global_step_2" / "critic" / "lora_adapter";
    ASSERT_TRUE(std::filesystem::exists(adapter / "adapter_model.safetensors"));
    std::ifstream in(adapter / "adapter_config.json");
    const nlohmann::json config = nlohmann::json::parse(in);
    EXPECT_NE(config.dump().find("score"), std::string::npos) << config.dump();
    const Metrics& second = runs.back()[2].second;
    EXPECT_TRUE(std::isfinite(second.at("critic/vf_loss")));
    EXPECT_NE(runs.back()[2].second.at("critic/values/mean"), runs.back()[1].second.at("critic/values/mean"));
  }
  EXPECT_NEAR(runs[1][1].second.at("critic/values/mean"), runs[0][1].second.at("critic/values/mean"), 1e-6);
}

// Two PPO runs (GAE, KL loss) that must train alike: every step's scores, losses and values, up to
// float rounding.
void expect_same_ppo_steps(const std::vector<std::pair<int64_t, Metrics>>& a,
                           const std::vector<std::pair<int64_t, Metrics>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 1; i < a.size(); ++i) {
    for (const char* k : {"critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss",
                          "actor/ppo_kl", "critic/vf_loss", "critic/values/mean", "actor/grad_norm"}) {
      ASSERT_TRUE(a[i].second.count(k) && b[i].second.count(k)) << k;
      const double want = a[i].second.at(k), got = b[i].second.at(k);
      EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::abs(want))) << k << " at step " << a[i].first;
    }
  }
}

// use_remove_padding end to end (actor, reference and critic forwards packed without padding):
// the same run as the padded one, step for step, up to float rounding.
TEST(TrainerRun, PaddingFreeRunMatchesThePaddedRun) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (bool packed : {false, true}) {
    TempDir dir(packed ? "rmpad" : "padded");
    testing::make_tiny_run(dir.path());
    auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 2);
    o.push_back("actor_rollout_ref.actor.use_kl_loss=true");
    o.push_back(std::string("actor_rollout_ref.model.use_remove_padding=") + (packed ? "true" : "false"));
    o.push_back(std::string("critic.model.use_remove_padding=") + (packed ? "true" : "false"));
    auto t = testing::fit_trainer(o);
    ASSERT_NE(t, nullptr);
    runs.push_back(t->history());
  }
  expect_same_ppo_steps(runs[0], runs[1]);
}

// Ulysses sequence parallelism end to end: 2 ranks in one group of 2 (actor, reference and critic
// split each micro-batch's tokens) train as 2 data-parallel ranks do, step for step: the group
// gathers both ranks' rows and runs them as the same micro-batches, and its summed gradient is
// the data-parallel average.
// Two padding-free PPO runs (GAE, KL loss) of the tiny `arch` model: Ulysses groups of 1, then 2.
void expect_ulysses_equals_data_parallel(const std::string& arch) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (int sp : {1, 2}) {
    TempDir dir(arch + "_ulysses" + std::to_string(sp));
    testing::make_tiny_run(dir.path(), arch);
    auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 2);
    for (const char* k : {"actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.model.use_remove_padding=true",
                          "critic.model.use_remove_padding=true"}) {
      o.push_back(k);
    }
    o.push_back("actor_rollout_ref.actor.ulysses_sequence_parallel_size=" + std::to_string(sp));
    o.push_back("critic.ulysses_sequence_parallel_size=" + std::to_string(sp));
    auto t = testing::fit_trainer(o);
    ASSERT_NE(t, nullptr);
    runs.push_back(t->history());
  }
  expect_same_ppo_steps(runs[0], runs[1]);
}

TEST(TrainerRun, SequenceParallelRunMatchesTheDataParallelRun) { expect_ulysses_equals_data_parallel("qwen2"); }

// A greedy GRPO run (KL loss, 2 steps, the actor saved with its HF model at step 2) of the tiny
// `arch` model with rollout TP `tp`: its history without the per-engine rollout/ counters (the TP
// engine runs both data-parallel ranks' rows), and the HF directory saved.
std::vector<std::pair<int64_t, Metrics>> greedy_run_with_rollout_tp(const TempDir& dir, const std::string& arch,
                                                                     int tp) {
  testing::make_tiny_run(dir.path(), arch);
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 2);
  for (const char* k : {"actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.do_sample=false",
                        "trainer.save_freq=2",
                        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"}) {
    o.push_back(k);
  }
  o.push_back("actor_rollout_ref.rollout.tensor_model_parallel_size=" + std::to_string(tp));
  auto t = testing::fit_trainer(o);
  if (t == nullptr) return {};
  auto history = t->history();
  for (auto& [step, m] : history) {
    for (auto it = m.begin(); it != m.end();) it = it->first.rfind("rollout/", 0) == 0 ? m.erase(it) : std::next(it);
  }
  return history;
}

// A Qwen3-MoE actor: FSDP trains the stacked experts and the router, the rollout's two TP ranks
// each take a slice of every expert straight from the FSDP shards, and the run (greedy, so the
// tokens do not depend on how rows meet the sampler's streams) equals the one with single-rank
// rollouts step for step; the HF model saved beside the checkpoint holds the experts one by one,
// as released checkpoints do, and loads back.
TEST(TrainerRun, MoeGrpoWithRolloutTpMatchesOneRankAndSavesAnHfModel) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (int tp : {1, 2}) {
    TempDir dir("moe_tp" + std::to_string(tp));
    runs.push_back(greedy_run_with_rollout_tp(dir, "qwen3_moe", tp));
    ASSERT_FALSE(runs.back().empty());
    const std::filesystem::path hf = dir.path() / "run" / "global_step_2" / "actor" / "huggingface";
    auto files = models::read_safetensors_checkpoint(hf.string());
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    EXPECT_EQ(files->count("model.layers.1.mlp.experts.3.gate_proj.weight"), 1u);
    EXPECT_EQ(files->count("model.layers.1.mlp.experts.gate_proj"), 0u);
    auto model = models::load_causal_lm(hf.string());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ((*model)->config().moe.num_experts, 4);
  }
  testing::expect_same_history(runs[0], runs[1], 1e-4);
}

// A Gemma-3 actor and reference (sliding windows that bite the prompts, q/k norms, RoPE per layer
// type): GRPO with rollout TP 2 equals TP 1 step for step (greedy), and the HF model saved beside
// the checkpoint loads back as Gemma3ForCausalLM.
TEST(TrainerRun, Gemma3GrpoWithRolloutTpMatchesOneRank) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (int tp : {1, 2}) {
    TempDir dir("gemma3_tp" + std::to_string(tp));
    runs.push_back(greedy_run_with_rollout_tp(dir, "gemma3_text", tp));
    ASSERT_FALSE(runs.back().empty());
    auto model = models::load_causal_lm((dir.path() / "run" / "global_step_2" / "actor" / "huggingface").string());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ((*model)->config().architecture, "Gemma3ForCausalLM");
    EXPECT_TRUE((*model)->config().layer_local_rope(0));
  }
  testing::expect_same_history(runs[0], runs[1], 1e-4);
}

// A Qwen3-MoE actor, reference and critic (Qwen3MoeForTokenClassification), padding-free, with
// Ulysses groups of 2 against plain data parallelism: the same run, step for step.
TEST(TrainerRun, MoeRunsPackedWithUlyssesAsWithDataParallelism) { expect_ulysses_equals_data_parallel("qwen3_moe"); }

// Note [On-policy old log-probs] (workers/ppo/dp_actor.hpp): the tiny runs are on-policy (one
// mini-batch, one epoch), so by default a step skips the old_log_prob pass and the update takes
// its own log-probs; it trains as the run that makes the pass
// (trainer.skip_on_policy_old_log_prob=false), step for step, and still reports actor/entropy.
TEST(TrainerRun, OnPolicyStepsSkipTheOldLogProbPassAndTrainAlike) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (bool skip : {false, true}) {
    TempDir dir(skip ? "old_lp_skipped" : "old_lp_pass");
    testing::make_tiny_run(dir.path());
    auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 2);
    o.push_back("actor_rollout_ref.actor.use_kl_loss=true");
    o.push_back(std::string("trainer.skip_on_policy_old_log_prob=") + (skip ? "true" : "false"));
    std::FILE* console = std::tmpfile();
    auto t = testing::fit_trainer(o, console);
    ASSERT_NE(t, nullptr);
    std::rewind(console);
    std::string out;
    for (int c; (c = std::fgetc(console)) != EOF;) out += static_cast<char>(c);
    std::fclose(console);
    EXPECT_EQ(out.find("tessera: old_log_prob: from the update's own forward") != std::string::npos, skip) << out;
    runs.push_back(t->history());
    for (size_t i = 1; i < runs.back().size(); ++i) {
      const Metrics& m = runs.back()[i].second;
      EXPECT_EQ(m.count("timing_s/old_log_prob"), skip ? 0u : 1u) << "step " << i;
      ASSERT_EQ(m.count("actor/entropy"), 1u) << "step " << i;
      EXPECT_GT(m.at("actor/entropy"), 0.0);
      if (skip) {
        EXPECT_EQ(m.at("actor/ppo_kl"), 0.0);  // the ratio is exactly 1
      }
    }
  }
  expect_same_ppo_steps(runs[0], runs[1]);
  // The skipped pass's entropy is the whole batch's token mean; the update's, the mean of its
  // micro-batches' (one per rank here, of unequal token counts): close, not equal.
  for (size_t i = 1; i < runs[0].size(); ++i) {
    const double pass = runs[0][i].second.at("actor/entropy"), update = runs[1][i].second.at("actor/entropy");
    EXPECT_NEAR(update, pass, 0.1 * pass) << "step " << i;
  }
}

// A tiny GRPO run with DAPO's dynamic sampling: a Python reward answering `reward_dict` (an
// expression of solution_str and extra_info), the filter on `metric`, data.gen_batch_size `gen`,
// no validation.
std::vector<std::string> dapo_overrides(const TempDir& dir, const std::string& reward_dict, const std::string& metric,
                                        int gen, int steps) {
  testing::make_tiny_run(dir.path());
  const std::string d = dir.path().string();
  dir.write("reward.py", "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                         "    return " + reward_dict + "\n");
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", steps);
  for (const std::string& k : {"custom_reward_function.path=" + d + "/reward.py", "data.gen_batch_size=" + std::to_string(gen),
                               std::string("algorithm.filter_groups.enable=true"), "algorithm.filter_groups.metric=" + metric,
                               std::string("trainer.val_before_train=false"), std::string("trainer.test_freq=-1")}) {
    o.push_back(k);
  }
  return o;
}

// DAPO's dynamic sampling (algorithm.filter_groups, data.gen_batch_size): a step trains only on
// prompts whose samples scored differently, train_batch_size of them from as many generation
// batches as it takes. The reward (the response length's parity) varies within some groups and
// not others; every trained group in the rollout dumps has two different scores.
TEST(TrainerRun, DynamicSamplingTrainsOnlyPromptsWhoseSamplesDiffer) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON is not set";
  TempDir dir("dapo");
  auto o = dapo_overrides(dir, "{'score': float(len(solution_str) % 2), 'idx': extra_info['index']}", "score", 6, 3);
  o.push_back("trainer.rollout_data_dir=" + dir.path().string() + "/rollouts");
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 3u);
  int64_t gen_batches = 0;
  for (const auto& [step, m] : h) {
    ASSERT_EQ(m.count("train/num_gen_batches"), 1u) << step;
    gen_batches += static_cast<int64_t>(m.at("train/num_gen_batches"));
    const auto rows = read_jsonl(dir.path() / "rollouts" / fmt::format("{}.jsonl", step));
    ASSERT_EQ(rows.size(), 8u) << step;  // train_batch_size 4 x n 2
    std::map<int64_t, std::set<double>> scores;
    for (const auto& r : rows) scores[r["idx"].get<int64_t>()].insert(r["score"].get<double>());
    for (const auto& [idx, values] : scores) EXPECT_EQ(values.size(), 2u) << "step " << step << " prompt " << idx;
  }
  EXPECT_GT(gen_batches, 3);  // some step needed a second generation batch
}

// Steps that take several generation batches run out of data before total_training_steps (the
// loader's batch count): the run ends there, and its last trained step is saved.
TEST(TrainerRun, DynamicSamplingThatRunsOutOfDataSavesTheLastStep) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON is not set";
  TempDir dir("dapo_end");
  auto o = dapo_overrides(dir, "{'score': float(len(solution_str) % 2)}", "score", 4, 1);
  o.push_back("trainer.total_training_steps=null");
  o.push_back("trainer.save_freq=100");
  auto t = testing::fit_trainer(o);  // 16 loader batches; each step needs more than one
  ASSERT_NE(t, nullptr);
  const auto& h = t->history();
  ASSERT_FALSE(h.empty());
  const int64_t last = h.back().first;
  EXPECT_LT(last, 16);
  EXPECT_EQ(t->global_steps(), last);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "run" / fmt::format("global_step_{}", last)));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "run" / fmt::format("global_step_{}", last - 1)));
}

// A reward that never varies within a group: max_num_gen_batches stops the run in one line; with
// no limit the data runs out, and the run ends untrained, as verl's.
TEST(TrainerRun, DynamicSamplingThatKeepsNothingStopsOrRunsOutOfData) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON is not set";
  TempDir dir("dapo_flat");
  auto o = dapo_overrides(dir, "{'score': 1.0, 'acc': True}", "acc", 16, 2);
  auto limited = o;
  limited.push_back("algorithm.filter_groups.max_num_gen_batches=2");
  auto cfg = load_config(ConfigKind::ppo, "", limited);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  PpoTrainerOptions options;
  options.progress = nullptr;
  auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), options);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE((*t)->init_workers().ok());
  Status st = (*t)->fit();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("dynamic sampling kept 0 of data.train_batch_size = 4 prompts in "
                              "algorithm.filter_groups.max_num_gen_batches = 2 generation batches"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
  o.push_back("trainer.save_freq=1");
  auto ran_out = testing::fit_trainer(o);  // 64 prompts in 4 batches of 16, none kept
  ASSERT_NE(ran_out, nullptr);
  EXPECT_TRUE(ran_out->history().empty());
  EXPECT_EQ(ran_out->global_steps(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "run" / "global_step_1"));  // nothing trained, nothing saved
  o.push_back("algorithm.filter_groups.metric=no_such_key");
  cfg = load_config(ConfigKind::ppo, "", o);
  ASSERT_TRUE(cfg.ok());
  t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), options);
  ASSERT_TRUE(t.ok() && (*t)->init_workers().ok());
  st = (*t)->fit();
  EXPECT_NE(st.message().find("algorithm.filter_groups.metric = 'no_such_key' is not a reward extra-info key"),
            std::string::npos)
      << st.message();
  // Refused before starting: no metric; KL in the reward (it would need every batch's log-probs).
  for (const auto& [patch, want] : std::vector<std::pair<std::string, std::string>>{
           {"algorithm.filter_groups.metric=null", "needs algorithm.filter_groups.metric"},
           {"algorithm.use_kl_in_reward=true", "with algorithm.use_kl_in_reward=true is not supported"}}) {
    auto bad = o;
    bad.push_back(patch);
    auto c = load_config(ConfigKind::ppo, "", bad);
    Status why = c.ok() ? RayPPOTrainer::create(std::move(*c), testing::trainer_registry(), options).status() : c.status();
    ASSERT_FALSE(why.ok()) << patch;
    EXPECT_NE(why.message().find(want), std::string::npos) << why.message();
  }
}

// reward_model.launch_reward_fn_async: the reward scores beside the log-prob, reference and value
// passes; the run is the synchronous one, step for step (PPO with a critic and KL in the reward,
// whose penalty reads the scores after the join).
TEST(TrainerRun, AsyncRewardRunMatchesTheSynchronousRun) {
  std::vector<std::vector<std::pair<int64_t, Metrics>>> runs;
  for (bool async : {false, true}) {
    TempDir dir(async ? "reward_async" : "reward_sync");
    testing::make_tiny_run(dir.path());
    auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 2);
    o.push_back("actor_rollout_ref.actor.use_kl_loss=true");
    o.push_back("algorithm.use_kl_in_reward=true");
    o.push_back(std::string("reward_model.launch_reward_fn_async=") + (async ? "true" : "false"));
    auto t = testing::fit_trainer(o);
    ASSERT_NE(t, nullptr);
    runs.push_back(t->history());
  }
  expect_same_ppo_steps(runs[0], runs[1]);
  for (size_t i = 1; i < runs[0].size(); ++i) {
    for (const char* k : {"actor/reward_kl_penalty", "critic/rewards/mean", "critic/score/mean"}) {
      ASSERT_TRUE(runs[1][i].second.count(k)) << k;
      EXPECT_NEAR(runs[1][i].second.at(k), runs[0][i].second.at(k), 1e-6) << k << " at step " << i;
    }
  }
}

TEST(TrainerRun, BadConfigIsRefusedBeforeStarting) {
  TempDir dir("bad");
  testing::make_tiny_run(dir.path());
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 3);
  o.push_back("data.train_batch_size=3");  // 3 x n=2 rows cannot be split over 2 ranks' mini-batches
  auto cfg = load_config(ConfigKind::ppo, "", o);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr, {}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
}

// Every row's data_source needs a scorer before the first step: an unknown one is named with its
// file and line; one that only verl's Python scores needs verl importable by the reward
// interpreter (here, python3 without verl's dependencies: refused, naming the source).
TEST(TrainerRun, DataSourcesWithoutAScorerAreRefusedAtStart) {
  TempDir dir("no_scorer");
  testing::make_tiny_run(dir.path());
  for (auto [source, want] : {std::pair<std::string, std::string>{"my/new_task", "no reward scorer for data_source 'my/new_task'"},
                              {"numina_olympiads", "data_source 'numina_olympiads' is scored by verl's Python"}}) {
    std::ifstream in(dir.path() / "data" / "rl_val.jsonl");
    std::string text, line;
    int n = 0;
    while (std::getline(in, line)) {
      auto row = nlohmann::json::parse(line);
      if (++n == 3) row["data_source"] = source;
      text += row.dump() + "\n";
    }
    std::ofstream(dir.path() / "data" / "odd_val.jsonl") << text;
    auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
    o.push_back("data.val_files=" + (dir.path() / "data" / "odd_val.jsonl").string());
    auto cfg = load_config(ConfigKind::ppo, "", o);
    ASSERT_TRUE(cfg.ok());
    auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr, {}});
    ASSERT_FALSE(t.ok()) << source;
    EXPECT_NE(t.status().message().find(want), std::string::npos) << t.status().message();
    if (source == "my/new_task") {
      EXPECT_NE(t.status().message().find("odd_val.jsonl:3"), std::string::npos) << t.status().message();
    }
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  }
}

TEST(TrainerRun, CudaWithoutThatGpuIsRefusedInOneLine) {
  // trainer.device=cuda must run on the GPU or stop: never compute on the CPU instead.
  TempDir dir("grpo_no_gpu");
  testing::make_tiny_run(dir.path());
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  for (auto& o : overrides) {
    if (o.rfind("trainer.n_gpus_per_node=", 0) == 0) o = "trainer.n_gpus_per_node=" + std::to_string(proto::cuda_device_count() + 1);
    if (o.rfind("trainer.device=", 0) == 0) o = "trainer.device=cuda";
  }
  auto cfg = load_config(ConfigKind::ppo, "", overrides);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  PpoTrainerOptions o;
  o.console = nullptr;
  o.progress = nullptr;
  auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), o);
  Status st = t.ok() ? (*t)->init_workers() : t.status();
  ASSERT_FALSE(st.ok()) << "a cuda run must not fall back to the CPU";
  EXPECT_NE(st.message().find(fmt::format("trainer.device=cuda: {} device(s) needed", proto::cuda_device_count() + 1)),
            std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("set trainer.device=cpu"), std::string::npos) << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.to_string();
}

TEST(TrainerRun, ProfileStepsTraceTheListedStepsOnEveryRank) {
  TempDir dir("grpo_profile");
  testing::make_tiny_run(dir.path());
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 2);
  overrides.push_back("trainer.profile_steps=[2]");
  std::FILE* console = std::tmpfile();
  ASSERT_NE(console, nullptr);
  auto t = testing::fit_trainer(overrides, console);
  ASSERT_NE(t, nullptr);
  const auto profile = dir.path() / "run" / "profile";
  EXPECT_FALSE(std::filesystem::exists(profile / "step_1.pt.trace.json"));
  std::ifstream in(profile / "step_2.pt.trace.json");
  ASSERT_TRUE(in.good()) << "no trace for step 2";
  const auto trace = nlohmann::json::parse(in);
  // The model runs only on the ranks' threads: their ops are in the trace, not just the driver's.
  int64_t embeddings = 0;
  for (const auto& e : trace.at("traceEvents")) embeddings += e.value("name", "") == "aten::embedding" ? 1 : 0;
  EXPECT_GE(embeddings, 2) << "the ranks' forward passes are missing from the trace";
  std::rewind(console);
  std::string printed;
  for (int c; (c = std::fgetc(console)) != EOF;) printed.push_back(static_cast<char>(c));
  std::fclose(console);
  EXPECT_NE(printed.find("tessera: step 2 trace: " + (profile / "step_2.pt.trace.json").string()), std::string::npos)
      << printed;
  EXPECT_EQ(printed.find("step 1 trace"), std::string::npos) << printed;
}

TEST(TrainerRun, ProfileStepsAreRefusedWhereTheTraceCannotCoverTheRanks) {
  nlohmann::json cfg = {{"trainer", {{"profile_steps", {1}}, {"default_local_dir", "run"}, {"device", "cpu"}}},
                        {"cluster", {{"agents", nlohmann::json::array({nlohmann::json::object()})}}}};
  auto p = StepProfiler::from_config(cfg);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("trainer.profile_steps"), std::string::npos) << p.status().to_string();
  EXPECT_NE(p.status().message().find("cluster.agents"), std::string::npos) << p.status().to_string();
  cfg["cluster"] = nlohmann::json::object();
  cfg["trainer"]["profile_steps"] = {0};
  p = StepProfiler::from_config(cfg);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("step 0"), std::string::npos) << p.status().to_string();
  cfg["trainer"]["profile_steps"] = nullptr;
  p = StepProfiler::from_config(cfg);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(*p, nullptr);
}

}  // namespace
}  // namespace tessera::driver
