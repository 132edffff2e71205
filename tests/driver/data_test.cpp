// RLHFDataset / SFTDataset against the tokenizer directly, truncation modes, filtering, bad
// lines, and the resumable dataloader.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "driver/config.hpp"
#include "driver/data.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using testing::qwen3_tokenizer;
using testing::TempDir;

std::string rl_row(const std::string& question, const std::string& answer, int index) {
  json row = {{"data_source", "tessera/arith"},
              {"prompt", json::array({{{"role", "user"}, {"content", question}}})},
              {"ability", "math"},
              {"reward_model", {{"style", "rule"}, {"ground_truth", answer}}},
              {"extra_info", {{"index", index}, {"split", "train"}}}};
  return row.dump() + "\n";
}

// The ids the dataset must produce, computed from a hand-written ChatML string.
std::vector<int32_t> expected_ids(const std::string& question) {
  auto ids = qwen3_tokenizer().encode("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_TRUE(ids.ok());
  return *ids;
}

std::vector<int64_t> row_of(const at::Tensor& t, int64_t i) {
  at::Tensor r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

RLHFDatasetOptions options(int64_t max_len, Truncation trunc = Truncation::error, bool filter = false) {
  RLHFDatasetOptions o;
  o.max_prompt_length = max_len;
  o.truncation = trunc;
  o.filter_overlong_prompts = filter;
  return o;
}

TEST(RLHFDataset, TokenisesLeftPadsAndKeepsColumns) {
  TempDir dir("rl");
  auto file = dir.write("train.jsonl", rl_row("What is 2+3?", "5", 7) + "\n" + rl_row("Hi there, compute 12*12", "144", 8));
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), options(40));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  ASSERT_EQ(ds->size(), 2);
  auto batch = ds->collate({1, 0});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  at::Tensor ids = *batch->tensor("input_ids"), mask = *batch->tensor("attention_mask"), pos = *batch->tensor("position_ids");
  EXPECT_EQ(ids.sizes(), (std::vector<int64_t>{2, 40}));
  const int32_t pad = *qwen3_tokenizer().pad_token_id();
  for (int64_t i = 0; i < 2; ++i) {
    auto want = expected_ids(i == 0 ? "Hi there, compute 12*12" : "What is 2+3?");
    const int64_t n = static_cast<int64_t>(want.size()), offset = 40 - n;
    auto got = row_of(ids, i), m = row_of(mask, i), p = row_of(pos, i);
    for (int64_t j = 0; j < 40; ++j) {
      EXPECT_EQ(got[j], j < offset ? pad : want[j - offset]) << "row " << i << " col " << j;
      EXPECT_EQ(m[j], j < offset ? 0 : 1);
      EXPECT_EQ(p[j], j < offset ? 0 : j - offset);
    }
  }
  EXPECT_EQ(batch->column("data_source")->str(0), "tessera/arith");
  EXPECT_EQ(batch->column("reward_model")->json_value(0)["ground_truth"], "144");
  EXPECT_EQ(batch->column("extra_info")->json_value(1)["split"], "train");
  EXPECT_EQ(batch->column("index")->i64(0), 8);
  EXPECT_EQ(batch->column("raw_prompt")->json_value(1)[0]["content"], "What is 2+3?");
  EXPECT_EQ(batch->column("raw_prompt_ids")->json_value(1).size(), expected_ids("What is 2+3?").size());
  EXPECT_FALSE(ds->collate({2}).ok());
  EXPECT_EQ(batch->column("tools_kwargs")->json_value(0), json::object());
  EXPECT_FALSE(batch->column("agent_name").ok());  // none of the rows names an agent loop
}

