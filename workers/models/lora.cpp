// lora.cpp: Note [LoRA adapters] in lora.hpp.
#include "workers/models/lora.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <regex>
#include <set>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/models/model.hpp"

namespace tessera::models {
namespace {

using json = nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<ModuleSelector> selector_from_json(const json& value, const std::string& key, bool allow_all_linear) {
  ModuleSelector out;
  if (value.is_null()) return out;
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (allow_all_linear && lower == "all-linear") {  // PEFT compares it lower-cased
      out.all_linear = true;
      return out;
    }
    try {
      std::regex check(text);
    } catch (const std::regex_error& e) {
      return make_error(ErrorCode::invalid_argument, "{} = '{}': not a valid regular expression ({})", key, text,
                        e.what());
    }
    out.regex = text;
    return out;
  }
  if (value.is_array()) {
    for (const auto& item : value) {
      if (!item.is_string() || item.get<std::string>().empty()) {
        return make_error(ErrorCode::invalid_argument, "{}: every entry must be a module name, got {}", key,
                          item.dump());
      }
      out.names.push_back(item.get<std::string>());
    }
    return out;
  }
  return make_error(ErrorCode::invalid_argument, "{} = {}: expected a module name pattern or a list of names", key,
                    value.dump());
}

// A ModuleSelector with its regular expression compiled once.
class Selector {
 public:
  explicit Selector(const ModuleSelector& s) : s_(s) {
    if (s.regex) regex_.emplace(*s.regex);
  }
  bool operator()(const std::string& name) const {
    if (regex_) return std::regex_match(name, *regex_);
    for (const auto& n : s_.names) {
      if (name == n || ends_with(name, "." + n)) return true;
    }
    return false;
  }

 private:
  const ModuleSelector& s_;
  std::optional<std::regex> regex_;
};

// Every Linear of the model by module name, in module order.
std::vector<std::pair<std::string, std::shared_ptr<Linear>>> linear_modules(const PretrainedModel& model) {
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (ends_with(item.key(), ".lora_A") || ends_with(item.key(), ".lora_B")) continue;
    if (auto linear = std::dynamic_pointer_cast<Linear>(item.value())) out.emplace_back(item.key(), linear);
  }
  return out;
}

bool in_decoder_layer(const std::string& name) { return name.rfind("model.layers.", 0) == 0; }

// Where adapters may go: the decoder layers, and a value model's head. PEFT's all-linear leaves out
// a model's output embeddings (lm_head), but a TokenClassification model has none, and verl wraps
// the critic as a CAUSAL_LM task: its `score` head is adapted too.
bool adaptable(const PretrainedModel& model, const std::string& name) {
  return in_decoder_layer(name) || (model.head_kind() == HeadKind::value && name == "score");
}

}  // namespace

Result<LoraConfig> lora_config_from_json(const json& block, const std::string& path) {
  LoraConfig c;
  if (!block.is_object()) return c;
  const std::string rank_key = path + ".lora_rank";
  if (auto it = block.find("lora_rank"); it != block.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return make_error(ErrorCode::invalid_argument, "{} = {}: expected an integer", rank_key, it->dump());
    }
    c.rank = it->get<int64_t>();
  }
  if (c.rank < 0) return make_error(ErrorCode::invalid_argument, "{} = {}: must be >= 0", rank_key, c.rank);
  if (auto it = block.find("lora_alpha"); it != block.end() && !it->is_null()) {
    if (!it->is_number()) {
      return make_error(ErrorCode::invalid_argument, "{}.lora_alpha = {}: expected a number", path, it->dump());
    }
    c.alpha = it->get<double>();
  }
  if (!(c.alpha > 0) || !std::isfinite(c.alpha)) {
    return make_error(ErrorCode::invalid_argument, "{}.lora_alpha = {}: must be a positive number", path, c.alpha);
  }
  const json targets = block.contains("target_modules") ? block.at("target_modules") : json("all-linear");
  TESSERA_ASSIGN_OR_RETURN(c.target, selector_from_json(targets, path + ".target_modules", /*allow_all_linear=*/true));
  if (c.enabled() && c.target.empty()) {
    return make_error(ErrorCode::invalid_argument, "{}.target_modules is empty or null: name the modules to adapt "
                      "(verl's default is all-linear)", path);
  }
  const json excluded = block.contains("exclude_modules") ? block.at("exclude_modules") : json();
  TESSERA_ASSIGN_OR_RETURN(c.exclude, selector_from_json(excluded, path + ".exclude_modules", false));
  return c;
}

