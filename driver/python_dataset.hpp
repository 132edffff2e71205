// python_dataset.hpp: verl's data.custom_cls: the user's dataset class (a torch Dataset, usually
// an RLHFDataset subclass), built and read by Python in a child process (runtime/python_child.hpp)
// when the data loads.
//
// The child does what verl's create_rl_dataset does: load_extern_type(path, name) (a file, or
// pkg://module), the class must subclass torch.utils.data.Dataset, then
// cls(data_files=..., tokenizer=hf_tokenizer(...), processor=None, config=<the data section>) with
// return_raw_chat on (Tessera's batches always carry raw_prompt). Every item is read once, in
// order, and becomes a row of Tessera's RLHFDataset: the prompt is input_ids under
// attention_mask (the class pads and truncates; raw_prompt_ids, when given, must be the same
// tokens), and raw_prompt, data_source, ability, reward_model, extra_info, agent_name, index,
// tools_kwargs and interaction_kwargs are taken as they are (the last three, when absent, from
// extra_info, as verl's RLHFDataset sets them); the item's other keys become columns of the batch
// (RLHFRow::columns), as verl's batch carries them. An item with multi_modal_data, with a value
// that is not an integer where ids are, or without the fields the trainer reads, stops the load
// at that item, naming it. A class with
// on_batch_end (verl calls it after every step) is refused: the items are read once.
//
// For SFT (verl's create_sft_dataset): cls(parquet_files=..., tokenizer=..., config=<the data
// section>), and each item's input_ids, attention_mask, position_ids and loss_mask (data.max_length
// values each) are the example as they are: loss_mask marks the positions whose next token is
// trained, as verl's SFT trainer reads it (a class built on verl's MultiTurnSFTDataset, which marks
// the tokens themselves, is trained one position late there and here alike).
//
// Thread-safety: re-entrant (each call runs its own child).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/data.hpp"
#include "proto/status.hpp"

namespace tessera::driver {

struct PythonDatasetOptions {
  std::string path;  ///< data.custom_cls.path: a .py file (or file://...), or pkg://module.
  std::string name;  ///< data.custom_cls.name: the class.
  nlohmann::json data_config = nlohmann::json::object();  ///< The config's data section (the class's config).
  std::string tokenizer_path;  ///< data.tokenizer, else actor_rollout_ref.model.path.
  bool trust_remote_code = false;  ///< data.trust_remote_code (verl's hf_tokenizer argument).
  std::string python;  ///< Empty: $TESSERA_DATA_PYTHON, else python3.
  bool sft = false;    ///< verl's SFT dataset signature and items (see the header comment).

  /// data.custom_cls.{path,name}, the data section and the tokenizer from a loaded PPO config.
  static Result<PythonDatasetOptions> from_config(const nlohmann::json& cfg);
  /// The same from an SFT config (the tokenizer of model.partial_pretrain).
  static Result<PythonDatasetOptions> from_sft_config(const nlohmann::json& cfg);
};

/// Python for the children that build verl datasets (this one, python_sampler.hpp), after
/// runtime::kJsonAnswers: one_line(e) (an exception and its cause on one line), fatal(e) (its
/// traceback to stderr, {"fatal": one_line(e)} to the parent, exit), and verl_dataset(spec, cls):
/// verl's create_rl_dataset with `cls` (create_sft_dataset when spec["sft"]): verl's hf_tokenizer
/// of spec["tokenizer"] (spec["trust_remote_code"]), the data section spec["config"] as an
/// OmegaConf config, the files spec["files"] as configured.
extern const char* const kVerlDatasets;

/// The files `files_key` names, as verl hands them to a dataset class: a path as it is (a string),
/// a list as a list.
Result<nlohmann::json> configured_data_files(const nlohmann::json& cfg, const std::string& files_key);

/// Builds the class over the files that `files_key` (data.train_files or data.val_files) of `cfg`
/// names, passed as configured (a path, or a list of them), and reads every item (see the header
/// comment). Errors name data.custom_cls, the class, the files key and the item.
Result<std::vector<RLHFRow>> read_python_dataset(const nlohmann::json& cfg, const std::string& files_key,
                                                 const PythonDatasetOptions& options, int64_t max_prompt_length);

/// The same for an SFT class: one example per item, each column `max_length` long.
Result<std::vector<SFTExample>> read_python_sft_dataset(const nlohmann::json& cfg, const std::string& files_key,
                                                        const PythonDatasetOptions& options, int64_t max_length);

/// A custom class's train set (data.train_files) and, when data.val_files names files, its
/// validation set: `read(files_key)` builds each.
template <class Dataset, class Read>
Status load_custom_train_and_val(const nlohmann::json& cfg, Read read, std::optional<Dataset>& train,
                                 std::optional<Dataset>& val) {
  TESSERA_ASSIGN_OR_RETURN(Dataset train_set, read(std::string("data.train_files")));
  train.emplace(std::move(train_set));
  TESSERA_ASSIGN_OR_RETURN(auto val_files, optional_data_files(cfg, "data.val_files"));
  if (val_files.empty()) return Status();
  TESSERA_ASSIGN_OR_RETURN(Dataset val_set, read(std::string("data.val_files")));
  val.emplace(std::move(val_set));
  return Status();
}

}  // namespace tessera::driver