// The multi-turn rollout's columns: extra_info.tools_kwargs and interaction_kwargs per row, and
// agent_name (verl's agent loops) when the data has it, single_turn_agent for the rows without one.
// A row's other fields reach the batch as columns of the same name, as verl's batch carries every
// dataset column: one every row holds as a string is a string column (what data.reward_fn_key
// reads), any other is JSON with null where a row lacks it; a field verl's __getitem__ sets itself
// (index, input_ids, ...) is not taken from the row.
TEST(RLHFDataset, OtherRowFieldsBecomeBatchColumns) {
  TempDir dir("rl_columns");
  json a = json::parse(rl_row("What is 2+3?", "5", 1)), b = json::parse(rl_row("What is 1+1?", "2", 2));
  a["task"] = "tessera/arith", b["task"] = "tessera/arith";
  a["difficulty"] = {{"level", 3}};
  a["index"] = 99;  // verl's index comes from extra_info
  a["images"] = json::array({json::object({{"path", "x.png"}})});  // data.image_key: text only, not carried
  auto file = dir.write("train.jsonl", a.dump() + "\n" + b.dump());
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), options(40));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto batch = ds->collate({1, 0});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  ASSERT_TRUE(batch->column("task").ok());
  EXPECT_EQ(batch->column("task")->type(), proto::ColumnType::string);
  EXPECT_EQ(batch->column("task")->str(1), "tessera/arith");
  ASSERT_TRUE(batch->column("difficulty").ok());
  EXPECT_TRUE(batch->column("difficulty")->json_value(0).is_null());
  EXPECT_EQ(batch->column("difficulty")->json_value(1)["level"], 3);
  EXPECT_EQ(batch->column("index")->i64(1), 1);
  EXPECT_FALSE(batch->column("images").ok());
}

TEST(RLHFDataset, ToolsKwargsAndAgentNames) {
  TempDir dir("rl_tools");
  json tool_row = json::parse(rl_row("What is 2+3?", "5", 1));
  tool_row["extra_info"]["tools_kwargs"] = {{"calc_gsm8k_reward", {{"create_kwargs", {{"ground_truth", "5"}}}}}};
  tool_row["extra_info"]["interaction_kwargs"] = {{"name", "gsm8k"}, {"ground_truth", "5"}};
  tool_row["agent_name"] = "tool_agent";
  auto file = dir.write("train.jsonl", tool_row.dump() + "\n" + rl_row("What is 1+1?", "2", 2));
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), options(40));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto batch = ds->collate({0, 1});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  EXPECT_EQ(batch->column("tools_kwargs")->json_value(0), tool_row["extra_info"]["tools_kwargs"]);
  EXPECT_EQ(batch->column("tools_kwargs")->json_value(1), json::object());
  EXPECT_EQ(batch->column("interaction_kwargs")->json_value(0), tool_row["extra_info"]["interaction_kwargs"]);
  EXPECT_EQ(batch->column("interaction_kwargs")->json_value(1), json::object());
  EXPECT_EQ(batch->column("agent_name")->str(0), "tool_agent");
  EXPECT_EQ(batch->column("agent_name")->str(1), "single_turn_agent");
  json bad = json::parse(rl_row("Hi", "1", 3));
  bad["agent_name"] = 5;
  auto bad_file = dir.write("bad.jsonl", bad.dump() + "\n");
  auto refused = RLHFDataset::load({bad_file}, qwen3_tokenizer(), options(40));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'agent_name' must be a string"), std::string::npos);
}

TEST(RLHFDataset, ChatTemplateVariablesReachTheTemplate) {
  // verl's data.apply_chat_template_kwargs: Qwen3's template closes an empty think block when
  // enable_thinking is false, as transformers renders it.
  TempDir dir("rl_kwargs");
  auto file = dir.write("train.jsonl", rl_row("What is 2+3?", "5", 7));
  auto cfg = load_config(ConfigKind::ppo, {}, {"+data.apply_chat_template_kwargs.enable_thinking=false",
                                                "data.max_prompt_length=40"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto opts = RLHFDatasetOptions::from_config(*cfg);
  ASSERT_TRUE(opts.ok()) << opts.status().to_string();
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), *opts);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto want = qwen3_tokenizer().encode("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(ds->row(0).prompt_ids, *want);
  opts->chat_template = "chatml";  // a native format has no variables: refused, naming the key
  auto refused = RLHFDataset::load({file}, qwen3_tokenizer(), *opts);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("data.apply_chat_template_kwargs"), std::string::npos);
}

