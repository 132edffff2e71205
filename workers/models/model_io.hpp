// model_io.hpp: HF model directories (config.json + *.safetensors) to and from Tessera models.
//
// Loading reads config.json, finds the loader for config.architectures[0] in the
// WeightLoaderRegistry, reads the safetensors checkpoint zero-copy and hands it to the loader.
// Saving writes the parameters under their HF names (no lm_head.weight when tied, as HF does),
// then config.json; each file is written atomically.
// Thread-safety: free functions; a model must not be used by another thread while it is saved.
#pragma once

#include <memory>
#include <string>

#include "proto/status.hpp"
#include "workers/models/model.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/models/weight_loader.hpp"

namespace tessera::models {

/// Loads a *ForCausalLM directory. A value-model checkpoint is refused.
Result<std::shared_ptr<CausalLM>> load_causal_lm(const std::string& dir, const LoadOptions& options = {});

/// Loads a value model from a *ForTokenClassification directory, or from a *ForCausalLM one
/// (lm_head ignored, score seeded from options.score_seed; a log line says so).
Result<std::shared_ptr<ValueModel>> load_value_model(const std::string& dir, const LoadOptions& options = {});

/// Writes `model` into `dir` (created if missing): safetensors (sharded past max_shard_bytes) and config.json.
Status save_pretrained(const PretrainedModel& model, const std::string& dir,
                       const CheckpointWriteOptions& options = {});

}  // namespace tessera::models
