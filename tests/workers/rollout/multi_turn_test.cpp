// The multi-turn rollout with tools against verl's own Python: the prompts rendered with the
// tools' schemas and the tool answers' tokens are what transformers' apply_chat_template and
// verl's tool agent loop produce, the tools are verl's (Gsm8kTool) loaded by verl's registry, and
// the rewards are its calc_reward. A scripted engine plays the model's turns, so every branch of
// the loop (a call, no call, a malformed call, the budget, a raising tool, a hung tool) is
// exercised deterministically. Needs $TESSERA_PYTHON with verl and transformers, and the golden
// Qwen3 tokenizer ($TESSERA_SHARED_DIR/golden).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "tests/driver/driver_test_util.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"
#include "tests/workers/rollout/scripted_engine.hpp"
#include "workers/rollout/multi_turn.hpp"

namespace tessera::rollout {
namespace {

using testing::cat;
using testing::row_of;
using testing::kGsm8kTools;
using testing::ScriptedEngine;

using nlohmann::json;
using driver::testing::ScopedEnv;
using driver::testing::TempDir;

constexpr int64_t kImEnd = 151645;  // Qwen3's <|im_end|>, its EOS
constexpr int64_t kPad = 151643;

// verl's ray import is for DataProtoFuture only; nothing here reaches it.
constexpr const char* kRayStub = "ObjectRef = object\n\ndef get(*args, **kwargs):\n    raise RuntimeError('ray is stubbed')\n";



// Tools that misbehave, as users' tools do.
constexpr const char* kTestTools = R"(import asyncio, os
from verl.tools.base_tool import BaseTool

class RaisingTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise ValueError("no weather for " + str(parameters.get("city")))

class SlowTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        print("a tool that prints to stdout")
        await asyncio.Event().wait()  # never answers
        return "late", 0.0, {}

class RecordingTool(BaseTool):
    async def create(self, instance_id=None, **kwargs):
        with open(os.environ["TESSERA_TOOL_LOG"], "a") as f:
            f.write(f"create {instance_id}\n")
        return instance_id
    async def release(self, instance_id, **kwargs):
        with open(os.environ["TESSERA_TOOL_LOG"], "a") as f:
            f.write(f"release {instance_id}\n")
    async def calc_reward(self, instance_id, **kwargs):
        raise RuntimeError("no reward today")

class OddTool(BaseTool):  # non-ASCII text, a NaN reward and a numpy metric
    async def execute(self, instance_id, parameters, **kwargs):
        import numpy as np
        return "naïve ✓ €", float("nan"), {"scores": np.array([1.0, 2.0])}
    async def calc_reward(self, instance_id, **kwargs):
        return float("inf")

class LongTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return "a" * 300 + "z" * 300, 0.0, {}
)";

std::string tool_entry(const std::string& cls, const std::string& name) {
  return "  - class_name: \"tessera_test_tools." + cls + "\"\n    config:\n      type: native\n    tool_schema:\n" +
         "      type: function\n      function:\n        name: " + name + "\n        description: test\n" +
         "        parameters:\n          type: object\n          properties:\n            city:\n" +
         "              type: string\n          required: [city]\n";
}

// The reference: verl's registry, transformers' apply_chat_template and verl's tool agent loop's
// rule for tool answers (rendered alone, the rendering of [{}] dropped).
constexpr const char* kReference = R"PY(
import asyncio, json, sys
from transformers import AutoTokenizer
from verl.tools.utils.tool_registry import initialize_tools_from_config
spec = json.load(open(sys.argv[1]))
tok = AutoTokenizer.from_pretrained(spec["tokenizer"])
def ids(r):
    return list(r) if isinstance(r, list) else list(r["input_ids"])
tools = {t.name: t for t in initialize_tools_from_config(spec["tools"])}
schemas = [t.tool_schema.model_dump() for t in tools.values()]
out = {"prompt": ids(tok.apply_chat_template(spec["messages"], tools=schemas, add_generation_prompt=True, tokenize=True))}
# verl's agent loops: the tool agent's schemas without unset or None fields, the single-turn agent's none.
agent_schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools.values()]
out["agent_prompt"] = ids(tok.apply_chat_template(spec["messages"], tools=agent_schemas, add_generation_prompt=True, tokenize=True))
out["single_prompt"] = ids(tok.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=True))
out["turns"] = {k: tok.encode(v, add_special_tokens=False) for k, v in spec["turns"].items()}
preamble = ids(tok.apply_chat_template([{}], add_generation_prompt=False, tokenize=True))
loop = asyncio.new_event_loop()
out["answers"] = {}
for key, call in spec["calls"].items():
    tool = tools[call["tool"]]
    loop.run_until_complete(tool.create("ref-" + key, ground_truth=call["ground_truth"]))
    answer = None
    if call["arguments"] is not None:
        text, _, _ = loop.run_until_complete(tool.execute("ref-" + key, call["arguments"]))
        rendered = ids(tok.apply_chat_template([{"role": "tool", "content": text}], add_generation_prompt=True, tokenize=True))
        answer = rendered[len(preamble):]
    reward = loop.run_until_complete(tool.calc_reward("ref-" + key))
    out["answers"][key] = {"ids": answer, "reward": reward}