Result<std::vector<std::string>> lora_target_modules(const PretrainedModel& model, const LoraConfig& config,
                                                     const std::string& path) {
  const Selector target(config.target), exclude(config.exclude);
  std::set<std::string> linear_names;
  std::vector<std::string> out;
  for (const auto& [name, linear] : linear_modules(model)) {
    linear_names.insert(name);
    const bool wanted = config.target.all_linear ? adaptable(model, name) : target(name);
    if (!wanted || exclude(name)) continue;
    if (!adaptable(model, name)) {
      return make_error(ErrorCode::unimplemented,
                        "{}.target_modules matches '{}': adapters outside the decoder layers (and a value model's "
                        "score head) are not supported (leave it out of the targets)",
                        path, name);
    }
    out.push_back(name);
  }
  // A selected module that is not a Linear, a container included (PEFT: "Target module ... is not
  // supported").
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (linear_names.count(name) || config.target.all_linear || name.find(".lora_") != std::string::npos) continue;
    if (target(name) && !exclude(name)) {
      return make_error(ErrorCode::invalid_argument,
                        "{}.target_modules matches '{}', which is not a linear layer (LoRA adapts linear layers)",
                        path, name);
    }
  }
  if (out.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "{}.target_modules matches no linear layer of the model (layers are named like "
                      "'model.layers.0.self_attn.q_proj' and 'model.layers.0.mlp.down_proj')",
                      path);
  }
  return out;
}

Status apply_lora(PretrainedModel& model, const LoraConfig& config, const std::string& path) {
  if (!config.enabled()) return Status();
  if (has_lora(model)) return make_error(ErrorCode::invalid_argument, "apply_lora: the model already has adapters");
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> targets, lora_target_modules(model, config, path));
  const std::set<std::string> wanted(targets.begin(), targets.end());
  if (model.config().moe.num_experts > 0) {
    spdlog::info("{}: the routed experts and the router of {} are stacked parameters, not linear layers: LoRA leaves "
                 "them frozen (as PEFT does on transformers 5) and adapts {} linear layers",
                 path, model.config().architecture, wanted.size());
  }
  try {
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters(/*recurse=*/true)) p.set_requires_grad(false);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
    for (const auto& [name, linear] : linear_modules(model)) {
      if (!wanted.count(name)) continue;
      const int64_t out_features = linear->weight.size(0), in_features = linear->weight.size(1);
      const at::TensorOptions options = linear->weight.options().dtype(config.dtype.value_or(linear->weight.scalar_type()));
      auto a = std::make_shared<Linear>(in_features, config.rank, /*with_bias=*/false, options);
      auto b = std::make_shared<Linear>(config.rank, out_features, /*with_bias=*/false, options);
      // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)) times sqrt(3 / fan_in) = 1 / sqrt(fan_in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
      a->weight.copy_(at::empty(a->weight.sizes(), at::kFloat).uniform_(-bound, bound, gen));
      b->weight.zero_();
      linear->lora_A = linear->register_module("lora_A", a);
      linear->lora_B = linear->register_module("lora_B", b);
      linear->lora_scaling = config.scaling();
      linear->adapter_enabled = true;
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{}: adding LoRA adapters: {}", path, e.what());
  }
  return Status();
}

