// SFTDataset (driver/data.hpp), after verl/utils/dataset/sft_dataset.py.
#include "driver/config.hpp"
#include <torch/torch.h>

#include "driver/data.hpp"
#include "driver/internal/jsonl.hpp"

namespace tessera::driver {
namespace {

// row[key][dict_keys[0]][dict_keys[1]]... as a string.
Result<std::string> string_field(const internal::Record& row, const std::string& key,
                                 const std::vector<std::string>& dict_keys, const std::string& where) {
  auto it = row.find(key);
  if (it == row.end()) return make_error(ErrorCode::corrupt_data, "{}: missing '{}'", where, key);
  const internal::Record* v = &*it;
  std::string path = key;
  for (const auto& k : dict_keys) {
    if (!v->is_object() || !v->contains(k)) {
      return make_error(ErrorCode::corrupt_data, "{}: '{}' has no key '{}'", where, path, k);
    }
    v = &(*v)[k];
    path += "." + k;
  }
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number()) return v->dump();  // verl's dataframes stringify numbers too
  return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a string", where, path);
}

Status refuse_if_set(const nlohmann::json& cfg, const char* key) {
  const nlohmann::json* v = config_find(cfg, key);
  if (v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>())) return Status();
  return make_error(ErrorCode::unimplemented, "config key '{}' = {} is not supported by Tessera's SFT dataset", key,
                    v->dump());
}

}  // namespace

Result<SFTDatasetOptions> SFTDatasetOptions::from_config(const nlohmann::json& cfg) {
  SFTDatasetOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.prompt_key, config_get<std::string>(cfg, "data.prompt_key"));
  TESSERA_ASSIGN_OR_RETURN(o.response_key, config_get<std::string>(cfg, "data.response_key"));
  TESSERA_ASSIGN_OR_RETURN(o.max_length, config_get<int64_t>(cfg, "data.max_length"));
  TESSERA_ASSIGN_OR_RETURN(std::string trunc, config_get<std::string>(cfg, "data.truncation"));
  TESSERA_ASSIGN_OR_RETURN(o.truncation, parse_truncation(trunc));
  TESSERA_ASSIGN_OR_RETURN(auto tmpl, config_get_or<std::optional<std::string>>(cfg, "data.chat_template", std::nullopt));
  o.chat_template = tmpl.value_or("auto");
  for (auto [key, out] : {std::pair{"data.prompt_dict_keys", &o.prompt_dict_keys},
                          std::pair{"data.response_dict_keys", &o.response_dict_keys}}) {
    TESSERA_ASSIGN_OR_RETURN(auto keys, config_get_or<std::optional<std::vector<std::string>>>(cfg, key, std::nullopt));
    *out = keys.value_or(std::vector<std::string>{});
  }
  TESSERA_RETURN_IF_ERROR(refuse_if_set(cfg, "data.multiturn.enable"));
  if (o.truncation == Truncation::middle) {
    return make_error(ErrorCode::unimplemented, "data.truncation = 'middle' is not supported for SFT (verl neither)");
  }
  if (o.max_length < 2) return make_error(ErrorCode::invalid_argument, "data.max_length = {} must be >= 2", o.max_length);
  return o;
}

