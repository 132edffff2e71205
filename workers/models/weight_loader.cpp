// weight_loader.cpp: the architecture table and the HF Llama/Qwen2/Qwen3/Mistral/Gemma2 loader.
#include "workers/models/weight_loader.hpp"

#include <set>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/models/model.hpp"

namespace tessera::models {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checkpoint tensors that the target model legitimately does not have.
bool is_ignorable(const std::string& name, const PretrainedModel& model) {
  if (ends_with(name, "rotary_emb.inv_freq")) return true;  // old HF checkpoints saved this buffer
  if (model.head_kind() == HeadKind::value) return starts_with(name, "lm_head.");
  if (name == "lm_head.weight") return model.config().tie_word_embeddings;  // HF re-ties it
  return false;
}

Status seed_value_head(PretrainedModel& model, const std::string& source, const std::vector<std::string>& missing,
                       const LoadOptions& options) {
  for (const std::string& name : missing) {
    if (!starts_with(name, "score.")) {
      return make_error(ErrorCode::not_found, "{}: tensor '{}' missing for {}", source, name,
                        model.config().architecture);
    }
  }
  spdlog::info("{}: weights [{}] of {} were not in the checkpoint and are newly initialised (seed {}); "
               "lm_head is ignored",
               source, fmt::join(missing, ", "), model.config().architecture, options.score_seed);
  return initialize_weights(model, options.score_seed, missing);
}

void register_builtins(WeightLoaderRegistry& r) {
  const std::pair<const char*, HeadKind> rows[] = {
      {"LlamaForCausalLM", HeadKind::causal_lm},
      {"Qwen2ForCausalLM", HeadKind::causal_lm},
      {"Qwen3ForCausalLM", HeadKind::causal_lm},
      {"MistralForCausalLM", HeadKind::causal_lm},
      {"Gemma2ForCausalLM", HeadKind::causal_lm},
      {"LlamaForTokenClassification", HeadKind::value},
      {"Qwen2ForTokenClassification", HeadKind::value},
      {"Qwen3ForTokenClassification", HeadKind::value},
      {"MistralForTokenClassification", HeadKind::value},
      {"Gemma2ForTokenClassification", HeadKind::value},
  };
  for (const auto& [name, head] : rows) (void)r.add(name, {head, load_hf_decoder_weights});
}

}  // namespace

WeightLoaderRegistry& WeightLoaderRegistry::global() {
  static WeightLoaderRegistry* registry = [] {
    auto* r = new WeightLoaderRegistry();
    register_builtins(*r);
    return r;
  }();
  return *registry;
}

Status WeightLoaderRegistry::add(const std::string& architecture, ArchitectureEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!entry.load) return make_error(ErrorCode::invalid_argument, "architecture '{}': empty loader", architecture);
  if (!table_.emplace(architecture, std::move(entry)).second) {
    return make_error(ErrorCode::already_exists, "architecture '{}' is already registered", architecture);
  }
  return Status();
}

Result<ArchitectureEntry> WeightLoaderRegistry::find(const std::string& architecture) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(architecture);
  if (it != table_.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& row : table_) known.push_back(row.first);
  return make_error(ErrorCode::not_found, "architecture '{}' is not supported (known: {})", architecture,
                    fmt::join(known, ", "));
}

std::vector<std::string> WeightLoaderRegistry::architectures() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& row : table_) names.push_back(row.first);
  return names;
}

Status load_hf_decoder_weights(const TensorMap& checkpoint, const std::string& source, PretrainedModel& model,
                               const LoadOptions& options) {
  const TensorMap params = model.parameter_map();
  const c10::ScalarType dtype = model.backbone().embed_tokens->weight.scalar_type();
  const bool to_device = options.device && !options.device->is_cpu();
  for (const auto& [name, tensor] : checkpoint) {
    if (params.count(name) == 0) {
      if (is_ignorable(name, model)) continue;
      return make_error(ErrorCode::invalid_argument, "{}: tensor '{}' is not a parameter of {}", source, name,
                        model.config().architecture);
    }
    // For a GPU each tensor goes up in the checkpoint's dtype and is converted there (copy_
    // converts on the device when non_blocking; from pageable memory the upload is staged before
    // the call returns): a bf16 checkpoint of an fp32 model moves half the bytes, and the host
    // never holds the converted model (30 GB at 7B).
    at::Tensor value = to_device ? tensor.to(*options.device, dtype, /*non_blocking=*/true)
                                 : (tensor.scalar_type() == dtype ? tensor : tensor.to(dtype));
    Status st = model.set_parameter(name, value);
    if (!st.ok()) return st.with_context(source);
  }
  std::vector<std::string> missing;
  for (const auto& [name, p] : params) {
    if (checkpoint.count(name) == 0) missing.push_back(name);
  }
  if (missing.empty()) return Status();
  if (model.head_kind() == HeadKind::value) return seed_value_head(model, source, missing, options);
  return make_error(ErrorCode::not_found, "{}: tensor '{}' missing for {}", source, missing.front(),
                    model.config().architecture);
}

}  // namespace tessera::models
