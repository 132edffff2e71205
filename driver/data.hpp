// data.hpp: verl's datasets over parquet or JSONL files and a seeded, resumable dataloader.
//
// RLHFDataset (verl/utils/dataset/rl_dataset.py): one JSON object per line with verl's row fields
//   data_source   string (chooses the reward scorer)
//   prompt        list of chat messages [{"role": ..., "content": ...}] (key = data.prompt_key)
//   ability       string (optional)
//   reward_model  {"style": ..., "ground_truth": ...} (kept as JSON)
//   extra_info    any JSON (optional; extra_info.index becomes the `index` column)
// Each prompt is rendered with the chat template (generation prompt appended), tokenised without
// special tokens, then left-padded / truncated to data.max_prompt_length (truncation
// error|left|right|middle as verl's postprocess_data). With filter_overlong_prompts, rows whose
// rendered prompt is longer than max_prompt_length are dropped at load time (verl filters at
// init). Unlike verl, truncation=error fails at load time, naming FILE:LINE, instead of mid-epoch.
// collate() yields a DataProto with tensors input_ids, attention_mask, position_ids (int64,
// [B, max_prompt_length]) and non-tensor columns data_source, ability (strings), reward_model,
// extra_info, raw_prompt (the chat messages), raw_prompt_ids (the truncated, unpadded ids) (JSON),
// index (int64). verl adds raw_prompt only with data.return_raw_chat; Tessera always adds it.
//
// SFTDataset (verl/utils/dataset/sft_dataset.py): one JSON object per line with a prompt string
// under data.prompt_key and a response string under data.response_key. The prompt is rendered as
// one user message with the generation prompt; the response gets the EOS token appended; the
// concatenation is right-padded / truncated (error|left|right) to data.max_length, and loss_mask
// follows verl: 1 over the response positions shifted by one (the positions whose next token is
// a response token), 0 on the prompt, the last valid token and padding.
//
// With data.multiturn.enable (verl's MultiTurnSFTDataset) each row holds a conversation under
// data.multiturn.messages_key, optionally tool schemas (tools_key) and an enable_thinking flag
// (enable_thinking_key) for the chat template. It is tokenized message by message as verl does:
// each message (consecutive tool messages together) is the text the template adds for it, and an
// assistant message's tokens after its generation prompt are the ones trained. loss_mask is 1 on
// the positions whose next token is such a token (the single-turn dataset's convention; verl
// 0.5.0's multi-turn dataset marks the tokens themselves, which its trainer reads one position
// late). position_ids are 0 on padding, as verl. A conversation whose pieces differ from its
// whole rendering (a template that rewrites earlier turns; verl warns and trains on the pieces)
// is an error naming the row.
//
// Files ending in .parquet are read as parquet (verl's format: the same columns, nested messages
// and structs), anything else as JSONL. A malformed row is an error "FILE:LINE: why" (JSONL) or
// "FILE:row N: why" (parquet, N from 0). Thread-safety: datasets are immutable after load; the dataloader is not
// synchronised.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {

/// verl's handling of a sequence longer than its limit.
enum class Truncation { error, left, right, middle };

/// Parses "error" / "left" / "right" / "middle"; the error names `key`.
Result<Truncation> parse_truncation(std::string_view text, const std::string& key = "data.truncation");

/// Cuts `ids` to `max_length` by `mode` (left keeps the tail, right the head, middle keeps
/// max_length/2 head tokens and the rest from the tail). `mode == error` with an overlong input
/// is an error mentioning `what`. Inputs within the limit are returned unchanged.
Result<std::vector<int32_t>> truncate_ids(std::vector<int32_t> ids, int64_t max_length, Truncation mode,
                                          const std::string& what);

/// verl's compute_position_id_with_mask: clip(cumsum(mask, -1) - 1, min=0), int64.
at::Tensor compute_position_id_with_mask(const at::Tensor& attention_mask);

/// data.train_files / data.val_files: a path string or a list of them (verl accepts both).
Result<std::vector<std::filesystem::path>> data_files(const nlohmann::json& cfg, const std::string& key);

/// As data_files, for an optional set (data.val_files): an absent key, null or an empty list gives
/// no files (an empty list) instead of an error.
Result<std::vector<std::filesystem::path>> optional_data_files(const nlohmann::json& cfg, const std::string& key);

/// The pad id a dataset uses: the tokenizer's pad token, else its EOS (verl's hf_tokenizer).
Result<int32_t> dataset_pad_id(const tokenizer::Tokenizer& tokenizer);

