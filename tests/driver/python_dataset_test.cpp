// data.custom_cls: the user's dataset class, run by Python. verl's own RLHFDataset loaded as a
// custom class gives the batches Tessera's native loader gives on the same parquet file; a class
// of the user's is read item by item; whatever is wrong is a one-line error naming the item.
// Needs $TESSERA_PYTHON with verl, HF datasets and transformers, and the golden Qwen3 tokenizer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "driver/python_dataset.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using testing::qwen3_tokenizer;
using testing::ScopedEnv;
using testing::TempDir;

constexpr const char* kUserDatasets = R"PY(
import collections, torch
from torch.utils.data import Dataset

class Doubling(Dataset):
    """A question per line; its prompt is the question's tokens twice, left-padded."""
    def __init__(self, data_files, tokenizer, processor, config):
        self.given = type(data_files).__name__  # verl passes data.train_files as configured
        files = [data_files] if isinstance(data_files, str) else data_files
        self.rows = [line.strip() for f in files for line in open(f) if line.strip()]
        self.tokenizer, self.width = tokenizer, config.max_prompt_length
        assert config.return_raw_chat and processor is None
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        q = self.rows[i]
        if q == "bad":
            return {"data_source": "openai/gsm8k"}
        if q == "picture":
            return {"multi_modal_data": {"image": [1]}}
        if q == "half":
            return {"input_ids": [1.5], "attention_mask": [1]}
        ids = self.tokenizer.encode(q, add_special_tokens=False) * 2
        pad = self.width - len(ids)
        item = {"input_ids": torch.tensor([0] * pad + ids), "attention_mask": torch.tensor([0] * pad + [1] * len(ids)),
                "data_source": "openai/gsm8k", "reward_model": {"ground_truth": "1"},
                "extra_info": {"index": 10 + i, "given": self.given}, "raw_prompt": [{"role": "user", "content": q}],
                "agent_name": "tool_agent", "tools_kwargs": {"calc": {"create_kwargs": {"n": i}}}, "my_column": 1}
        return collections.UserDict(item) if q == "seven" else item  # any mapping will do, as in verl

class NotADataset:
    pass

class WithBatchEnd(Doubling):
    def on_batch_end(self, batch):
        pass
)PY";

class PythonDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = testing::tessera_python();
    const char* shared = std::getenv("TESSERA_SHARED_DIR");
    if (python_.empty() || shared == nullptr) GTEST_SKIP() << "needs TESSERA_PYTHON (verl, datasets) and TESSERA_SHARED_DIR";
    tokenizer_dir_ = (std::filesystem::path(shared) / "golden" / "qwen3-tokenizer").string();
    dir_.write("py/ray/__init__.py", "ObjectRef = object\n");  // verl imports ray for DataProtoFuture only
    dir_.write("py/user_datasets.py", kUserDatasets);
    path_.emplace("PYTHONPATH", (dir_.path() / "py").string());
  }

  // A config whose data.train_files is `files` (a path, or a list of them).
  static json config_of(const json& files) { return {{"data", {{"train_files", files}}}}; }

  PythonDatasetOptions options(const std::string& path, const std::string& name, int64_t width) const {
    PythonDatasetOptions o;
    o.path = path;
    o.name = name;
    o.data_config = {{"max_prompt_length", width}, {"truncation", "error"}, {"filter_overlong_prompts", false},
                     {"prompt_key", "prompt"}, {"return_raw_chat", true}};
    o.tokenizer_path = tokenizer_dir_;
    o.python = python_;
    return o;
  }

  std::string python_, tokenizer_dir_;
  TempDir dir_{"python_dataset"};
  std::optional<ScopedEnv> path_;
};

RLHFDatasetOptions rl_options(int64_t width) {
  RLHFDatasetOptions o;
  o.max_prompt_length = width;
  return o;
}

