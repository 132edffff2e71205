// generations.hpp: what verl does with decoded generations besides scoring them.
//
//   trainer.rollout_data_dir      every training step writes DIR/<step>.jsonl
//   trainer.validation_data_dir   every validation writes DIR/<step>.jsonl
//   trainer.log_val_generations   N validation samples per validation, on the console
//
// A dump line is verl's _dump_generations entry: {"input", "output", "gts", "score", "step"} plus
// each reward extra info with one value per sample (`acc`, ...). Inputs and outputs are decoded
// without special tokens or padding, as verl's batch_decode(..., skip_special_tokens=True).
// The logged samples are verl's _maybe_log_val_generations choice: sorted by input, shuffled by
// NumPy's RandomState(42), the first N.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/logger.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {

/// Decoded samples of one batch.
struct Generations {
  std::vector<std::string> inputs, outputs;
  std::vector<nlohmann::json> gts;  ///< reward_model.ground_truth per sample (null when absent).
  std::vector<double> scores;
  std::map<std::string, std::vector<nlohmann::json>> extra;  ///< Reward extra infos, one per sample.
};

/// Decodes `batch`'s prompts and responses (tensors "prompts", "responses", "attention_mask")
/// and takes `scores` (one per sample) and the ground truths of the reward_model column.
Result<Generations> decode_generations(const proto::DataProto& batch, const tokenizer::Tokenizer& tokenizer,
                                       std::vector<double> scores);

/// Writes `dir`/<step>.jsonl (atomically; `dir` is created). Errors name the file.
Status dump_generations(const Generations& g, int64_t step, const std::filesystem::path& dir);

/// The order NumPy's legacy RandomState(seed).shuffle leaves [0, n) in (MT19937 and its masked
/// rejection sampling), so sample choices match verl's.
std::vector<size_t> numpy_shuffled_order(size_t n, uint32_t seed);

/// The first `n` samples verl would log (see the header comment), in its order.
std::vector<GenerationSample> val_generation_samples(const Generations& g, int64_t n);

/// Console lines for those samples.
std::vector<std::string> val_generation_lines(const Generations& g, int64_t n);

}  // namespace tessera::driver
