// The user's agent loops (rollout.agent.agent_loop_config_path) run by verl's own Python against a
// scripted engine: verl's ToolAgentLoop and SingleTurnAgentLoop through the bridge give the same
// batch as Tessera's native loops; a custom loop's requests are batched, sampled per request and
// assembled as verl's _postprocess; every bad answer, raising, hung or dying loop is a one-line
// error. Needs $TESSERA_PYTHON with verl, hydra and transformers, and the golden Qwen3 tokenizer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "tests/driver/driver_test_util.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"
#include "tests/workers/rollout/scripted_engine.hpp"
#include "tests/workers/rollout/verl_agent_stubs.hpp"
#include "workers/rollout/agent_loops.hpp"
#include "workers/rollout/multi_turn.hpp"

namespace tessera::rollout {
namespace {

using driver::testing::ScopedEnv;
using driver::testing::TempDir;
using nlohmann::json;
using testing::cat;
using testing::row_of;
using testing::kGsm8kTools;
using testing::ScriptedEngine;

constexpr int64_t kImEnd = 151645;  // Qwen3's <|im_end|>, its EOS
constexpr int64_t kPad = 151643;
constexpr int64_t kVocab = 151936;
constexpr int64_t kContext = 40960;

// The user's loops.
constexpr const char* kTestAgents = R"PY(
import asyncio, os
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

class CountingAgent(AgentLoopBase):
    """Two generations around a fake tool answer (masked out); the second greedy and short."""
    def __init__(self, *args, greeting="hi", **kwargs):
        super().__init__(*args, **kwargs)
        self.greeting = greeting
    async def run(self, messages, sampling_params):
        log = os.environ.get("TESSERA_AGENT_LOG")
        if log:
            with open(log, "a") as f:
                f.write("run\n")
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        first = await self.server_manager.generate("a", prompt_ids=prompt, sampling_params=sampling_params)
        tool = self.tokenizer.encode(self.greeting, add_special_tokens=False)
        second = await self.server_manager.generate(
            "a", prompt_ids=prompt + first + tool, sampling_params={**sampling_params, "temperature": 0.0, "max_tokens": 3})
        response, mask = first + tool + second, [1] * len(first) + [0] * len(tool) + [1] * len(second)
        n = self.config.actor_rollout_ref.rollout.response_length
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response[:n], response_mask=mask[:n], num_turns=4,
                               metrics={"generate_sequences": 0.5 + len(messages), "tool_calls": 0.25})

class RaisingAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        raise ValueError("no answer")

class LongAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        return AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3] * 1000, response_mask=[1] * 1000, metrics={})

class StopAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        await self.server_manager.generate("a", prompt_ids=[1, 2], sampling_params={**sampling_params, "stop": ["x"]})

class BadIdsAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        return AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 999999], response_mask=[1, 1], metrics={})

RELEASED = asyncio.Event()  # set once a quick agent has its tokens

class QuickAgent(AgentLoopBase):
    """One generation; then the waiting agents may go on."""
    async def run(self, messages, sampling_params):
        ids = await self.server_manager.generate("q", prompt_ids=[1, 2, 3], sampling_params=sampling_params)
        RELEASED.set()
        return AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=ids, response_mask=[1] * len(ids), metrics={})

class WaitingAgent(AgentLoopBase):
    """Busy elsewhere (a slow tool) until a quick agent has been answered, then one generation."""
    async def run(self, messages, sampling_params):
        await RELEASED.wait()
        ids = await self.server_manager.generate("w", prompt_ids=[1, 2, 3], sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=ids, response_mask=[1] * len(ids), metrics={})

class ParallelAgent(AgentLoopBase):
    """Three samples at once; the second one's tokens are the response."""
    async def run(self, messages, sampling_params):
        outs = await asyncio.gather(*[self.server_manager.generate(f"p{k}", prompt_ids=[4, 5], sampling_params=sampling_params)
                                      for k in range(3)])
        return AgentLoopOutput(prompt_ids=[4, 5], response_ids=outs[1], response_mask=[1] * len(outs[1]), metrics={})

class SystemExitAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        raise SystemExit(2)

class HungAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        await asyncio.Event().wait()

class ExitingAgent(AgentLoopBase):
    async def run(self, messages, sampling_params):
        print("a loop that prints to stdout")
        os._exit(3)
)PY";

constexpr const char* kLoops = R"(- name: counting
  _target_: tessera_test_agents.CountingAgent
  greeting: " tool says hello"
- name: raising
  _target_: tessera_test_agents.RaisingAgent
- name: long
  _target_: tessera_test_agents.LongAgent
- name: stop
  _target_: tessera_test_agents.StopAgent
- name: bad_ids
  _target_: tessera_test_agents.BadIdsAgent
- name: quick
  _target_: tessera_test_agents.QuickAgent
- name: waiting
  _target_: tessera_test_agents.WaitingAgent
- name: parallel
  _target_: tessera_test_agents.ParallelAgent
- name: system_exit
  _target_: tessera_test_agents.SystemExitAgent
- name: hung
  _target_: tessera_test_agents.HungAgent
- name: exiting
  _target_: tessera_test_agents.ExitingAgent
)";

class AgentLoops : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = driver::testing::tessera_python();
    const char* shared = std::getenv("TESSERA_SHARED_DIR");
    if (python_.empty() || shared == nullptr) GTEST_SKIP() << "needs TESSERA_PYTHON (verl, transformers) and TESSERA_SHARED_DIR";
    tokenizer_dir_ = std::filesystem::path(shared) / "golden" / "qwen3-tokenizer";
    dir_.write("sitecustomize.py", testing::kVerlAgentStubs);
    dir_.write("tessera_test_agents.py", kTestAgents);
    loops_ = dir_.write("loops.yaml", kLoops).string();
    tools_ = dir_.write("gsm8k.yaml", kGsm8kTools).string();
    path_.emplace("PYTHONPATH", dir_.path().string());
    auto tok = tokenizer::Tokenizer::from_dir(tokenizer_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::make_shared<const tokenizer::Tokenizer>(std::move(*tok));
  }

  RolloutConfig config(int64_t response_length = 1000) const {
    RolloutConfig c;
    c.prompt_length = 256;
    c.response_length = response_length;
    c.mode = "async";
    c.agent_loop_config_path = loops_;
    return c;
  }

  // The trainer config the loops read (verl's keys under their paths).
  json trainer_config(const RolloutConfig& c) const {
    return {{"trainer", {{"project_name", "p"}, {"experiment_name", "e"}}},
            {"actor_rollout_ref",
             {{"model", {{"path", tokenizer_dir_.string()}}},
              {"rollout",
               {{"prompt_length", c.prompt_length},
                {"response_length", c.response_length},
                {"multi_turn",
                 {{"max_user_turns", nullptr},
                  {"max_assistant_turns", nullptr},
                  {"max_parallel_calls", 1},
                  {"max_tool_response_length", 256},
                  {"tool_response_truncate_side", "middle"},
                  {"tool_config_path", tools_},
                  {"format", "hermes"}}}}}}}};
  }

  Result<std::unique_ptr<AgentHost>> host(const RolloutConfig& c, double timeout_s = 120) const {
    AgentHostOptions options;
    options.agent_loop_config_path = *c.agent_loop_config_path;
    options.trainer_config = trainer_config(c);
    options.tokenizer_path = tokenizer_dir_.string();
    options.python = python_;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    return AgentHost::start_host(options);
  }

  std::unique_ptr<AgentLoopRollout> rollout(const RolloutConfig& c, double timeout_s = 120) const {
    auto h = host(c, timeout_s);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return nullptr;
    auto r = AgentLoopRollout::create(c, std::move(h).value(), kVocab, kContext);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // A generate_sequences batch: one row per agent name, each asking `messages` (the tensors are
  // the dataset's tokens, which the loops replace).
  static proto::DataProto batch(const json& messages, const std::vector<std::string>& agents) {
    const auto b = static_cast<int64_t>(agents.size());
    at::Tensor ids = torch::full({b, 4}, 7, torch::kInt64), mask = torch::ones({b, 4}, torch::kInt64);
    at::Tensor pos = torch::arange(4, torch::kInt64).repeat({b, 1});
    proto::NonTensorBatch cols;
    cols.insert_or_assign("raw_prompt", proto::Column::jsons(std::vector<json>(static_cast<size_t>(b), messages)));
    cols.insert_or_assign("agent_name", proto::Column::strings(agents));
    auto data = proto::DataProto::from_dict({{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}},
                                            std::move(cols), {{"eos_token_id", kImEnd}, {"pad_token_id", kPad}});
    EXPECT_TRUE(data.ok()) << data.status().to_string();
    return *data;
  }

  std::vector<int64_t> ids(const std::string& text, bool eos = true) const {
    auto t = tokenizer_->encode(text);
    EXPECT_TRUE(t.ok());
    std::vector<int64_t> out(t->begin(), t->end());
    if (eos) out.push_back(kImEnd);
    return out;
  }

  std::string python_;
  std::filesystem::path tokenizer_dir_;
  TempDir dir_{"agent_loops"};
  std::string loops_, tools_;
  std::optional<ScopedEnv> path_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
};