TEST_F(PythonDataset, VerlsRLHFDatasetAsACustomClassMatchesTheNativeLoader) {
  std::string lines;
  for (int i = 0; i < 3; ++i) {
    lines += json{{"data_source", "openai/gsm8k"},
                  {"prompt", json::array({{{"role", "user"}, {"content", "What is " + std::to_string(i) + " + 7?"}}})},
                  {"ability", "math"},
                  {"reward_model", {{"style", "rule"}, {"ground_truth", std::to_string(i + 7)}}},
                  {"extra_info", {{"index", 20 + i}, {"split", "train"}}}}
                 .dump() + "\n";
  }
  const auto jsonl = dir_.write("rows.jsonl", lines);
  const auto parquet = dir_.path() / "rows.parquet";
  const auto made = testing::run_command(fmt::format(
      "'{}' -c \"import pandas as pd; pd.read_json('{}', lines=True, dtype=False).to_parquet('{}')\" 2>&1", python_, jsonl.string(),
      parquet.string()));
  ASSERT_EQ(made.status, 0) << made.text;

  auto rows = read_python_dataset(config_of(json::array({parquet.string()})), "data.train_files",
                                  options("pkg://verl.utils.dataset.rl_dataset", "RLHFDataset", 40), 40);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  auto custom = RLHFDataset::from_rows(std::move(rows).value(), qwen3_tokenizer(), rl_options(40));
  ASSERT_TRUE(custom.ok()) << custom.status().to_string();
  auto native = RLHFDataset::load({parquet}, qwen3_tokenizer(), rl_options(40));
  ASSERT_TRUE(native.ok()) << native.status().to_string();
  ASSERT_EQ(custom->size(), 3);
  auto a = custom->collate({2, 0, 1});
  auto b = native->collate({2, 0, 1});
  ASSERT_TRUE(a.ok() && b.ok());
  for (const char* key : {"input_ids", "attention_mask", "position_ids"}) {
    EXPECT_TRUE(torch::equal(*a->tensor(key), *b->tensor(key))) << key;
  }
  for (const char* key : {"data_source", "ability", "reward_model", "extra_info", "raw_prompt", "raw_prompt_ids", "index",
                          "tools_kwargs", "interaction_kwargs"}) {
    EXPECT_EQ(a->column(key)->to_json(), b->column(key)->to_json()) << key;
  }
  EXPECT_EQ(a->column("index")->i64(0), 22);
}

TEST_F(PythonDataset, UserClassesAndTheirErrors) {
  const auto questions = dir_.write("q.txt", "one plus one\nseven\n");
  const std::string module = (dir_.path() / "py" / "user_datasets.py").string();
  auto rows = read_python_dataset(config_of(questions.string()), "data.train_files", options(module, "Doubling", 16), 16);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  ASSERT_EQ(rows->size(), 2u);
  auto seven = qwen3_tokenizer().encode("seven");
  ASSERT_TRUE(seven.ok());
  std::vector<int32_t> twice = *seven;
  twice.insert(twice.end(), seven->begin(), seven->end());
  const RLHFRow& r = (*rows)[1];
  EXPECT_EQ(r.prompt_ids, twice);
  EXPECT_EQ(r.data_source, "openai/gsm8k");
  EXPECT_EQ(r.reward_model["ground_truth"], "1");
  EXPECT_EQ(r.extra_info["index"], 11);
  EXPECT_EQ(r.prompt[0]["content"], "seven");
  EXPECT_EQ(r.agent_name, "tool_agent");
  EXPECT_EQ(r.tools_kwargs["calc"]["create_kwargs"]["n"], 1);  // the item's own, not extra_info's
  EXPECT_EQ(r.extra_info["given"], "str");  // a single path reaches the class as a string
  EXPECT_NE(r.source.find("over data.train_files: item 1"), std::string::npos) << r.source;
  auto listed = read_python_dataset(config_of(json::array({questions.string()})), "data.train_files",
                                    options(module, "Doubling", 16), 16);
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  EXPECT_EQ((*listed)[0].extra_info["given"], "ListConfig");

  auto error_of = [&](const std::string& text, const std::string& name, int64_t width = 16) {
    const auto file = dir_.write("e.txt", text);
    auto got = read_python_dataset(config_of(file.string()), "data.train_files", options(module, name, width), width);
    return got.ok() ? std::string("ok") : got.status().message();
  };
  auto contains = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  std::string e = error_of("seven\nbad\n", "Doubling");
  EXPECT_TRUE(contains(e, "data.custom_cls (Doubling from")) << e;
  EXPECT_TRUE(contains(e, "item 1: KeyError: 'input_ids'")) << e;
  e = error_of("picture\n", "Doubling");
  EXPECT_TRUE(contains(e, "item 0: ValueError: the item has multi_modal_data")) << e;
  e = error_of("seven\nhalf\n", "Doubling");
  EXPECT_TRUE(contains(e, "item 1: ValueError: input_ids holds 1.5, not an integer")) << e;
  e = error_of("seven\n", "WithBatchEnd");
  EXPECT_TRUE(contains(e, "defines on_batch_end")) << e;
  e = error_of("seven\n", "NotADataset");
  EXPECT_TRUE(contains(e, "must inherit from torch.utils.data.Dataset")) << e;
  e = error_of("seven\n", "Missing");
  EXPECT_TRUE(contains(e, "Missing")) << e;
  // The class pads to its own width; a prompt longer than data.max_prompt_length is refused.
  const auto file = dir_.write("long.txt", "one two three four five six seven eight nine ten\n");
  auto wide = options(module, "Doubling", 64);
  auto got = read_python_dataset(config_of(file.string()), "data.train_files", wide, 8);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(contains(got.status().message(), "data.max_prompt_length is 8")) << got.status().to_string();

  json cfg = {{"data", {{"custom_cls", {{"path", module}, {"name", nullptr}}}}},
              {"actor_rollout_ref", {{"model", {{"path", tokenizer_dir_}}}}}};
  auto unnamed = PythonDatasetOptions::from_config(cfg);
  ASSERT_FALSE(unnamed.ok());
  EXPECT_TRUE(contains(unnamed.status().message(), "data.custom_cls.name")) << unnamed.status().to_string();
}