bool has_lora(const PretrainedModel& model) {
  for (const auto& [name, linear] : linear_modules(model)) {
    if (linear->lora_A) return true;
  }
  return false;
}

void set_lora_enabled(PretrainedModel& model, bool enabled) {
  for (const auto& [name, linear] : linear_modules(model)) linear->adapter_enabled = enabled;
}

bool is_lora_parameter(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

std::optional<std::string> lora_adapted_weight(const std::string& name) {
  const std::string suffix = ".lora_A.weight";
  if (!ends_with(name, suffix) || name.size() == suffix.size()) return std::nullopt;
  return name.substr(0, name.size() - suffix.size()) + ".weight";
}

Result<TensorMap> merge_lora_weights(const TensorMap& params, double scaling, bool in_place, const FactorSlicer& slice) {
  TensorMap out;
  for (const auto& [name, t] : params) {
    if (!is_lora_parameter(name)) out.emplace(name, t);
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, a] : params) {
    const std::optional<std::string> weight = lora_adapted_weight(name);
    if (!weight) continue;
    const std::string module = weight->substr(0, weight->size() - std::string(".weight").size());
    auto b = params.find(module + ".lora_B.weight");
    auto w = out.find(*weight);
    if (b == params.end() || w == out.end()) {
      return make_error(ErrorCode::invalid_argument, "merge LoRA weights: adapter '{}' has no {}", module,
                        b == params.end() ? "lora_B" : "base weight");
    }
    const at::Tensor& base = w->second;
    auto bad_shapes = [&] {
      return make_error(ErrorCode::invalid_argument, "merge LoRA weights: '{}' has A [{}], B [{}], W [{}]", module,
                        fmt::join(a.sizes(), ","), fmt::join(b->second.sizes(), ","), fmt::join(base.sizes(), ","));
    };
    if (a.dim() != 2 || b->second.dim() != 2 || base.dim() != 2 || b->second.size(1) != a.size(0)) return bad_shapes();
    try {
      auto [fa, fb] = slice ? slice(w->first, a, b->second) : std::pair<at::Tensor, at::Tensor>(a, b->second);
      at::Tensor delta = at::matmul(fb.to(at::kFloat), fa.to(at::kFloat)).mul_(scaling);
      if (delta.sizes() != base.sizes()) return bad_shapes();
      at::Tensor merged = base.to(at::kFloat) + delta;  // out of place: an fp32 base is not touched here
      if (in_place) {
        base.copy_(merged);
      } else {
        w->second = merged.to(base.scalar_type());
      }
    } catch (const std::exception& e) {
      return make_error(ErrorCode::internal, "merge LoRA weights of '{}': {}", module, e.what());
    }
  }
  for (const auto& [name, b] : params) {
    if (!ends_with(name, ".lora_B.weight")) continue;
    const std::string module = name.substr(0, name.size() - std::string(".lora_B.weight").size());
    if (!params.count(module + ".lora_A.weight")) {
      return make_error(ErrorCode::invalid_argument, "merge LoRA weights: adapter '{}' has no lora_A", module);
    }
  }
  return out;
}

json peft_adapter_config(const LoraConfig& config, const std::vector<std::string>& targets,
                         const std::string& base_model_path) {
  json exclude = nullptr;
  if (config.exclude.regex) exclude = *config.exclude.regex;
  if (!config.exclude.names.empty()) exclude = config.exclude.names;
  return json{{"base_model_name_or_path", base_model_path},
              {"bias", "none"},
              {"exclude_modules", exclude},
              {"fan_in_fan_out", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"lora_alpha", config.alpha},
              {"lora_dropout", 0.0},
              {"modules_to_save", nullptr},
              {"peft_type", "LORA"},
              {"r", config.rank},
              {"target_modules", targets},  // whole names: PEFT adapts exactly these on reload
              {"task_type", "CAUSAL_LM"},
              {"use_dora", false},
              {"use_rslora", false}};
}

}  // namespace tessera::models