Result<SFTDataset> SFTDataset::load(const std::vector<std::filesystem::path>& files,
                                    const tokenizer::Tokenizer& tokenizer, const SFTDatasetOptions& options) {
  if (options.truncation == Truncation::middle) {
    return make_error(ErrorCode::unimplemented, "SFTDataset: truncation 'middle' is not supported");
  }
  SFTDataset ds;
  ds.options_ = options;
  TESSERA_ASSIGN_OR_RETURN(ds.pad_id_, dataset_pad_id(tokenizer));
  if (!tokenizer.config().eos_token) {
    return make_error(ErrorCode::invalid_argument, "SFTDataset: tokenizer {} has no eos_token", tokenizer.source());
  }
  const std::string eos = *tokenizer.config().eos_token;
  TESSERA_ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl,
                           tokenizer::ChatTemplate::from_name(options.chat_template, tokenizer.config()));
  for (const auto& file : files) {
    TESSERA_RETURN_IF_ERROR(internal::for_each_record(file, [&](const internal::Record& row, const std::string& where) {
      TESSERA_ASSIGN_OR_RETURN(std::string prompt, string_field(row, options.prompt_key, options.prompt_dict_keys, where));
      TESSERA_ASSIGN_OR_RETURN(std::string response,
                               string_field(row, options.response_key, options.response_dict_keys, where));
      auto text = tmpl.render({{"user", prompt}}, /*add_generation_prompt=*/true);
      if (!text.ok()) return text.status().with_context(where);
      SFTExample ex;
      ex.source = where;
      auto p = tokenizer.encode(*text);
      if (!p.ok()) return p.status().with_context(where);
      auto r = tokenizer.encode(response + eos);
      if (!r.ok()) return r.status().with_context(where);
      ex.prompt_ids = std::move(p).value();
      ex.response_ids = std::move(r).value();
      int64_t total = static_cast<int64_t>(ex.prompt_ids.size() + ex.response_ids.size());
      if (total > options.max_length && options.truncation == Truncation::error) {
        return make_error(ErrorCode::out_of_range, "{}: prompt + response is {} tokens, longer than data.max_length {} "
                          "(truncation=error)", where, total, options.max_length);
      }
      ds.examples_.push_back(std::move(ex));
      return Status();
    }));
  }
  return ds;
}

Result<proto::DataProto> SFTDataset::collate(const std::vector<int64_t>& indices) const {
  if (indices.empty()) return make_error(ErrorCode::invalid_argument, "SFTDataset::collate: no indices");
  const int64_t b = static_cast<int64_t>(indices.size()), len = options_.max_length;
  at::Tensor ids = torch::full({b, len}, pad_id_, torch::kInt64);
  at::Tensor mask = torch::zeros({b, len}, torch::kInt64);
  at::Tensor loss = torch::zeros({b, len}, torch::kInt64);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  auto loss_a = loss.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    int64_t k = indices[static_cast<size_t>(i)];
    if (k < 0 || k >= size()) {
      return make_error(ErrorCode::out_of_range, "SFTDataset::collate: index {} outside [0, {})", k, size());
    }
    const SFTExample& ex = example(k);
    std::vector<int32_t> seq = ex.prompt_ids;
    seq.insert(seq.end(), ex.response_ids.begin(), ex.response_ids.end());
    const int64_t prompt_len = static_cast<int64_t>(ex.prompt_ids.size());
    const int64_t response_len = static_cast<int64_t>(ex.response_ids.size());
    TESSERA_ASSIGN_OR_RETURN(seq, truncate_ids(std::move(seq), len, options_.truncation, ex.source));
    const int64_t n = static_cast<int64_t>(seq.size());  // right padding after the sequence
    for (int64_t j = 0; j < n; ++j) ids_a[i][j] = seq[static_cast<size_t>(j)], mask_a[i][j] = 1, loss_a[i][j] = 1;
    // verl: mask the prompt except its last token, and the last token of the sequence.
    if (prompt_len > 1) {
      for (int64_t j = 0; j < std::min(prompt_len, len) - 1; ++j) loss_a[i][j] = 0;
    }
    loss_a[i][std::min(prompt_len + response_len, len) - 1] = 0;
  }
  proto::TensorDict tensors;
  tensors.insert_or_assign("input_ids", ids);
  tensors.insert_or_assign("attention_mask", mask);
  tensors.insert_or_assign("position_ids", compute_position_id_with_mask(mask));
  tensors.insert_or_assign("loss_mask", loss);
  return proto::DataProto::from_dict(std::move(tensors));
}

}  // namespace tessera::driver