// A row's objects keep their keys in the file's order, as Python's dicts do: a template's
// `tojson` of tool-call arguments prints them as transformers renders them (json.dumps keeps
// insertion order), not sorted.
TEST(RLHFDataset, ToolCallArgumentsKeepTheRowsKeyOrder) {
  TempDir dir("rl_key_order");
  auto file = dir.write("train.jsonl",
                        R"({"data_source": "t", "reward_model": {"ground_truth": "1"}, "prompt": [)"
                        R"({"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": )"
                        R"([{"type": "function", "function": {"name": "f", "arguments": {"zeta": 1, "alpha": [2, "b"]}}}]}]})"
                        "\n");
  RLHFDatasetOptions o = options(64);
  o.chat_template = "{%- for m in messages %}{%- if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}"
                    "{%- endif %}{%- endfor %}";
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto want = qwen3_tokenizer().encode(R"({"zeta": 1, "alpha": [2, "b"]})");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(ds->row(0).prompt_ids, *want);
}

TEST(RLHFDataset, TruncationModes) {
  TempDir dir("trunc");
  const std::string q = "one two three four five six seven eight nine ten";
  auto file = dir.write("t.jsonl", rl_row(q, "1", 0));
  auto full = expected_ids(q);
  ASSERT_GT(full.size(), 12u);
  auto tail_of = [&](const RLHFDataset& ds) {
    auto b = ds.collate({0});
    return row_of(*b->tensor("input_ids"), 0);
  };
  auto left = RLHFDataset::load({file}, qwen3_tokenizer(), options(7, Truncation::left));
  ASSERT_TRUE(left.ok());
  auto ids = tail_of(*left);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(ids[j], full[full.size() - 7 + j]);
  auto right = RLHFDataset::load({file}, qwen3_tokenizer(), options(7, Truncation::right));
  ids = tail_of(*right);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(ids[j], full[j]);
  auto middle = RLHFDataset::load({file}, qwen3_tokenizer(), options(7, Truncation::middle));
  ids = tail_of(*middle);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(ids[j], full[j]);  // 7 / 2 = 3 from the head
  for (int j = 0; j < 4; ++j) EXPECT_EQ(ids[3 + j], full[full.size() - 4 + j]);
  auto error = RLHFDataset::load({file}, qwen3_tokenizer(), options(7, Truncation::error));
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.status().message().find(file.string() + ":1"), std::string::npos) << error.status().message();
  EXPECT_NE(error.status().message().find("truncation=error"), std::string::npos);
}

TEST(RLHFDataset, FilterOverlongPrompts) {
  TempDir dir("filter");
  auto file = dir.write("f.jsonl", rl_row("short", "1", 0) + rl_row(std::string(200, 'x') + " long words here", "2", 1) +
                                       rl_row("also short", "3", 2));
  auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), options(20, Truncation::error, /*filter=*/true));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->num_filtered(), 1);
  EXPECT_EQ(ds->row(1).reward_model["ground_truth"], "3");
}

