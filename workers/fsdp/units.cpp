// units.cpp: wrap policies -> UnitSpecs (see units.hpp).
#include "workers/fsdp/units.hpp"

#include <algorithm>
#include <set>

#include <torch/torch.h>

#include "workers/models/lora.hpp"

namespace tessera::fsdp {
namespace {

std::string last_component(const std::string& class_name) {
  auto pos = class_name.rfind("::");
  return pos == std::string::npos ? class_name : class_name.substr(pos + 2);
}

bool matches_layer_class(const std::string& class_name, const std::vector<std::string>& wanted) {
  std::string short_name = last_component(class_name);
  if (wanted.empty()) {
    const std::string suffix = "DecoderLayer";
    return short_name.size() >= suffix.size() &&
           short_name.compare(short_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  for (const auto& w : wanted) {
    if (w == short_name || w == class_name) return true;
    bool hf_decoder = w == "LlamaDecoderLayer" || w == "Qwen2DecoderLayer" || w == "Qwen3DecoderLayer" ||
                      w == "Qwen2MoeDecoderLayer" || w == "Qwen3MoeDecoderLayer" || w == "MistralDecoderLayer" ||
                      w == "Gemma2DecoderLayer" || w == "Gemma3DecoderLayer";
    if (hf_decoder && short_name == "DecoderLayer") return true;
  }
  return false;
}

std::vector<std::string> params_under(const torch::nn::Module& m, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters(/*recurse=*/true)) {
    names.push_back(prefix.empty() ? item.key() : prefix + "." + item.key());
  }
  return names;
}

// Size-based: post-order; returns the parameter names of `m` not claimed by a unit below it.
std::vector<std::string> wrap_by_size(const torch::nn::Module& m, const std::string& prefix,
                                      int64_t min_params, std::vector<UnitSpec>& units,
                                      bool is_root) {
  std::vector<std::string> unclaimed;
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    unclaimed.push_back(prefix.empty() ? item.key() : prefix + "." + item.key());
  }
  for (const auto& child : m.named_children()) {
    std::string child_prefix = prefix.empty() ? child.key() : prefix + "." + child.key();
    auto rest = wrap_by_size(*child.value(), child_prefix, min_params, units, false);
    unclaimed.insert(unclaimed.end(), rest.begin(), rest.end());
  }
  if (is_root) return unclaimed;
  int64_t count = 0;
  std::map<std::string, at::Tensor> all;
  for (const auto& item : m.named_parameters(true)) {
    all[prefix.empty() ? item.key() : prefix + "." + item.key()] = item.value();
  }
  for (const auto& name : unclaimed) count += all[name].numel();
  if (count >= min_params && !unclaimed.empty()) {
    units.push_back({prefix, unclaimed, false, ""});
    return {};
  }
  return unclaimed;
}

// Note [Attached units]: a unit holding LoRA adapters keeps its base weights, and its adapters
// move to a unit "<name>.lora" attached to it, placed right after it.
std::vector<UnitSpec> split_adapters(std::vector<UnitSpec> units) {
  std::vector<UnitSpec> out;
  for (auto& u : units) {
    UnitSpec adapters{u.name + ".lora", {}, false, u.name};
    std::vector<std::string> base;
    for (auto& name : u.param_names) (models::is_lora_parameter(name) ? adapters.param_names : base).push_back(name);
    if (adapters.param_names.empty() || base.empty()) {
      out.push_back(std::move(u));
      continue;
    }
    u.param_names = std::move(base);
    out.push_back(std::move(u));
    out.push_back(std::move(adapters));
  }
  return out;
}

}  // namespace

Result<std::vector<UnitSpec>> make_units(const torch::nn::Module& module, const WrapPolicy& policy,
                                         bool recompute_layers) {
  std::vector<UnitSpec> units;
  std::vector<std::string> all = params_under(module, "");
  if (all.empty()) return make_error(ErrorCode::invalid_argument, "FSDP units: module has no parameters");
  if (!policy.disable && policy.min_num_params > 0) {
    auto rest = wrap_by_size(module, "", policy.min_num_params, units, /*is_root=*/true);
    for (auto& u : units) u.recompute = recompute_layers;
    if (!rest.empty()) units.push_back({"root", rest, false, ""});
    return split_adapters(std::move(units));
  }
  std::set<std::string> claimed;
  if (!policy.disable) {
    for (const auto& item : module.named_modules("", /*include_self=*/false)) {
      const std::string& key = item.key();
      bool inside_unit = false;
      for (const auto& u : units) inside_unit |= key.rfind(u.name + ".", 0) == 0;
      if (inside_unit || !matches_layer_class(item.value()->name(), policy.transformer_layer_cls_to_wrap)) {
        continue;
      }
      UnitSpec spec{key, params_under(*item.value(), key), recompute_layers, ""};
      if (spec.param_names.empty()) continue;
      claimed.insert(spec.param_names.begin(), spec.param_names.end());
      units.push_back(std::move(spec));
    }
  }
  UnitSpec root{"root", {}, false, ""};
  for (const auto& name : all) {
    if (!claimed.count(name)) root.param_names.push_back(name);
  }
  if (!root.param_names.empty()) units.push_back(std::move(root));
  return split_adapters(std::move(units));
}

namespace {

std::string layer_unit_name(size_t i) { return "model.layers." + std::to_string(i); }

}  // namespace

Result<std::vector<UnitSpec>> make_decoder_units(const models::PretrainedModel& model, const WrapPolicy& policy) {
  TESSERA_ASSIGN_OR_RETURN(auto units, make_units(model, policy, /*recompute_layers=*/false));
  const auto& layers = model.backbone().layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<std::string> want = params_under(*layers[i], layer_unit_name(i));
    // A layer's adapters are in its attached unit (Note [Attached units]).
    want.erase(std::remove_if(want.begin(), want.end(), models::is_lora_parameter), want.end());
    for (auto& u : units) {
      if (u.name != layer_unit_name(i)) continue;
      std::set<std::string> have(u.param_names.begin(), u.param_names.end());
      u.recompute = have == std::set<std::string>(want.begin(), want.end());
    }
  }
  return units;
}