const json kQuestion = json::array({{{"role", "user"}, {"content", "What is 8 times 9?"}}});

// verl's own ToolAgentLoop and SingleTurnAgentLoop, run through the bridge, give the batch that
// Tessera's native agent loops give on the same scripted turns: prompts with the tools' schemas,
// verl's Gsm8kTool answers, masks and turn counts.
TEST_F(AgentLoops, VerlsOwnLoopsMatchTheNativeOnes) {
  const std::vector<int64_t> call =
      ids("<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>");
  auto script = [&](ScriptedEngine& e) {
    e.rows = 2;
    e.script[0] = {call, call, ids("72.")};
    e.script[1] = {call};  // single-turn: the call is not run
  };
  const proto::DataProto in = batch(kQuestion, {"tool_agent", "single_turn_agent"});
  RolloutConfig c = config();
  auto bridged = rollout(c);
  ASSERT_NE(bridged, nullptr);
  ScriptedEngine via_verl;
  script(via_verl);
  auto out = bridged->generate(via_verl, in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  RolloutConfig native_config = config();
  native_config.agent_loop_config_path.reset();
  native_config.multi_turn.tool_config_path = tools_;
  ToolHostOptions options;
  options.config_path = tools_;
  options.python = python_;
  auto tools = ToolHost::start(options);
  ASSERT_TRUE(tools.ok()) << tools.status().to_string();
  auto chat = tokenizer::ChatTemplate::from_name("auto", tokenizer_->config());
  ASSERT_TRUE(chat.ok());
  auto native = MultiTurnRollout::create(native_config, tokenizer_,
                                         std::make_shared<const tokenizer::ChatTemplate>(std::move(*chat)),
                                         std::move(tools).value());
  ASSERT_TRUE(native.ok()) << native.status().to_string();
  ScriptedEngine by_tessera;
  script(by_tessera);
  auto expected = (*native)->generate(by_tessera, in);
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();

  EXPECT_EQ(via_verl.seen, by_tessera.seen);  // every turn's prompt
  for (const char* key : {"prompts", "responses", "input_ids", "attention_mask", "response_mask"}) {
    EXPECT_TRUE(torch::equal(*out->tensor(key), *expected->tensor(key))) << key;
  }
  EXPECT_EQ(out->column("__num_turns__")->i64(0), 6);  // 3 assistant turns, 2 tool turns, + 1
  EXPECT_EQ(out->column("__num_turns__")->i64(1), 2);
  EXPECT_EQ(expected->column("__num_turns__")->i64(0), 6);
  EXPECT_EQ(bridged->last_stats().requests, 4);
  EXPECT_EQ(bridged->last_stats().engine_calls, 3);  // both rows' first turns in one call
}

// A user's loop: its kwargs from the YAML, its requests batched over the rows (one engine call
// per sampling rule), each sampled from its own stream, its output padded as verl's _postprocess.
TEST_F(AgentLoops, CustomLoopsGenerateWithTheEngine) {
  auto loops = rollout(config(12));
  ASSERT_NE(loops, nullptr);
  ScriptedEngine engine;
  engine.rows = 3;
  for (int64_t r = 0; r < 3; ++r) engine.script[r] = {{11, 12, 13, 14 + r, kImEnd}, {21, 22, 23, 24}};
  proto::DataProto in = batch(kQuestion, {"counting", "counting", "counting"});
  in.meta_info()["global_steps"] = 5;
  auto out = loops->generate(engine, in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  // The prompt the loop built with transformers is the one Tessera's chat template renders.
  auto chat = tokenizer::ChatTemplate::from_name("auto", tokenizer_->config());
  ASSERT_TRUE(chat.ok());
  auto text = chat->render_json(kQuestion, nullptr, true);
  ASSERT_TRUE(text.ok());
  const std::vector<int64_t> prompt = ids(*text, false);
  const std::vector<int64_t> tool = ids(" tool says hello", false);
  ASSERT_EQ(engine.calls.size(), 2U);
  EXPECT_EQ(engine.calls[0].prompts.size(), 3U);
  EXPECT_EQ(engine.calls[0].streams, (std::vector<int64_t>{0, 1, 2}));
  ASSERT_TRUE(engine.calls[0].sampling.has_value());
  EXPECT_FALSE(engine.calls[0].sampling->greedy);
  EXPECT_DOUBLE_EQ(engine.calls[0].sampling->temperature, 1.0);
  EXPECT_EQ(engine.calls[0].max_tokens, (std::vector<int64_t>{12, 12, 12}));
  EXPECT_EQ(engine.calls[1].streams, (std::vector<int64_t>{3, 4, 5}));  // each row's second request
  EXPECT_TRUE(engine.calls[1].sampling->greedy);
  EXPECT_EQ(engine.calls[1].max_tokens, (std::vector<int64_t>{3, 3, 3}));
  int64_t response_length = 0;
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<int64_t> first = {11, 12, 13, 14 + r, kImEnd};
    EXPECT_EQ(engine.seen[r].at(0), prompt);
    EXPECT_EQ(engine.seen[r].at(1), cat({prompt, first, tool}));
    // Response: first + tool + the 3 tokens of the second, cut to 12 and right-padded.
    std::vector<int64_t> response = cat({first, tool, {21, 22, 23}});
    std::vector<int64_t> mask(first.size(), 1);
    mask.resize(first.size() + tool.size(), 0);
    mask.resize(response.size(), 1);
    response_length = std::min<int64_t>(static_cast<int64_t>(response.size()), 12);
    response.resize(static_cast<size_t>(response_length)), mask.resize(static_cast<size_t>(response_length));
    response.resize(12, kPad), mask.resize(12, 0);
    EXPECT_EQ(row_of(*out->tensor("responses"), r), response) << r;
    EXPECT_EQ(row_of(*out->tensor("response_mask"), r), mask) << r;
    const std::vector<int64_t> prompts = row_of(*out->tensor("prompts"), r);
    EXPECT_EQ(std::vector<int64_t>(prompts.end() - static_cast<std::ptrdiff_t>(prompt.size()), prompts.end()), prompt);
    EXPECT_EQ(prompts.front(), kPad);  // left-padded to prompt_length
    EXPECT_EQ(out->column("__num_turns__")->i64(r), 4);
  }
  EXPECT_EQ(out->tensor("prompts")->size(1), 256);
  const json& m = loops->last_stats().metrics;
  EXPECT_DOUBLE_EQ(m["timing_s/agent_loop/generate_sequences/mean"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(m["timing_s/agent_loop/tool_calls/max"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(m["timing_s/agent_loop/slowest/response_length"].get<double>(), static_cast<double>(response_length));
  EXPECT_EQ(loops->last_stats().requests, 6);
  EXPECT_EQ(loops->last_stats().engine_calls, 2);
  // Validation samples with val_kwargs (greedy here), as verl's agent-loop worker.
  ScriptedEngine val;
  val.rows = 3;
  val.script = engine.script;
  in.meta_info()["validate"] = true;
  RolloutConfig greedy_val = config(12);
  greedy_val.val_kwargs.temperature = 0;
  auto validating = rollout(greedy_val);
  ASSERT_NE(validating, nullptr);
  ASSERT_TRUE(validating->generate(val, in).ok());
  EXPECT_TRUE(val.calls.at(0).sampling->greedy);
}

// Requests wait for the loops still busy elsewhere only so long: two quick rows are sent while a
// third is busy (until a quick row has its tokens: its request can only go in the next call);
// one row's concurrent requests are one call, each from its own stream.
TEST_F(AgentLoops, BusyLoopsDoNotHoldTheOthersBackAndParallelSamplesShareACall) {
  auto loops = rollout(config(12));
  ASSERT_NE(loops, nullptr);
  ScriptedEngine engine;
  engine.rows = 3;
  for (int64_t r = 0; r < 3; ++r) engine.script[r] = {{9, kImEnd}};
  auto out = loops->generate(engine, batch(kQuestion, {"quick", "waiting", "quick"}));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(engine.calls.size(), 2U);
  EXPECT_EQ(engine.calls[0].streams, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(engine.calls[1].streams, (std::vector<int64_t>{1}));
  EXPECT_EQ(row_of(*out->tensor("responses"), 1).front(), 9);

  ScriptedEngine parallel;
  parallel.rows = 1;
  parallel.script[0] = {{21, kImEnd}, {22, kImEnd}, {23, kImEnd}};
  auto sampled = loops->generate(parallel, batch(kQuestion, {"parallel"}));
  ASSERT_TRUE(sampled.ok()) << sampled.status().to_string();
  ASSERT_EQ(parallel.calls.size(), 1U);
  EXPECT_EQ(parallel.calls[0].streams, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(row_of(*sampled->tensor("responses"), 0).front(), 22);
}

// Whatever a loop does wrong is one line naming the row and its loop (and the key it got wrong);
// a hung loop ends the rollout after tool_timeout_s, a dying one at once.
TEST_F(AgentLoops, BadLoopsAreOneLineErrors) {
  auto loops = rollout(config(12), 2);
  ASSERT_NE(loops, nullptr);
  ScriptedEngine engine;
  engine.rows = 2;
  engine.script[0] = {{5, kImEnd}, {6}};
  engine.script[1] = engine.script[0];
  auto error_of = [&](const std::vector<std::string>& agents) {
    engine.seen.clear();
    auto out = loops->generate(engine, batch(kQuestion, agents));
    return out.ok() ? std::string("ok") : out.status().message();
  };
  auto contains = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  std::string e = error_of({"counting", "nope"});
  EXPECT_TRUE(contains(e, "row 1: agent_name 'nope' is not an agent loop")) << e;
  e = error_of({"counting", "raising"});
  EXPECT_TRUE(contains(e, "row 1: agent loop 'raising' failed: \"ValueError: no answer\"")) << e;
  e = error_of({"long"});
  EXPECT_TRUE(contains(e, "row 0: agent loop 'long' returned a response of 1000 tokens")) << e;
  EXPECT_TRUE(contains(e, "response_length")) << e;
  e = error_of({"stop"});
  EXPECT_TRUE(contains(e, "row 0: agent loop 'stop' failed")) << e;
  EXPECT_TRUE(contains(e, "sampling_params.stop")) << e;
  e = error_of({"bad_ids"});
  EXPECT_TRUE(contains(e, "row 0: agent loop 'bad_ids' returned response_ids holds 999999")) << e;
  e = error_of({"system_exit"});
  EXPECT_TRUE(contains(e, "row 0: agent loop 'system_exit' failed: \"SystemExit: 2\"")) << e;
  // The host survives a loop's error: the next batch runs; and one the engine failed mid-way
  // (its loops left waiting) is replaced by a fresh process.
  EXPECT_EQ(error_of({"counting"}), "ok");
  engine.fail = true;
  EXPECT_EQ(error_of({"counting"}), "the model failed");
  engine.fail = false;
  EXPECT_EQ(error_of({"counting", "counting"}), "ok");
  e = error_of({"hung"});
  EXPECT_TRUE(contains(e, "tool_timeout_s")) << e;
  EXPECT_TRUE(contains(e, "agent_loop_config_path")) << e;
  EXPECT_TRUE(contains(error_of({"counting"}), "tool_timeout_s"));  // the host is gone

  auto dying = rollout(config(12));
  ASSERT_NE(dying, nullptr);
  auto out = dying->generate(engine, batch(kQuestion, {"exiting"}));
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(contains(out.status().message(), "the agent-loop process exited")) << out.status().to_string();

  // Configs that do not load.
  RolloutConfig missing = config();
  missing.agent_loop_config_path = (dir_.path() / "missing.yaml").string();
  auto h = host(missing);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(contains(h.status().message(), "agent.agent_loop_config_path: cannot load")) << h.status().to_string();
  EXPECT_TRUE(contains(h.status().message(), "missing.yaml")) << h.status().to_string();
  RolloutConfig unnamed = config();
  unnamed.agent_loop_config_path = dir_.write("unnamed.yaml", "- name: 2024\n  _target_: x.Y\n").string();
  h = host(unnamed);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(contains(h.status().message(), "a string name and _target_")) << h.status().to_string();
  RolloutConfig empty = config();
  empty.agent_loop_config_path = dir_.write("empty.yaml", "[]\n").string();
  h = host(empty);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(contains(h.status().message(), "defines no agent loop")) << h.status().to_string();
}

// Rollout TP: rank 0 runs the loops once, both peers make the same engine calls and return the
// same batch.
TEST_F(AgentLoops, TensorParallelPeersShareRankZerosLoops) {
  const auto log = dir_.path() / "runs.txt";
  ScopedEnv log_env("TESSERA_AGENT_LOG", log.string());
  const RolloutConfig c = config(12);
  std::vector<std::vector<int64_t>> responses(2);
  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& comm) {
    std::shared_ptr<collective::Communicator> group(&comm, [](collective::Communicator*) {});
    Result<std::unique_ptr<AgentHost>> leader = std::unique_ptr<AgentHost>();
    if (rank == 0) leader = host(c);
    auto relay = relay_agent_loops(group, std::move(leader), std::chrono::seconds(120));
    ASSERT_TRUE(relay.ok()) << relay.status().to_string();
    auto loops = AgentLoopRollout::create(c, std::move(relay).value(), kVocab, kContext);
    ASSERT_TRUE(loops.ok()) << loops.status().to_string();
    ScriptedEngine engine;
    engine.rows = 2;
    engine.script[0] = {{5, 6, kImEnd}, {7}};
    engine.script[1] = {{8, kImEnd}, {9}};
    auto out = (*loops)->generate(engine, batch(kQuestion, {"counting", "counting"}));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(engine.calls.size(), 2U);
    responses[static_cast<size_t>(rank)] = row_of(*out->tensor("responses"), 1);
    // A loop's failure on rank 0 is both peers' error.
    auto failed = (*loops)->generate(engine, batch(kQuestion, {"raising"}));
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("no answer"), std::string::npos) << failed.status().to_string();
  });
  EXPECT_EQ(responses[0], responses[1]);
  std::ifstream in(log);
  int runs = 0;
  for (std::string line; std::getline(in, line);) runs += 1;
  EXPECT_EQ(runs, 2);  // two rows, run once each
}

}  // namespace
}  // namespace tessera::rollout