TEST(RLHFDataset, MalformedLinesNameFileAndLine) {
  TempDir dir("bad");
  const std::string good = rl_row("q", "1", 0);
  struct Case {
    std::string line, why;
  } cases[] = {{"{not json", "not valid JSON"},
               {"[1,2]", "expected a JSON object"},
               {R"({"prompt":[{"role":"user","content":"x"}],"reward_model":{"ground_truth":"1"}})", "data_source"},
               {R"({"data_source":"d","prompt":"text","reward_model":{"ground_truth":"1"}})", "chat messages"},
               {R"({"data_source":"d","prompt":[{"role":"user"}],"reward_model":{"ground_truth":"1"}})", "content"},
               {R"({"data_source":"d","prompt":[{"role":"user","content":"x"}]})", "reward_model"}};
  for (const auto& c : cases) {
    auto file = dir.write("bad.jsonl", good + "\n" + c.line + "\n");
    auto ds = RLHFDataset::load({file}, qwen3_tokenizer(), options(64));
    ASSERT_FALSE(ds.ok()) << c.line;
    const std::string msg = ds.status().message();
    EXPECT_NE(msg.find(file.string() + ":3:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.why), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  auto missing = RLHFDataset::load({dir.path() / "none.jsonl"}, qwen3_tokenizer(), options(64));
  EXPECT_NE(missing.status().message().find("none.jsonl"), std::string::npos);
}

// verl's parquet files, written by pandas (as examples/data_preprocess/gsm8k.py does) and by
// pyarrow directly (string columns, several row groups, as HF datasets writes them), read to the
// same rows as the JSONL form of the same data.
const char* kWriteParquet = R"(
import sys, pandas as pd, pyarrow as pa, pyarrow.parquet as pq
out = sys.argv[1]
rows = []
for i, (q, a) in enumerate([("What is 2+3?", "5"), ("Hi there, compute 12*12", "144"), ("Ünïcode: 7-1?", "6")]):
    rows.append({
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": q}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": a},
        "extra_info": {"split": "train", "index": i, "answer": "#### " + a, "question": q},
    })
pd.DataFrame(rows).to_parquet(out + "/pandas.parquet")
pq.write_table(pa.Table.from_pylist(rows), out + "/arrow.parquet", row_group_size=2)
bad = [dict(rows[0]), dict(rows[1])]
bad[1]["reward_model"] = None
pd.DataFrame(bad).to_parquet(out + "/bad.parquet")
open(out + "/text.parquet", "w").write("not parquet\n")
)";

TEST(RLHFDataset, ReadsVerlParquetFiles) {
  TempDir dir("parquet");
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with pandas and pyarrow) is not set";
  std::ofstream(dir.path() / "write.py") << kWriteParquet;
  ASSERT_EQ(std::system(fmt::format("{} {} {}", py, (dir.path() / "write.py").string(), dir.path().string()).c_str()), 0);
  auto jsonl = dir.write("same.jsonl", rl_row("What is 2+3?", "5", 0) + rl_row("Hi there, compute 12*12", "144", 1) +
                                           rl_row("Ünïcode: 7-1?", "6", 2));
  auto want = RLHFDataset::load({jsonl}, qwen3_tokenizer(), options(48));
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (const char* name : {"pandas.parquet", "arrow.parquet"}) {
    auto got = RLHFDataset::load({dir.path() / name}, qwen3_tokenizer(), options(48));
    if (!got.ok() && got.status().message().find("this build reads no parquet") != std::string::npos) {
      GTEST_SKIP() << got.status().message();
    }
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
    ASSERT_EQ(got->size(), 3) << name;
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got->row(i).prompt_ids, want->row(i).prompt_ids) << name << " row " << i;
      EXPECT_EQ(got->row(i).prompt, want->row(i).prompt) << name;
      EXPECT_EQ(got->row(i).data_source, "openai/gsm8k");
      EXPECT_EQ(got->row(i).reward_model["ground_truth"], want->row(i).reward_model["ground_truth"]);
      EXPECT_EQ(got->row(i).extra_info["index"], i) << name;
      EXPECT_EQ(got->row(i).extra_info["answer"], "#### " + want->row(i).reward_model["ground_truth"].get<std::string>());
    }
  }
  auto bad = RLHFDataset::load({dir.path() / "bad.parquet"}, qwen3_tokenizer(), options(48));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.parquet:row 1: 'reward_model'"), std::string::npos) << bad.status().message();
  auto text = RLHFDataset::load({dir.path() / "text.parquet"}, qwen3_tokenizer(), options(48));
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("text.parquet: "), std::string::npos) << text.status().message();
  EXPECT_EQ(text.status().message().find('\n'), std::string::npos);
  auto missing = RLHFDataset::load({dir.path() / "none.parquet"}, qwen3_tokenizer(), options(48));
  EXPECT_NE(missing.status().message().find("none.parquet: cannot open"), std::string::npos);
}