bool is_adapter_unit(const FlatLayout& layout) {
  return !layout.params.empty() && std::all_of(layout.params.begin(), layout.params.end(), [](const FlatParamEntry& e) {
    return models::is_lora_parameter(e.name);
  });
}

Status install_layer_runner(FsdpModule& engine, models::PretrainedModel& model) {
  if (&engine.module() != static_cast<torch::nn::Module*>(&model)) {
    return make_error(ErrorCode::invalid_argument, "install_layer_runner: the FSDP engine does not wrap this model");
  }
  std::vector<int> unit_of_layer;
  for (size_t i = 0; i < model.backbone().layers.size(); ++i) {
    auto u = engine.unit_index(layer_unit_name(i));
    unit_of_layer.push_back(u.ok() ? *u : -1);
  }
  FsdpModule* e = &engine;
  model.backbone().set_layer_runner([e, alive = engine.lifetime(), units = std::move(unit_of_layer)](
                                        int64_t i, models::LayerCall call, const at::Tensor& h) {
    if (alive.expired()) {
      throw std::runtime_error(fmt::format(
          "decoder layer {}: the FSDP engine that wrapped this model was destroyed", i));
    }
    const int unit = i >= 0 && i < static_cast<int64_t>(units.size()) ? units[i] : -1;
    if (unit < 0) return call(h);
    auto out = e->run_unit(unit, std::move(call), h);
    if (!out.ok()) throw std::runtime_error(out.status().with_context("decoder layer " + std::to_string(i)).to_string());
    return *out;
  });
  return Status();
}

}  // namespace tessera::fsdp