// SFT: verl's own SFTDataset as a custom class gives the batches of Tessera's native SFT loader;
// a class's columns of the wrong width are an error naming the item.
TEST_F(PythonDataset, VerlsSFTDatasetAsACustomClassMatchesTheNativeLoader) {
  std::string lines;
  for (const auto& [q, a] : std::vector<std::pair<std::string, std::string>>{{"2+2?", "4"}, {"What is 12*12?", "144"}}) {
    lines += json{{"question", q}, {"answer", a}}.dump() + "\n";
  }
  const auto jsonl = dir_.write("sft.jsonl", lines);
  const auto parquet = dir_.path() / "sft.parquet";
  const auto made = testing::run_command(fmt::format(
      "'{}' -c \"import pandas as pd; pd.read_json('{}', lines=True, dtype=False).to_parquet('{}')\" 2>&1", python_, jsonl.string(),
      parquet.string()));
  ASSERT_EQ(made.status, 0) << made.text;
  SFTDatasetOptions sft;
  sft.max_length = 48;
  PythonDatasetOptions o = options("pkg://verl.utils.dataset.sft_dataset", "SFTDataset", 48);
  o.sft = true;
  o.data_config = {{"prompt_key", "question"}, {"response_key", "answer"}, {"max_length", 48}, {"truncation", "error"}};
  auto items = read_python_sft_dataset(config_of(parquet.string()), "data.train_files", o, 48);
  ASSERT_TRUE(items.ok()) << items.status().to_string();
  auto custom = SFTDataset::from_items(std::move(items).value(), qwen3_tokenizer(), sft);
  ASSERT_TRUE(custom.ok()) << custom.status().to_string();
  auto native = SFTDataset::load({parquet}, qwen3_tokenizer(), sft);
  ASSERT_TRUE(native.ok()) << native.status().to_string();
  auto a = custom->collate({1, 0});
  auto b = native->collate({1, 0});
  ASSERT_TRUE(a.ok() && b.ok());
  for (const char* key : {"input_ids", "attention_mask", "position_ids", "loss_mask"}) {
    EXPECT_TRUE(torch::equal(*a->tensor(key), *b->tensor(key))) << key << "\n" << *a->tensor(key) << "\n"
                                                                << *b->tensor(key);
  }
  // verl's class pads to data.max_length; a reader expecting another width names the item.
  auto narrow = read_python_sft_dataset(config_of(parquet.string()), "data.train_files", o, 40);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.status().message().find("item 0: input_ids has 48 values; data.max_length is 40"), std::string::npos)
      << narrow.status().to_string();
}

}  // namespace
}  // namespace tessera::driver
