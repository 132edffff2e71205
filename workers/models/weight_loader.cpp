// weight_loader.cpp: the architecture table and the HF decoder loader (Llama, Qwen2, Qwen3,
// Qwen2-MoE, Qwen3-MoE, Mistral, Gemma2, Gemma3).
#include "workers/models/weight_loader.hpp"

#include <regex>
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

// Where one checkpoint tensor of MoE experts goes: Tessera's stacked parameter `param`, the
// expert `expert` (-1: every expert) and which rows (dim 1) of the tensor it takes.
struct ExpertTarget {
  std::string param;
  int64_t expert = -1;
  int64_t row_part = -1;  ///< gate_up_proj: 0 the gate half, 1 the up half; -1: all rows.
};

// "<p>.mlp.experts.<e>.<proj>.weight" (released checkpoints) or "<p>.mlp.experts.gate_up_proj"
// (transformers 5's fused form: gate rows then up rows) -> where it goes; empty otherwise.
std::vector<ExpertTarget> expert_targets(const std::string& name) {
  static const std::regex per_expert(R"((.*\.mlp\.experts)\.(\d{1,9})\.(gate_proj|up_proj|down_proj)\.weight)");
  static const std::regex fused(R"((.*\.mlp\.experts)\.gate_up_proj)");
  std::smatch m;
  if (std::regex_match(name, m, per_expert)) return {{m[1].str() + "." + m[3].str(), std::stoll(m[2].str()), -1}};
  if (std::regex_match(name, m, fused)) return {{m[1].str() + ".gate_proj", -1, 0}, {m[1].str() + ".up_proj", -1, 1}};
  return {};
}

// Stacks expert tensors into whole parameters, then sets them; remembers which experts came.
class ExpertStacker {
 public:
  ExpertStacker(PretrainedModel& model, const TensorMap& params, const LoadOptions& options)
      : model_(model), params_(params), options_(options) {}

  // Copies `tensor` (checkpoint `name`) into its place; false when `name` is no expert tensor.
  Result<bool> take(const std::string& name, const at::Tensor& tensor) {
    const std::vector<ExpertTarget> targets = expert_targets(name);
    if (targets.empty()) return false;
    for (const ExpertTarget& t : targets) {
      auto p = params_.find(t.param);
      if (p == params_.end()) return false;
      Stack& stack = stacks_[t.param];
      if (!stack.value.defined()) {
        const auto device = options_.device ? *options_.device : c10::Device(c10::kCPU);
        stack.value = at::empty(p->second.sizes(), p->second.options().device(device));
        stack.seen.assign(static_cast<size_t>(p->second.size(0)), false);
      }
      at::Tensor dest = stack.value;
      at::Tensor src = tensor;
      if (t.expert >= 0) {
        if (t.expert >= dest.size(0)) {
          return make_error(ErrorCode::invalid_argument, "tensor '{}': expert {} but the model has {} (num_experts)",
                            name, t.expert, dest.size(0));
        }
        dest = dest.select(0, t.expert);
      }
      if (t.row_part >= 0) {
        if (src.dim() != 3 || src.size(1) != 2 * dest.size(1)) {
          return make_error(ErrorCode::invalid_argument, "tensor '{}' has shape [{}], expected [{}, {}, {}]", name,
                            fmt::join(src.sizes(), ", "), dest.size(0), 2 * dest.size(1), dest.size(2));
        }
        src = src.narrow(1, t.row_part * dest.size(1), dest.size(1));
      }
      if (src.sizes() != dest.sizes()) {
        return make_error(ErrorCode::invalid_argument, "tensor '{}' has shape [{}], expected [{}]", name,
                          fmt::join(src.sizes(), ", "), fmt::join(dest.sizes(), ", "));
      }
      dest.copy_(src, /*non_blocking=*/true);
      if (t.expert >= 0) {
        stack.seen[static_cast<size_t>(t.expert)] = true;
      } else {
        stack.seen.assign(stack.seen.size(), true);
      }
    }
    return true;
  }

  // Sets every stacked parameter; the first expert no tensor filled is an error.
  Status finish(const std::string& source) {
    for (auto& [param, stack] : stacks_) {
      for (size_t e = 0; e < stack.seen.size(); ++e) {
        if (stack.seen[e]) continue;
        const std::string layer = param.substr(0, param.rfind('.'));
        return make_error(ErrorCode::not_found, "{}: tensor '{}.{}.{}.weight' missing for {}", source, layer, e,
                          param.substr(param.rfind('.') + 1), model_.config().architecture);
      }
      Status st = model_.set_parameter(param, stack.value);
      if (!st.ok()) return st.with_context(source);
    }
    return Status();
  }

  bool stacked(const std::string& param) const { return stacks_.count(param) != 0; }

 private:
  struct Stack {
    at::Tensor value;
    std::vector<bool> seen;
  };
  PretrainedModel& model_;
  const TensorMap& params_;
  const LoadOptions& options_;
  std::map<std::string, Stack> stacks_;
};

void register_builtins(WeightLoaderRegistry& r) {
  const std::pair<const char*, HeadKind> rows[] = {
      {"LlamaForCausalLM", HeadKind::causal_lm},
      {"Qwen2ForCausalLM", HeadKind::causal_lm},
      {"Qwen3ForCausalLM", HeadKind::causal_lm},
      {"MistralForCausalLM", HeadKind::causal_lm},
      {"Gemma2ForCausalLM", HeadKind::causal_lm},
      {"Gemma3ForCausalLM", HeadKind::causal_lm},
      {"Qwen2MoeForCausalLM", HeadKind::causal_lm},
      {"Qwen3MoeForCausalLM", HeadKind::causal_lm},
      {"Qwen2MoeForTokenClassification", HeadKind::value},
      {"Qwen3MoeForTokenClassification", HeadKind::value},
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
  ExpertStacker experts(model, params, options);
  for (const auto& [name, tensor] : checkpoint) {
    if (params.count(name) == 0) {
      if (is_ignorable(name, model)) continue;
      auto taken = experts.take(name, tensor);
      if (!taken.ok()) return taken.status().with_context(source);
      if (*taken) continue;
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
  TESSERA_RETURN_IF_ERROR(experts.finish(source));
  std::vector<std::string> missing;
  for (const auto& [name, p] : params) {
    if (checkpoint.count(name) == 0 && !experts.stacked(name)) missing.push_back(name);
  }
  if (missing.empty()) return Status();
  if (model.head_kind() == HeadKind::value) return seed_value_head(model, source, missing, options);
  // A layer whose experts are all absent: named as a checkpoint holds them (the first expert's).
  const TensorMap first = to_hf_checkpoint_tensors({{missing.front(), params.at(missing.front())}});
  return make_error(ErrorCode::not_found, "{}: tensor '{}' missing for {}", source, first.begin()->first,
                    model.config().architecture);
}

TensorMap to_hf_checkpoint_tensors(const TensorMap& params) {
  static const std::regex stacked(R"((.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj))");
  TensorMap out;
  std::smatch m;
  for (const auto& [name, tensor] : params) {
    if (!std::regex_match(name, m, stacked)) {
      out.emplace(name, tensor);
      continue;
    }
    for (int64_t e = 0; e < tensor.size(0); ++e) {
      out.emplace(fmt::format("{}.{}.{}.weight", m[1].str(), e, m[2].str()), tensor.select(0, e));
    }
  }
  return out;
}

}  // namespace tessera::models