/// Options of RLHFDataset (verl's data.* keys).
struct RLHFDatasetOptions {
  std::string prompt_key = "prompt";
  int64_t max_prompt_length = 512;
  Truncation truncation = Truncation::error;
  bool filter_overlong_prompts = false;
  std::string chat_template = "auto";  ///< ChatTemplate::from_name: auto | chatml | plain | Jinja text
  nlohmann::json chat_template_variables = nlohmann::json::object();  ///< Extra Jinja variables.
  /// data.image_key / data.video_key: media columns a text-only run does not read or carry.
  std::vector<std::string> media_keys = {"images", "videos"};

  /// data.{prompt_key,max_prompt_length,truncation,filter_overlong_prompts,apply_chat_template_kwargs}
  /// and actor_rollout_ref.model.custom_chat_template (null -> auto) from a loaded PPO config.
  static Result<RLHFDatasetOptions> from_config(const nlohmann::json& cfg);
};

/// One loaded RL row.
struct RLHFRow {
  std::string data_source;
  std::string ability;
  nlohmann::json prompt;        ///< The chat messages as read.
  nlohmann::json reward_model;  ///< {"style", "ground_truth", ...}
  nlohmann::json extra_info;    ///< null when absent.
  std::string agent_name;       ///< verl's agent loop for the row (rollout.mode=async); empty when absent.
  /// A custom dataset class's own values (data.custom_cls); null / unset: from extra_info.
  nlohmann::json tools_kwargs, interaction_kwargs;
  std::optional<int64_t> index;
  /// The row's other fields (a column `difficulty`, a `task` named by data.reward_fn_key, ...):
  /// batches carry them as columns of the same name, as verl's batch carries every dataset column.
  nlohmann::json columns = nlohmann::json::object();
  std::vector<int32_t> prompt_ids;  ///< Rendered, tokenised and truncated (not padded).
  std::string source;           ///< "FILE:LINE" for messages.
};

/// Whether a dataset row's field `key` is one of its other columns (RLHFRow::columns): not a field
/// RLHFRow models, nor one verl's __getitem__ or the trainer sets itself (input_ids, index, uid, ...).
bool is_row_column(const std::string& key);

/// verl's RLHFDataset over parquet / JSONL files.
class RLHFDataset {
 public:
  /// Loads, renders and tokenises every row of `files` in order.
  static Result<RLHFDataset> load(const std::vector<std::filesystem::path>& files, const tokenizer::Tokenizer& tokenizer,
                                  const RLHFDatasetOptions& options);

  /// A dataset of rows read elsewhere (data.custom_cls: python_dataset.hpp), each prompt already
  /// tokenised and cut to options.max_prompt_length.
  static Result<RLHFDataset> from_rows(std::vector<RLHFRow> rows, const tokenizer::Tokenizer& tokenizer,
                                       const RLHFDatasetOptions& options);

  /// Rows kept (after filter_overlong_prompts).
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  /// Rows dropped by filter_overlong_prompts.
  int64_t num_filtered() const { return filtered_; }
  /// REQUIRES: 0 <= i < size().
  const RLHFRow& row(int64_t i) const { return rows_[static_cast<size_t>(i)]; }
  const RLHFDatasetOptions& options() const { return options_; }

  /// verl's __getitem__ over `indices` followed by collate_fn (see the header comment).
  /// Errors: an index outside [0, size()), an empty list.
  Result<proto::DataProto> collate(const std::vector<int64_t>& indices) const;

 private:
  RLHFDataset() = default;
  std::vector<RLHFRow> rows_;
  RLHFDatasetOptions options_;
  int32_t pad_id_ = 0;
  int64_t filtered_ = 0;
  bool has_agent_names_ = false;  ///< Some row names its agent loop: batches carry agent_name.
  /// The rows' other fields (RLHFRow::columns), each with whether every row holds a string there
  /// (a string column; else JSON, null where a row lacks it).
  std::vector<std::pair<std::string, bool>> columns_;
  void find_columns();
};

/// Options of SFTDataset (verl's SFT data.* keys).
struct SFTDatasetOptions {
  std::string prompt_key = "question";
  std::string response_key = "answer";
  int64_t max_length = 1024;
  Truncation truncation = Truncation::error;  ///< middle is refused (verl: NotImplementedError).
  std::string chat_template = "auto";
  /// verl's prompt_dict_keys / response_dict_keys: the value at prompt_key (response_key) is a
  /// mapping, read through these keys in turn (gsm8k: prompt_key=extra_info, ['question']).
  std::vector<std::string> prompt_dict_keys, response_dict_keys;
  /// data.multiturn.*: conversations instead of prompt/response pairs (see the header comment).
  bool multiturn = false;
  std::string messages_key = "messages", tools_key = "tools", enable_thinking_key = "enable_thinking";

  /// data.{prompt_key,response_key,prompt_dict_keys,response_dict_keys,max_length,truncation,
  /// chat_template,multiturn.*} from a loaded SFT config.
  static Result<SFTDatasetOptions> from_config(const nlohmann::json& cfg);
};