// verl's gsm8k SFT recipe: prompt_key=extra_info, prompt_dict_keys=['question'] (and the same
// for the answer) reads the nested fields.
TEST(SFTDataset, DictKeysReadNestedFields) {
  TempDir dir("sft_dict");
  auto nested = dir.write("n.jsonl", json({{"extra_info", {{"question", "2+2?"}, {"answer", "4"}}}}).dump() + "\n");
  auto flat = dir.write("f.jsonl", json({{"question", "2+2?"}, {"answer", "4"}}).dump() + "\n");
  SFTDatasetOptions o;
  o.max_length = 32;
  auto want = SFTDataset::load({flat}, qwen3_tokenizer(), o);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  o.prompt_key = o.response_key = "extra_info";
  o.prompt_dict_keys = {"question"};
  o.response_dict_keys = {"answer"};
  auto got = SFTDataset::load({nested}, qwen3_tokenizer(), o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->example(0).prompt_ids, want->example(0).prompt_ids);
  EXPECT_EQ(got->example(0).response_ids, want->example(0).response_ids);
  o.prompt_dict_keys = {"query"};
  auto bad = SFTDataset::load({nested}, qwen3_tokenizer(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("n.jsonl:1: 'extra_info' has no key 'query'"), std::string::npos)
      << bad.status().message();
}

TEST(SFTDataset, LossMaskFollowsVerl) {
  TempDir dir("sft");
  auto file = dir.write("sft.jsonl", json({{"question", "2+2?"}, {"answer", "4"}}).dump() + "\n");
  SFTDatasetOptions o;
  o.max_length = 32;
  auto ds = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto prompt = expected_ids("2+2?");
  auto response = *qwen3_tokenizer().encode("4<|im_end|>");
  auto batch = ds->collate({0});
  ASSERT_TRUE(batch.ok());
  auto ids = row_of(*batch->tensor("input_ids"), 0), mask = row_of(*batch->tensor("attention_mask"), 0);
  auto loss = row_of(*batch->tensor("loss_mask"), 0);
  const size_t p = prompt.size(), r = response.size();
  for (size_t j = 0; j < 32; ++j) {
    int64_t want_id = j < p ? prompt[j] : j < p + r ? response[j - p] : *qwen3_tokenizer().pad_token_id();
    EXPECT_EQ(ids[j], want_id) << j;
    EXPECT_EQ(mask[j], j < p + r ? 1 : 0) << j;
    // Positions p-1 .. p+r-2 predict response tokens.
    EXPECT_EQ(loss[j], (j + 1 >= p && j + 2 <= p + r) ? 1 : 0) << j;
  }
}

// verl's MultiTurnSFTDataset, run on the same rows (its module loaded on its own: the package
// imports HF datasets; transformers 5's apply_chat_template returns a mapping where verl 0.5.0
// expects the ids).
const char* kVerlMultiTurnSft = R"(
import importlib.util, json, sys, types, pandas as pd
ray = types.ModuleType("ray")  # verl imports ray for DataProtoFuture only
ray.ObjectRef = object
sys.modules.setdefault("ray", ray)
import verl
from transformers import AutoTokenizer
spec = importlib.util.spec_from_file_location("mtsft", verl.__path__[0] + "/utils/dataset/multiturn_sft_dataset.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
template = open(sys.argv[4]).read()
if template:
    tok.chat_template = template
original = tok.apply_chat_template
def compat(*args, **kwargs):
    out = original(*args, **kwargs)
    return out["input_ids"] if kwargs.get("tokenize", True) and hasattr(out, "keys") else out
tok.apply_chat_template = compat
rows = [json.loads(line) for line in open(sys.argv[2])]
pd.DataFrame(rows).to_parquet(sys.argv[3] + ".parquet")
ds = m.MultiTurnSFTDataset([sys.argv[3] + ".parquet"], tok, {"max_length": 160, "truncation": "error"})
out = []
for i in range(len(rows)):
    x = ds[i]
    n = int(x["attention_mask"].sum())
    out.append({"ids": x["input_ids"][:n].tolist(), "loss": x["loss_mask"][:n].tolist()})
json.dump(out, open(sys.argv[3], "w"))
)";

// A ChatML template that keeps earlier turns as they are and renders tools in the system turn.
constexpr const char* kStableTemplate =
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(SFTDataset, MultiTurnConversationsMatchVerls) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with verl, transformers, pandas) is not set";
  TempDir dir("sft_multiturn");
  const json tool = {{"type", "function"},
                     {"function", {{"name", "calc"}, {"description", "adds"}, {"parameters", {{"type", "object"}}}}}};
  const json rows = json::array(
      {{{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "2+2?"}},
                      {{"role", "assistant"}, {"content", "4"}}, {{"role", "user"}, {"content", "and 3+3?"}},
                      {{"role", "assistant"}, {"content", "<tool_call>calc</tool_call>"}},
                      {{"role", "tool"}, {"content", "6"}}, {{"role", "tool"}, {"content", "ok"}},
                      {{"role", "assistant"}, {"content", "6"}}}},
        {"tools", {tool}}},
       {{"messages", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello!"}}}}}});
  std::string lines;
  for (const auto& r : rows) lines += r.dump() + "\n";
  const auto file = dir.write("conversations.jsonl", lines);
  const auto template_file = dir.write("template.jinja", kStableTemplate);
  dir.write("verl_sft.py", kVerlMultiTurnSft);
  const auto out = dir.path() / "verl.json";
  const auto run = testing::run_command(fmt::format("'{}' '{}' '{}' '{}' '{}' '{}' 2>&1", py,
                                                    (dir.path() / "verl_sft.py").string(),
                                                    std::getenv("TESSERA_SHARED_DIR") + std::string("/golden/qwen3-tokenizer"),
                                                    file.string(), out.string(), template_file.string()));
  ASSERT_EQ(run.status, 0) << run.text;
  const json verl = json::parse(std::ifstream(out));
  SFTDatasetOptions o;
  o.multiturn = true;
  o.max_length = 160;
  o.chat_template = kStableTemplate;
  auto ds = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  auto batch = ds->collate({0, 1});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  for (int64_t i = 0; i < 2; ++i) {
    const auto want_ids = verl[static_cast<size_t>(i)]["ids"].get<std::vector<int64_t>>();
    const auto want_loss = verl[static_cast<size_t>(i)]["loss"].get<std::vector<int64_t>>();
    const size_t n = want_ids.size();
    auto ids = row_of(*batch->tensor("input_ids"), i), loss = row_of(*batch->tensor("loss_mask"), i);
    auto mask = row_of(*batch->tensor("attention_mask"), i), pos = row_of(*batch->tensor("position_ids"), i);
    EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n)), want_ids) << "row " << i;
    for (size_t j = 0; j < 160; ++j) {
      // verl marks the trained tokens; Tessera the positions that predict them.
      EXPECT_EQ(loss[j], j + 1 < n ? want_loss[j + 1] : 0) << "row " << i << " position " << j;
      EXPECT_EQ(mask[j], j < n ? 1 : 0);
      EXPECT_EQ(pos[j], j < n ? static_cast<int64_t>(j) : 0);
    }
  }
  // Left truncation keeps the conversation's end, the mask shifted with it.
  o.max_length = 24;
  o.truncation = Truncation::left;
  auto cut = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_TRUE(cut.ok()) << cut.status().to_string();
  auto cut_batch = cut->collate({0});
  ASSERT_TRUE(cut_batch.ok());
  {
    const auto want_ids = verl[0]["ids"].get<std::vector<int64_t>>();
    const auto want_loss = verl[0]["loss"].get<std::vector<int64_t>>();
    const size_t from = want_ids.size() - 24;
    auto ids = row_of(*cut_batch->tensor("input_ids"), 0), loss = row_of(*cut_batch->tensor("loss_mask"), 0);
    for (size_t j = 0; j < 24; ++j) {
      EXPECT_EQ(ids[j], want_ids[from + j]) << j;
      EXPECT_EQ(loss[j], j + 1 < 24 ? want_loss[from + j + 1] : 0) << j;
    }
  }
  o.max_length = 160;
  o.truncation = Truncation::error;
  // Qwen3's own template drops an earlier turn's think block once a later user turn follows: the
  // pieces are not the conversation, and the row is refused (verl warns and trains on them).
  o.chat_template = "auto";
  auto qwen3 = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_FALSE(qwen3.ok());
  EXPECT_NE(qwen3.status().message().find("conversations.jsonl:1: the chat template renders"), std::string::npos)
      << qwen3.status().to_string();
  // One assistant turn per row works with it, and a row's enable_thinking reaches the template
  // (false: Qwen3's generation prompt holds the empty think block, so it is not trained).
  json no_thinking = rows[1];
  no_thinking["enable_thinking"] = false;
  auto single = SFTDataset::load({dir.write("one.jsonl", rows[1].dump() + "\n" + no_thinking.dump() + "\n")},
                                 qwen3_tokenizer(), o);
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  auto trained = [&](const SFTExample& ex) { return std::count(ex.trained.begin(), ex.trained.end(), 1); };
  EXPECT_EQ(single->example(0).ids, single->example(1).ids);
  EXPECT_EQ(trained(single->example(0)) - trained(single->example(1)),
            static_cast<int64_t>(qwen3_tokenizer().encode("<think>\n\n</think>\n\n")->size()));
  auto bad = SFTDataset::load({dir.write("bad.jsonl", json({{"messages", {{{"role", "assistant"}, {"content", "x"}}}}}).dump() + "\n")},
                              qwen3_tokenizer(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:1: messages[0] is the assistant's"), std::string::npos)
      << bad.status().to_string();
}

TEST(SFTDataset, TruncationAndErrors) {
  TempDir dir("sft_trunc");
  auto file = dir.write("s.jsonl", json({{"question", "a b c d e f g h"}, {"answer", "i j k l m"}}).dump() + "\n");
  SFTDatasetOptions o;
  o.max_length = 6;
  auto err = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find(file.string() + ":1"), std::string::npos);
  o.truncation = Truncation::right;
  auto right = SFTDataset::load({file}, qwen3_tokenizer(), o);
  ASSERT_TRUE(right.ok());
  auto full = right->example(0).prompt_ids;
  auto ids = row_of(*right->collate({0})->tensor("input_ids"), 0);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(ids[j], full[j]);
  o.truncation = Truncation::left;
  auto left = SFTDataset::load({file}, qwen3_tokenizer(), o);
  auto resp = left->example(0).response_ids;
  ids = row_of(*left->collate({0})->tensor("input_ids"), 0);
  EXPECT_EQ(ids[5], resp.back());
  auto bad = dir.write("b.jsonl", json({{"question", "q"}}).dump() + "\n");
  auto missing = SFTDataset::load({bad}, qwen3_tokenizer(), o);
  EXPECT_NE(missing.status().message().find(bad.string() + ":1: missing 'answer'"), std::string::npos)
      << missing.status().message();
}