json.dump(out, open(sys.argv[2], "w"))
)PY";

class MultiTurn : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = driver::testing::tessera_python();
    const char* shared = std::getenv("TESSERA_SHARED_DIR");
    if (python_.empty() || shared == nullptr) GTEST_SKIP() << "needs TESSERA_PYTHON (verl, transformers) and TESSERA_SHARED_DIR";
    tokenizer_dir_ = std::filesystem::path(shared) / "golden" / "qwen3-tokenizer";
    dir_.write("ray/__init__.py", kRayStub);
    dir_.write("tessera_test_tools.py", kTestTools);
    gsm8k_ = dir_.write("gsm8k.yaml", kGsm8kTools).string();
    path_.emplace("PYTHONPATH", dir_.path().string());
    tool_python_.emplace("TESSERA_TOOL_PYTHON", python_);
    auto tok = tokenizer::Tokenizer::from_dir(tokenizer_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    auto chat = tokenizer::ChatTemplate::from_name("auto", tok->config());
    ASSERT_TRUE(chat.ok()) << chat.status().to_string();
    tokenizer_ = std::make_shared<const tokenizer::Tokenizer>(std::move(*tok));
    chat_ = std::make_shared<const tokenizer::ChatTemplate>(std::move(*chat));
  }

  RolloutConfig config(const std::string& tools, int64_t response_length) const {
    RolloutConfig c;
    c.prompt_length = 256;
    c.response_length = response_length;
    c.multi_turn.enable = true;
    c.multi_turn.tool_config_path = tools;
    return c;
  }

  std::unique_ptr<MultiTurnRollout> rollout(const RolloutConfig& c, double timeout_s = 60) {
    ToolHostOptions options;
    options.config_path = *c.multi_turn.tool_config_path;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    auto host = ToolHost::start(options);
    EXPECT_TRUE(host.ok()) << host.status().to_string();
    if (!host.ok()) return nullptr;
    auto mt = MultiTurnRollout::create(c, tokenizer_, chat_, std::move(*host));
    EXPECT_TRUE(mt.ok()) << mt.status().to_string();
    return mt.ok() ? std::move(*mt) : nullptr;
  }

  // A generate_sequences batch of `rows` copies of one question (the tensors are the dataset's
  // tokens, which the rollout replaces by the rendering with tools).
  static proto::DataProto batch(const json& messages, const std::vector<json>& tools_kwargs) {
    const auto b = static_cast<int64_t>(tools_kwargs.size());
    at::Tensor ids = torch::full({b, 4}, 7, torch::kInt64), mask = torch::ones({b, 4}, torch::kInt64);
    at::Tensor pos = torch::arange(4, torch::kInt64).repeat({b, 1});
    proto::NonTensorBatch cols;
    cols.insert_or_assign("raw_prompt", proto::Column::jsons(std::vector<json>(static_cast<size_t>(b), messages)));
    cols.insert_or_assign("tools_kwargs", proto::Column::jsons(tools_kwargs));
    cols.insert_or_assign("data_source", proto::Column::strings(std::vector<std::string>(static_cast<size_t>(b), "gsm8k")));
    auto data = proto::DataProto::from_dict({{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}},
                                            std::move(cols), {{"eos_token_id", kImEnd}, {"pad_token_id", kPad}});
    EXPECT_TRUE(data.ok()) << data.status().to_string();
    return *data;
  }

  json reference(const json& spec) {
    std::ofstream(dir_.path() / "spec.json") << spec.dump();
    std::ofstream(dir_.path() / "reference.py") << kReference;
    const auto out = dir_.path() / "reference.json";
    const auto run = driver::testing::run_command(
        fmt::format("'{}' '{}' '{}' '{}' 2>&1", python_, (dir_.path() / "reference.py").string(),
                    (dir_.path() / "spec.json").string(), out.string()));
    EXPECT_EQ(run.status, 0) << run.text;
    std::ifstream in(out);
    return in ? json::parse(in) : json();
  }

  std::string python_;
  std::filesystem::path tokenizer_dir_;
  TempDir dir_{"multi_turn"};
  std::string gsm8k_;
  std::optional<ScopedEnv> path_, tool_python_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::shared_ptr<const tokenizer::ChatTemplate> chat_;
};