/// One tokenised SFT example (not padded).
struct SFTExample {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> response_ids;  ///< Ends with EOS.
  /// Multi-turn: the whole conversation's tokens (prompt_ids / response_ids stay empty) and, per
  /// token, 1 where it is an assistant token the model is trained to produce.
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  /// An item of the user's class (data.custom_cls): its columns at max_length, used as they are.
  std::vector<int32_t> item_ids, item_positions;
  std::vector<uint8_t> item_mask, item_loss;
  std::string source;                 ///< "FILE:LINE"
};

/// verl's SFTDataset over parquet / JSONL files.
class SFTDataset {
 public:
  /// Loads and tokenises every row. A row longer than max_length with truncation=error fails
  /// here, naming FILE:LINE.
  static Result<SFTDataset> load(const std::vector<std::filesystem::path>& files, const tokenizer::Tokenizer& tokenizer,
                                 const SFTDatasetOptions& options);

  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  /// REQUIRES: 0 <= i < size().
  const SFTExample& example(int64_t i) const { return examples_[static_cast<size_t>(i)]; }

  /// Examples read elsewhere (data.custom_cls: python_dataset.hpp), each an item at max_length.
  static Result<SFTDataset> from_items(std::vector<SFTExample> items, const tokenizer::Tokenizer& tokenizer,
                                       const SFTDatasetOptions& options);

  /// Tensors input_ids, attention_mask, position_ids, loss_mask, each [B, max_length] int64.
  Result<proto::DataProto> collate(const std::vector<int64_t>& indices) const;

 private:
  SFTDataset() = default;
  std::vector<SFTExample> examples_;
  SFTDatasetOptions options_;
  int32_t pad_id_ = 0;
};

/// Loads `Dataset` (RLHFDataset, SFTDataset) from data.train_files into `train` and, when
/// data.val_files is set (optional_data_files), into `val`. Errors as data_files and Dataset::load.
template <class Dataset, class Options>
Status load_train_and_val(const nlohmann::json& cfg, const tokenizer::Tokenizer& tokenizer, const Options& options,
                          std::optional<Dataset>& train, std::optional<Dataset>& val) {
  TESSERA_ASSIGN_OR_RETURN(auto train_files, data_files(cfg, "data.train_files"));
  TESSERA_ASSIGN_OR_RETURN(Dataset train_set, Dataset::load(train_files, tokenizer, options));
  train.emplace(std::move(train_set));
  TESSERA_ASSIGN_OR_RETURN(auto val_files, optional_data_files(cfg, "data.val_files"));
  if (val_files.empty()) return Status();
  TESSERA_ASSIGN_OR_RETURN(Dataset val_set, Dataset::load(val_files, tokenizer, options));
  val.emplace(std::move(val_set));
  return Status();
}

/// Options of StatefulDataLoader.
struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = true;     ///< RandomSampler seeded with `seed`; else sequential.
  bool drop_last = true;   ///< verl's train loader drops the last partial batch.
  uint64_t seed = 1;       ///< verl: data.seed (default 1).
};

/// A dataloader over row indices with verl's sampler semantics: with shuffle, epoch e visits
/// torch.randperm(size) draw 2e of one CPU generator seeded with `seed` (torch's RandomSampler
/// with a seeded generator draws two per epoch: Note [Sampler order] in dataloader.cpp);
/// batches are consecutive slices of that order.
/// Its position is a JSON state that restores the exact remaining sequence.
class StatefulDataLoader {
 public:
  /// Errors: batch_size < 1, dataset_size < 0, or no full batch while drop_last.
  static Result<StatefulDataLoader> create(int64_t dataset_size, const DataLoaderOptions& options);

  /// Batches per epoch (verl's len(dataloader)).
  int64_t size() const;
  /// The next batch's row indices, or nullopt when the current epoch is exhausted; the call
  /// that returns nullopt moves the loader to the start of the next epoch.
  std::optional<std::vector<int64_t>> next();
  /// The epoch the next batch comes from (0-based) and its index within that epoch.
  int64_t epoch() const { return epoch_; }
  int64_t batch_index() const { return batch_index_; }

  /// {"epoch", "batch_index", "seed", "shuffle", "drop_last", "batch_size", "dataset_size"}.
  nlohmann::json state_dict() const;
  /// Restores a state_dict(). Errors (naming the field) when the state is malformed or was
  /// taken over a different dataset size / batch size / seed / shuffle / drop_last.
  Status load_state_dict(const nlohmann::json& state);

 private:
  StatefulDataLoader() = default;
  void compute_order();

  DataLoaderOptions options_;
  int64_t dataset_size_ = 0;
  int64_t epoch_ = 0;
  int64_t batch_index_ = 0;
  std::vector<int64_t> order_;  // row order of epoch_
};

}  // namespace tessera::driver