std::vector<std::vector<int64_t>> drain(StatefulDataLoader& dl, int64_t batches) {
  std::vector<std::vector<int64_t>> out;
  while (static_cast<int64_t>(out.size()) < batches) {
    auto b = dl.next();
    if (b) out.push_back(*b);
  }
  return out;
}

TEST(DataLoader, ShuffledEpochsArePermutations) {
  auto dl = StatefulDataLoader::create(10, {/*batch_size=*/3, /*shuffle=*/true, /*drop_last=*/true, /*seed=*/1});
  ASSERT_TRUE(dl.ok());
  EXPECT_EQ(dl->size(), 3);
  auto epoch0 = drain(*dl, 3);
  EXPECT_FALSE(dl->next().has_value());  // end of epoch 0
  EXPECT_EQ(dl->epoch(), 1);
  auto epoch1 = drain(*dl, 3);
  std::set<int64_t> seen;
  for (const auto& b : epoch0) seen.insert(b.begin(), b.end());
  EXPECT_EQ(seen.size(), 9u);  // 9 distinct rows; one dropped by drop_last
  EXPECT_NE(epoch0, epoch1);
  auto again = StatefulDataLoader::create(10, {3, true, true, 1});
  EXPECT_EQ(drain(*again, 3), epoch0);  // same seed, same order
  auto other = StatefulDataLoader::create(10, {3, true, true, 2});
  EXPECT_NE(drain(*other, 3), epoch0);
}