TEST_F(MultiTurn, ConversationsMatchVerlsToolLoop) {
  const json messages = json::array({{{"role", "user"}, {"content", "Natalia sold 48 clips in April and half as many in May. How many in total?"}}});
  const json gsm8k = {{"calc_gsm8k_reward", {{"create_kwargs", {{"ground_truth", "72"}}}}}};
  const json spec = {
      {"tokenizer", tokenizer_dir_.string()},
      {"tools", gsm8k_},
      {"messages", messages},
      {"turns",
       {{"call72", "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>"},
        {"call71", "Let me check.\n<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"71\"}}\n</tool_call>"},
        {"final", "The answer is 72."},
        {"plain", "It is 72."},
        {"bad", "<tool_call>{\"name\": \"calc_gsm8k_reward\", \"arguments\": \"72\"}</tool_call>"}}},
      {"calls",
       {{"row0", {{"tool", "calc_gsm8k_reward"}, {"ground_truth", "72"}, {"arguments", {{"answer", "72"}}}}},
        {"row1", {{"tool", "calc_gsm8k_reward"}, {"ground_truth", "72"}, {"arguments", nullptr}}},
        {"row3", {{"tool", "calc_gsm8k_reward"}, {"ground_truth", "72"}, {"arguments", {{"answer", "71"}}}}}}}};
  const json ref = reference(spec);
  ASSERT_TRUE(ref.is_object());
  auto turn = [&](const char* k, bool eos = true) {
    auto t = ref["turns"][k].get<std::vector<int64_t>>();
    if (eos) t.push_back(kImEnd);
    return t;
  };
  const auto prompt = ref["prompt"].get<std::vector<int64_t>>();
  const auto answer0 = ref["answers"]["row0"]["ids"].get<std::vector<int64_t>>();
  const auto answer3 = ref["answers"]["row3"]["ids"].get<std::vector<int64_t>>();

  const int64_t R = 200;
  auto mt = rollout(config(gsm8k_, R));
  ASSERT_NE(mt, nullptr);
  ScriptedEngine engine;
  engine.script[0] = {turn("call72"), turn("final")};  // calls the tool, then answers
  engine.script[1] = {turn("plain")};                    // answers without a call
  engine.script[2] = {turn("bad")};                      // arguments not a mapping: dropped
  const std::vector<int64_t> rambling(300, turn("plain")[0]);
  engine.script[3] = {turn("call71"), rambling};  // a wrong answer, then runs out of room
  // Row 3 offers every tool (no tools_kwargs), as verl's agent loop; its gsm8k instance has no ground truth.
  proto::DataProto in = batch(messages, {gsm8k, gsm8k, gsm8k, json::object()});
  auto out = mt->generate(engine, in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  // Every conversation starts from the prompt rendered with the tools; row 0's second turn sees
  // its first turn and the tool's answer, tokenized as verl's agent loop does.
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(engine.seen[s].at(0), prompt) << "stream " << s;
  EXPECT_EQ(engine.seen[0].at(1), cat({prompt, turn("call72"), answer0}));
  ASSERT_EQ(engine.seen[3].size(), 2U);

  at::Tensor responses = *out->tensor("responses"), rmask = *out->tensor("response_mask");
  at::Tensor attention = *out->tensor("attention_mask"), positions = *out->tensor("position_ids");
  at::Tensor prompts = *out->tensor("prompts");
  ASSERT_EQ(responses.sizes(), (std::vector<int64_t>{4, R}));
  const int64_t P = 256, n = static_cast<int64_t>(prompt.size());
  auto padded = [&](std::vector<int64_t> v) {
    v.resize(static_cast<size_t>(R), kPad);
    return v;
  };
  // Row 0: call, answer (masked out), final turn.
  const auto resp0 = cat({turn("call72"), answer0, turn("final")});
  EXPECT_EQ(row_of(responses, 0), padded(resp0));
  std::vector<int64_t> mask0(static_cast<size_t>(R), 0);
  for (size_t j = 0; j < resp0.size(); ++j) {
    const size_t first = turn("call72").size();
    mask0[j] = (j < first || j >= first + answer0.size()) ? 1 : 0;
  }
  EXPECT_EQ(row_of(rmask, 0), mask0);
  // Prompts left-padded to prompt_length; attention over prompt and the whole response; positions continue.
  std::vector<int64_t> prompt_row(static_cast<size_t>(P - n), kPad);
  prompt_row.insert(prompt_row.end(), prompt.begin(), prompt.end());
  EXPECT_EQ(row_of(prompts, 0), prompt_row);
  EXPECT_EQ(attention[0].sum().item<int64_t>(), n + static_cast<int64_t>(resp0.size()));
  EXPECT_EQ(positions[0][P].item<int64_t>(), n);
  EXPECT_EQ(positions[0][P + R - 1].item<int64_t>(), n + R - 1);
  EXPECT_TRUE(out->tensor("input_ids")->equal(torch::cat({prompts, responses}, 1)));
  // Rows 1 and 2: one turn each.
  EXPECT_EQ(row_of(responses, 1), padded(turn("plain")));
  EXPECT_EQ(row_of(responses, 2), padded(turn("bad")));
  EXPECT_EQ(rmask[2].sum().item<int64_t>(), static_cast<int64_t>(turn("bad").size()));
  // Row 3: call, answer, then the budget: the response is full and ends on the model's tokens.
  const auto head3 = cat({turn("call71"), answer3});
  EXPECT_EQ(rmask[3].sum().item<int64_t>(), R - static_cast<int64_t>(answer3.size()));
  EXPECT_EQ(row_of(responses, 3)[head3.size()], rambling[0]);
  EXPECT_EQ(row_of(responses, 3)[static_cast<size_t>(R - 1)], rambling[0]);
  EXPECT_EQ(attention[3].sum().item<int64_t>(), n + R);

  // reward_scores are the tools' calc_reward (verl's SGLang rollout); num_turns as the agent loop.
  auto scores = out->column("reward_scores");
  ASSERT_TRUE(scores.ok());
  EXPECT_DOUBLE_EQ(scores->json_value(0)["calc_gsm8k_reward"].get<double>(), ref["answers"]["row0"]["reward"].get<double>());
  EXPECT_DOUBLE_EQ(scores->json_value(0)["calc_gsm8k_reward"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(scores->json_value(1)["calc_gsm8k_reward"].get<double>(), ref["answers"]["row1"]["reward"].get<double>());
  EXPECT_DOUBLE_EQ(scores->json_value(3)["calc_gsm8k_reward"].get<double>(), 0.0);
  EXPECT_EQ(scores->json_value(2)["user_turn_rewards"], json::array());
  auto turns = out->column("__num_turns__");
  ASSERT_TRUE(turns.ok());
  EXPECT_EQ(turns->i64(0), 4);
  EXPECT_EQ(turns->i64(1), 2);
  EXPECT_EQ(turns->i64(3), 4);
  EXPECT_TRUE(out->column("data_source").ok());  // non-tensor columns pass through
  const MultiTurnStats& st = mt->last_stats();
  EXPECT_EQ(st.assistant_turns, 6);
  EXPECT_EQ(st.tool_calls, 2);
  EXPECT_EQ(st.malformed_calls, 1);
  EXPECT_EQ(st.tool_errors, 0);
}

TEST_F(MultiTurn, TurnLimitsAndLongAnswers) {
  TempDir tools("multi_turn_tools");
  const auto yaml = tools.write("t.yaml", "tools:\n" + tool_entry("LongTool", "lookup")).string();
  const json messages = json::array({{{"role", "user"}, {"content", "Where?"}}});
  auto call = tokenizer_->encode("<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  ASSERT_TRUE(call.ok());
  std::vector<int64_t> call_ids(call->begin(), call->end());
  call_ids.push_back(kImEnd);
  for (int64_t max_turns : {1, 2}) {
    RolloutConfig c = config(yaml, 400);
    c.multi_turn.max_assistant_turns = max_turns;
    c.multi_turn.max_tool_response_length = 10;
    auto mt = rollout(c);
    ASSERT_NE(mt, nullptr);
    ScriptedEngine engine;
    engine.script[0] = {call_ids, call_ids, call_ids};
    auto out = mt->generate(engine, batch(messages, {json::object()}));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    // max_assistant_turns generations, and no tool runs after the last one.
    EXPECT_EQ(static_cast<int64_t>(engine.seen[0].size()), max_turns);
    EXPECT_EQ(mt->last_stats().tool_calls, max_turns - 1);
    if (max_turns == 2) {
      // The answer kept 5 characters on each side of the cut (verl's "middle").
      const auto& second = engine.seen[0][1];
      std::vector<int32_t> tail(second.end() - 40, second.end());
      auto text = tokenizer_->decode(tail);
      ASSERT_TRUE(text.ok());
      EXPECT_NE(text->find("aaaaa...(truncated)...zzzzz\n</tool_response>"), std::string::npos) << *text;
    }
  }
}

TEST_F(MultiTurn, ARaisingToolEndsItsRowAndAHungToolEndsTheRollout) {
  TempDir tools("multi_turn_tools");
  const auto yaml = tools.write("t.yaml", "tools:\n" + tool_entry("RaisingTool", "weather") +
                                              tool_entry("SlowTool", "slow")).string();
  const json messages = json::array({{{"role", "user"}, {"content", "Weather?"}}});
  auto ids = [&](const std::string& text) {
    auto t = tokenizer_->encode(text);
    EXPECT_TRUE(t.ok());
    std::vector<int64_t> v(t->begin(), t->end());
    v.push_back(kImEnd);
    return v;
  };
  {
    auto mt = rollout(config(yaml, 300));
    ASSERT_NE(mt, nullptr);
    ScriptedEngine engine;
    engine.script[0] = {ids("<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")};
    auto out = mt->generate(engine, batch(messages, {{{"weather", json::object()}}}));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(engine.seen[0].size(), 1U);
    EXPECT_EQ(mt->last_stats().tool_errors, 1);
    EXPECT_EQ(out->column("__num_turns__")->i64(0), 2);
  }
  auto mt = rollout(config(yaml, 300), /*timeout_s=*/1.5);
  ASSERT_NE(mt, nullptr);
  ScriptedEngine engine;
  engine.script[0] = {ids("<tool_call>\n{\"name\": \"slow\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")};
  auto out = mt->generate(engine, batch(messages, {{{"slow", json::object()}}}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("tool_timeout_s"), std::string::npos) << out.status().to_string();
  EXPECT_NE(out.status().message().find("'slow'"), std::string::npos) << out.status().to_string();
  // The host is gone: the next call fails at once with the same error.
  engine.seen.clear();
  auto again = mt->generate(engine, batch(messages, {{{"slow", json::object()}}}));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("tool_timeout_s"), std::string::npos);
}

// mode=async: verl's agent loops. single_turn_agent rows generate once from the prompt without
// tools; tool_agent rows get every tool's schema (as the agent loop dumps them), an instance per
// call and no reward_scores.
TEST_F(MultiTurn, AgentLoopsMatchVerls) {
  const json messages = json::array({{{"role", "user"}, {"content", "What is 8 times 9?"}}});
  const json spec = {
      {"tokenizer", tokenizer_dir_.string()},
      {"tools", gsm8k_},
      {"messages", messages},
      {"turns", {{"call", "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>"},
                 {"unknown", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"72\"}}\n</tool_call>"},
                 {"final", "72."}}},
      {"calls", {{"agent", {{"tool", "calc_gsm8k_reward"}, {"ground_truth", nullptr}, {"arguments", {{"answer", "72"}}}}}}}};
  const json ref = reference(spec);
  ASSERT_TRUE(ref.is_object());
  auto turn = [&](const char* k) {
    auto t = ref["turns"][k].get<std::vector<int64_t>>();
    t.push_back(kImEnd);
    return t;
  };
  const auto agent_prompt = ref["agent_prompt"].get<std::vector<int64_t>>();
  const auto single_prompt = ref["single_prompt"].get<std::vector<int64_t>>();
  const auto answer = ref["answers"]["agent"]["ids"].get<std::vector<int64_t>>();
  EXPECT_NE(agent_prompt, ref["prompt"].get<std::vector<int64_t>>());  // "strict": false and "enum": null are gone

  RolloutConfig c = config(gsm8k_, 1000);
  c.multi_turn.enable = false;
  c.mode = "async";
  auto mt = rollout(c);
  ASSERT_NE(mt, nullptr);
  ScriptedEngine engine;
  engine.script[0] = std::vector<std::vector<int64_t>>(6, turn("call"));
  engine.script[0].push_back(turn("final"));
  engine.script[1] = {turn("call")};  // single-turn: the call is not run
  proto::DataProto in = batch(messages, {json::object(), json::object()});
  ASSERT_TRUE(in.set_column("agent_name", proto::Column::strings({"tool_agent", "single_turn_agent"})).ok());
  auto out = mt->generate(engine, in);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(engine.seen[0].at(0), agent_prompt);
  EXPECT_EQ(engine.seen[0].at(1), cat({agent_prompt, turn("call"), answer}));
  EXPECT_EQ(engine.seen[1].size(), 1U);
  EXPECT_EQ(engine.seen[1].at(0), single_prompt);
  EXPECT_FALSE(out->column("reward_scores").ok());
  EXPECT_EQ(out->column("__num_turns__")->i64(1), 2);
  EXPECT_EQ(engine.seen[0].size(), 7U);
  EXPECT_EQ(out->column("__num_turns__")->i64(0), 14);  // 7 assistant turns, 6 tool turns, + 1
  EXPECT_EQ(mt->last_stats().tool_calls, 6);
  EXPECT_EQ(mt->last_stats().tool_errors, 0);
  // The tool agent passes no kwargs (a row's tools_kwargs, even malformed, are not read), and a
  // call to a tool it does not have ends the row as verl's KeyError does.
  engine.seen.clear();
  engine.script[0] = {turn("unknown")};
  proto::DataProto odd = batch(messages, {json{{"calc_gsm8k_reward", {{"execute_kwargs", "x"}}}}});
  ASSERT_TRUE(odd.set_column("agent_name", proto::Column::strings({"tool_agent"})).ok());
  auto ended = mt->generate(engine, odd);
  ASSERT_TRUE(ended.ok()) << ended.status().to_string();
  EXPECT_EQ(engine.seen[0].size(), 1U);
  EXPECT_EQ(mt->last_stats().tool_errors, 1);
  EXPECT_EQ(mt->last_stats().tool_calls, 0);
  // An agent loop Tessera does not have is refused naming the row.
  ASSERT_TRUE(in.set_column("agent_name", proto::Column::strings({"tool_agent", "math_agent"})).ok());
  auto unknown = mt->generate(engine, in);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("row 1: agent_name 'math_agent'"), std::string::npos)
      << unknown.status().to_string();
}

// multi_turn.interaction_config_path: verl's Gsm8kInteraction plays the user. A turn without a
// tool call gets its reply (generate_response over the conversation so far); a wrong answer is
// followed by its user message (rendered alone, masked out), a right one ends the conversation;
// each reply's reward joins reward_scores.user_turn_rewards; max_user_turns caps the replies.
TEST_F(MultiTurn, InteractionsPlayTheUser) {
  TempDir files("multi_turn_interactions");
  const auto yaml = files.write("i.yaml", "interaction:\n  - name: gsm8k\n    class_name: "
                                          "verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n").string();
  const json messages = json::array({{{"role", "user"}, {"content", "What is 8 times 9?"}}});
  // The reference: verl's interaction on the same conversation, the user turn rendered alone.
  files.write("interaction_ref.py", R"PY(
import asyncio, json, sys, types
ray = types.ModuleType("ray")
ray.ObjectRef = object
sys.modules.setdefault("ray", ray)
from transformers import AutoTokenizer
from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = lambda r: list(r) if isinstance(r, list) else list(r["input_ids"])
gsm8k = initialize_interactions_from_config(sys.argv[2])["gsm8k"]
loop = asyncio.new_event_loop()
loop.run_until_complete(gsm8k.start_interaction("i", ground_truth="72"))
history = [{"role": "user", "content": "What is 8 times 9?"}, {"role": "assistant", "content": "It is #### 71"}]
end, text, reward, _ = loop.run_until_complete(gsm8k.generate_response("i", history))
preamble = ids(tok.apply_chat_template([{}], tokenize=True))
user = ids(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True))
history += [{"role": "user", "content": text}, {"role": "assistant", "content": "#### 72"}]
end2, _, reward2, _ = loop.run_until_complete(gsm8k.generate_response("i", history))
json.dump({"end": end, "reward": reward, "user": user[len(preamble):], "end2": end2, "reward2": reward2,
           "wrong": tok.encode("It is #### 71", add_special_tokens=False),
           "right": tok.encode("#### 72", add_special_tokens=False)}, open(sys.argv[3], "w"))
)PY");
  const auto out = files.path() / "ref.json";
  const auto run = driver::testing::run_command(fmt::format("'{}' '{}' '{}' '{}' '{}' 2>&1", python_,
                                                            (files.path() / "interaction_ref.py").string(),
                                                            tokenizer_dir_.string(), yaml, out.string()));
  ASSERT_EQ(run.status, 0) << run.text;
  const json ref = json::parse(std::ifstream(out));
  ASSERT_FALSE(ref["end"].get<bool>());
  ASSERT_TRUE(ref["end2"].get<bool>());
  auto with_eos = [](std::vector<int64_t> v) {
    v.push_back(kImEnd);
    return v;
  };
  const auto wrong = with_eos(ref["wrong"].get<std::vector<int64_t>>());
  const auto right = with_eos(ref["right"].get<std::vector<int64_t>>());
  const auto user = ref["user"].get<std::vector<int64_t>>();

  for (int64_t max_user : {5, 1}) {
    RolloutConfig c = config("", 300);
    c.multi_turn.tool_config_path.reset();
    c.multi_turn.interaction_config_path = yaml;
    c.multi_turn.max_user_turns = max_user;
    ToolHostOptions options;
    options.interaction_config_path = yaml;
    auto host = ToolHost::start(options);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    auto mt = MultiTurnRollout::create(c, tokenizer_, chat_, std::move(host).value());
    ASSERT_TRUE(mt.ok()) << mt.status().to_string();
    ScriptedEngine engine;
    engine.script[0] = {wrong, max_user == 5 ? right : wrong};
    engine.script[1] = {wrong};
    // Without tools the rows' tools_kwargs are not read (verl ignores them then).
    proto::DataProto in = batch(messages, {json{{"search", json::object()}}, json::object()});
    ASSERT_TRUE(in.set_column("interaction_kwargs",
                              proto::Column::jsons({json{{"name", "gsm8k"}, {"ground_truth", "72"}}, json::object()}))
                    .ok());
    auto got = (*mt)->generate(engine, in);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(engine.seen[0].size(), 2U);
    EXPECT_EQ(engine.seen[0][1], cat({engine.seen[0][0], wrong, user}));  // the interaction's reply, tokenized
    EXPECT_EQ(engine.seen[1].size(), 1U);                                 // no interaction_kwargs: one turn
    auto scores = got->column("reward_scores");
    ASSERT_TRUE(scores.ok());
    if (max_user == 5) {
      EXPECT_EQ(scores->json_value(0)["user_turn_rewards"], json::array({ref["reward"], ref["reward2"]}));
    } else {
      EXPECT_EQ(scores->json_value(0)["user_turn_rewards"], json::array({ref["reward"]}));  // no reply after the cap
    }
    EXPECT_EQ(scores->json_value(1)["user_turn_rewards"], json::array());
    EXPECT_EQ(got->column("__num_turns__")->i64(0), 4);  // 2 assistant turns, 1 user turn, + 1
    const auto mask = row_of(*got->tensor("response_mask"), 0);
    EXPECT_EQ(std::accumulate(mask.begin(), mask.end(), int64_t{0}),
              static_cast<int64_t>(wrong.size() + (max_user == 5 ? right : wrong).size()));  // the user turn: 0
  }
}

// Every instance created is released: after the last turn (also when calc_reward raises) and when
// the rollout stops early.
TEST_F(MultiTurn, InstancesAreReleasedOnEveryPath) {
  TempDir tools("multi_turn_tools");
  const auto yaml = tools.write("t.yaml", "tools:\n" + tool_entry("RecordingTool", "rec")).string();
  const auto log = tools.path() / "log.txt";
  ScopedEnv log_env("TESSERA_TOOL_LOG", log.string());
  auto mt = rollout(config(yaml, 64));
  ASSERT_NE(mt, nullptr);
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto read_log = [&] {
    std::ifstream in(log);
    std::map<std::string, int> count;
    for (std::string op, id; in >> op >> id;) count[op] += 1;
    std::filesystem::remove(log);
    return count;
  };
  ScriptedEngine failing;
  failing.fail = true;
  auto stopped = mt->generate(failing, batch(messages, {json::object(), json::object()}));
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(read_log(), (std::map<std::string, int>{{"create", 2}, {"release", 2}}));
  ScriptedEngine engine;
  engine.script[0] = {{kImEnd}};
  auto out = mt->generate(engine, batch(messages, {json::object()}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("row 0: tool 'rec'.calc_reward/release failed: RuntimeError: no reward today"),
            std::string::npos) << out.status().to_string();
  EXPECT_EQ(read_log(), (std::map<std::string, int>{{"create", 1}, {"release", 1}}));
}

// Rollout TP: the peers run the same conversations; rank 0 runs each tool call once and both
// peers see its answers. A tool host that fails to start on rank 0 fails every peer.
TEST_F(MultiTurn, TensorParallelPeersShareRankZerosTools) {
  TempDir tools("multi_turn_tools");
  const auto yaml = tools.write("t.yaml", "tools:\n" + tool_entry("RecordingTool", "rec")).string();
  const auto log = tools.path() / "log.txt";
  ScopedEnv log_env("TESSERA_TOOL_LOG", log.string());
  const json messages = json::array({{{"role", "user"}, {"content", "Where?"}}});
  auto call = tokenizer_->encode("<tool_call>\n{\"name\": \"rec\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  ASSERT_TRUE(call.ok());
  std::vector<int64_t> call_ids(call->begin(), call->end());
  call_ids.push_back(kImEnd);
  RolloutConfig c = config(yaml, 300);
  c.mode = "async";  // the agent loop: a create and a release per call
  c.multi_turn.enable = false;
  std::vector<std::vector<int64_t>> responses(2);
  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& comm) {
    std::shared_ptr<collective::Communicator> group(&comm, [](collective::Communicator*) {});
    ToolHostOptions options;
    options.config_path = yaml;
    Result<std::unique_ptr<ToolHost>> host = std::unique_ptr<ToolHost>();
    if (rank == 0) host = ToolHost::start(options);
    auto relay = relay_tools(group, std::move(host), std::chrono::seconds(60));
    ASSERT_TRUE(relay.ok()) << relay.status().to_string();
    EXPECT_TRUE((*relay)->has_tool("rec"));
    auto mt = MultiTurnRollout::create(c, tokenizer_, chat_, std::move(relay).value());
    ASSERT_TRUE(mt.ok()) << mt.status().to_string();
    ScriptedEngine engine;
    engine.script[0] = {call_ids, call_ids, {kImEnd}};
    proto::DataProto in = batch(messages, {json::object()});
    ASSERT_TRUE(in.set_column("agent_name", proto::Column::strings({"tool_agent"})).ok());
    auto out = (*mt)->generate(engine, in);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(engine.seen[0].size(), 3U);
    responses[static_cast<size_t>(rank)] = row_of(*out->tensor("responses"), 0);
    // rank 0's start failure reaches both peers.
    ToolHostOptions missing;
    missing.config_path = (tools.path() / "missing.yaml").string();
    Result<std::unique_ptr<ToolHost>> failed = std::unique_ptr<ToolHost>();
    if (rank == 0) failed = ToolHost::start(missing);
    auto refused = relay_tools(group, std::move(failed), std::chrono::seconds(60));
    EXPECT_FALSE(refused.ok());
    if (!refused.ok()) {
      EXPECT_NE(refused.status().message().find("missing.yaml"), std::string::npos) << refused.status().to_string();
    }
    // The SGLang loop over the relay: create, execute and calc_reward run on rank 0, and both peers
    // get the reward.
    ToolHostOptions gsm8k;
    gsm8k.config_path = gsm8k_;
    Result<std::unique_ptr<ToolHost>> gsm8k_host = std::unique_ptr<ToolHost>();
    if (rank == 0) gsm8k_host = ToolHost::start(gsm8k);
    auto gsm8k_relay = relay_tools(group, std::move(gsm8k_host), std::chrono::seconds(60));
    EXPECT_TRUE(gsm8k_relay.ok()) << gsm8k_relay.status().to_string();
    if (!gsm8k_relay.ok()) return;
    auto sync = MultiTurnRollout::create(config(gsm8k_, 300), tokenizer_, chat_, std::move(gsm8k_relay).value());
    EXPECT_TRUE(sync.ok());
    if (!sync.ok()) return;
    auto answer = tokenizer_->encode(
        "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>");
    std::vector<int64_t> answer_ids(answer->begin(), answer->end());
    answer_ids.push_back(kImEnd);
    ScriptedEngine sync_engine;
    sync_engine.script[0] = {answer_ids, {kImEnd}};
    auto scored = (*sync)->generate(
        sync_engine, batch(messages, {json{{"calc_gsm8k_reward", {{"create_kwargs", {{"ground_truth", "72"}}}}}}}));
    EXPECT_TRUE(scored.ok()) << scored.status().to_string();
    if (scored.ok()) {
      EXPECT_EQ(scored->column("reward_scores")->json_value(0)["calc_gsm8k_reward"], 1.0) << rank;
    }
  });
  EXPECT_EQ(responses[0], responses[1]);
  // Two calls, each run once (an instance created and released per call), not once per peer.
  std::ifstream in(log);
  std::map<std::string, int> count;
  for (std::string op, id; in >> op >> id;) count[op] += 1;
  EXPECT_EQ(count, (std::map<std::string, int>{{"create", 2}, {"release", 2}}));
}

// What JSON cannot carry does not break the tool host: UTF-8 answers arrive intact, non-finite
// rewards become null, numpy values plain numbers.
TEST_F(MultiTurn, ToolAnswersCrossTheProcessBoundaryIntact) {
  TempDir tools("multi_turn_tools");
  const auto yaml = tools.write("t.yaml", "tools:\n" + tool_entry("OddTool", "odd")).string();
  auto mt = rollout(config(yaml, 300));
  ASSERT_NE(mt, nullptr);
  auto call = tokenizer_->encode("<tool_call>\n{\"name\": \"odd\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>");
  ASSERT_TRUE(call.ok());
  std::vector<int64_t> call_ids(call->begin(), call->end());
  call_ids.push_back(kImEnd);
  ScriptedEngine engine;
  engine.script[0] = {call_ids, {kImEnd}};
  const json messages = json::array({{{"role", "user"}, {"content", "Weather?"}}});
  auto out = mt->generate(engine, batch(messages, {json::object()}));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(engine.seen[0].size(), 2U);
  const auto& second = engine.seen[0][1];
  auto text = tokenizer_->decode(std::vector<int32_t>(second.end() - 30, second.end()));
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("naïve ✓ €"), std::string::npos) << *text;
  EXPECT_TRUE(out->column("reward_scores")->json_value(0)["odd"].is_null());
  EXPECT_EQ(mt->last_stats().tool_errors, 0);
}

TEST_F(MultiTurn, BadToolConfigsAndRowsAreOneLineErrors) {
  ToolHostOptions options;
  options.config_path = (dir_.path() / "missing.yaml").string();
  auto host = ToolHost::start(options);
  ASSERT_FALSE(host.ok());
  EXPECT_NE(host.status().message().find("multi_turn.tool_config_path"), std::string::npos) << host.status().to_string();
  auto mt = rollout(config(gsm8k_, 64));
  ASSERT_NE(mt, nullptr);
  ScriptedEngine engine;
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto unknown = mt->generate(engine, batch(messages, {json{{"search", json::object()}}}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'search'"), std::string::npos) << unknown.status().to_string();
  auto bad_kwargs = mt->generate(engine, batch(messages, {json{{"calc_gsm8k_reward", {{"create_kwargs", "72"}}}}}));
  ASSERT_FALSE(bad_kwargs.ok());
  EXPECT_NE(bad_kwargs.status().message().find("row 0: tools_kwargs.calc_gsm8k_reward.create_kwargs"),
            std::string::npos) << bad_kwargs.status().to_string();
  RolloutConfig tight = config(gsm8k_, 64);
  tight.prompt_length = 16;
  auto small = rollout(tight);
  ASSERT_NE(small, nullptr);
  auto long_prompt = small->generate(engine, batch(messages, {json::object()}));
  ASSERT_FALSE(long_prompt.ok());
  EXPECT_NE(long_prompt.status().message().find("prompt_length"), std::string::npos) << long_prompt.status().to_string();
}

}  // namespace
}  // namespace tessera::rollout