// The shuffled order is torch's RandomSampler with a seeded generator (verl's create_rl_sampler),
// epoch after epoch, checked against PyTorch itself.
TEST(DataLoader, ShuffledOrderIsTorchsRandomSampler) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with torch) is not set";
  for (auto [n, seed] : {std::pair<int64_t, uint64_t>{10, 1}, {37, 42}, {5, 7}}) {
    const std::string cmd = fmt::format(
        "{} -c 'import torch; from torch.utils.data import RandomSampler; g = torch.Generator(); g.manual_seed({}); "
        "s = RandomSampler(range({}), generator=g); print([i for e in range(3) for i in s])'",
        py, seed, n);
    const testing::CommandOutput torch_order = testing::run_command(cmd);
    ASSERT_EQ(torch_order.status, 0) << cmd;
    const std::string& want = torch_order.text;
    DataLoaderOptions o;
    o.batch_size = 1;
    o.seed = seed;
    auto loader = StatefulDataLoader::create(n, o);
    ASSERT_TRUE(loader.ok());
    std::vector<int64_t> got;
    for (int e = 0; e < 3; ++e) {
      while (auto batch = loader->next()) got.insert(got.end(), batch->begin(), batch->end());
    }
    EXPECT_EQ(fmt::format("[{}]\n", fmt::join(got, ", ")), want) << "n=" << n << " seed=" << seed;
  }
}

TEST(DataLoader, SequentialAndKeepLast) {
  auto dl = StatefulDataLoader::create(5, {2, /*shuffle=*/false, /*drop_last=*/false, 1});
  ASSERT_TRUE(dl.ok());
  EXPECT_EQ(dl->size(), 3);
  EXPECT_EQ(drain(*dl, 3), (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4}}));
  EXPECT_FALSE(StatefulDataLoader::create(2, {3, true, true, 1}).ok());
  EXPECT_FALSE(StatefulDataLoader::create(2, {0, true, true, 1}).ok());
}

TEST(DataLoader, ResumeGivesTheIdenticalSequence) {
  DataLoaderOptions o{4, true, true, 7};
  auto reference = StatefulDataLoader::create(18, o);
  auto all = drain(*reference, 12);  // three epochs of four batches
  auto first = StatefulDataLoader::create(18, o);
  auto head = drain(*first, 6);      // mid epoch 1
  json state = first->state_dict();
  auto resumed = StatefulDataLoader::create(18, o);
  ASSERT_TRUE(resumed->load_state_dict(json::parse(state.dump())).ok());
  auto tail = drain(*resumed, 6);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, all);
  // A state from another dataset size, or a malformed one, is refused naming the field.
  auto other = StatefulDataLoader::create(20, o);
  Status st = other->load_state_dict(state);
  EXPECT_NE(st.message().find("dataset_size"), std::string::npos) << st.message();
  json broken = state;
  broken.erase("epoch");
  EXPECT_NE(resumed->load_state_dict(broken).message().find("epoch"), std::string::npos);
}

}  // namespace
}  // namespace tessera::driver
