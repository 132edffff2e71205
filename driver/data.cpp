// RLHFDataset, truncation helpers and data config readers (driver/data.hpp).
#include "driver/data.hpp"
#include "driver/model_paths.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <spdlog/spdlog.h>

#include <torch/torch.h>

#include "driver/config.hpp"
#include "driver/internal/jsonl.hpp"

namespace tessera::driver {
namespace {

Result<std::vector<tokenizer::ChatMessage>> parse_messages(const nlohmann::json& prompt, const std::string& key,
                                                        const std::string& where) {
  if (!prompt.is_array() || prompt.empty()) {
    return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a non-empty list of chat messages", where, key);
  }
  std::vector<tokenizer::ChatMessage> out;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const auto& m = prompt[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return make_error(ErrorCode::corrupt_data, "{}: {}[{}] must be an object with string 'role' and 'content'", where,
                        key, i);
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

Result<std::string> optional_string(const internal::Record& row, const char* key, const std::string& where) {
  auto it = row.find(key);
  if (it == row.end() || it->is_null()) return std::string();
  if (!it->is_string()) return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a string", where, key);
  return it->get<std::string>();
}

}  // namespace

bool is_row_column(const std::string& key) {
  // What RLHFRow models, and what verl's __getitem__ sets over a column of the same name.
  static const std::set<std::string> kOwn = {
      "data_source", "ability", "reward_model", "extra_info", "agent_name", "input_ids", "attention_mask",
      "position_ids", "raw_prompt", "raw_prompt_ids", "full_prompts", "index", "tools_kwargs", "interaction_kwargs",
      "uid", "multi_modal_data", "multi_modal_inputs"};
  return kOwn.count(key) == 0;
}

namespace {

Result<RLHFRow> parse_row(const internal::Record& row, const std::string& where, const RLHFDatasetOptions& options) {
  RLHFRow r;
  r.source = where;
  auto ds = row.find("data_source");
  if (ds == row.end() || !ds->is_string()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'data_source' must be a string", where);
  }
  r.data_source = ds->get<std::string>();
  TESSERA_ASSIGN_OR_RETURN(r.ability, optional_string(row, "ability", where));
  auto p = row.find(options.prompt_key);
  if (p == row.end()) return make_error(ErrorCode::corrupt_data, "{}: missing '{}'", where, options.prompt_key);
  r.prompt = nlohmann::json(*p);
  auto rm = row.find("reward_model");
  if (rm == row.end() || !rm->is_object()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'reward_model' must be an object with 'ground_truth'", where);
  }
  r.reward_model = nlohmann::json(*rm);
  auto extra = row.find("extra_info");
  r.extra_info = extra == row.end() ? nlohmann::json() : nlohmann::json(*extra);
  TESSERA_ASSIGN_OR_RETURN(r.agent_name, optional_string(row, "agent_name", where));
  for (const auto& [key, value] : row.items()) {
    if (key == options.prompt_key || !is_row_column(key)) continue;
    const auto& media = options.media_keys;
    if (std::find(media.begin(), media.end(), key) != media.end()) continue;  // text only: not read
    nlohmann::json column(value);
    try {
      (void)column.dump();  // bytes that are not text (a binary parquet column) cannot travel
    } catch (const nlohmann::json::exception&) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("{}: column '{}' holds bytes that are not UTF-8 text; batches leave it out", where, key);
      });
      continue;
    }
    r.columns[key] = std::move(column);
  }
  return r;
}

}  // namespace

Result<Truncation> parse_truncation(std::string_view text, const std::string& key) {
  if (text == "error") return Truncation::error;
  if (text == "left") return Truncation::left;
  if (text == "right") return Truncation::right;
  if (text == "middle") return Truncation::middle;
  return make_error(ErrorCode::invalid_argument, "{} = '{}' is not one of: error, left, right, middle", key, text);
}

Result<std::vector<int32_t>> truncate_ids(std::vector<int32_t> ids, int64_t max_length, Truncation mode,
                                          const std::string& what) {
  const auto len = static_cast<int64_t>(ids.size());
  if (len <= max_length) return ids;
  switch (mode) {
    case Truncation::left:
      return std::vector<int32_t>(ids.end() - max_length, ids.end());
    case Truncation::right:
      return std::vector<int32_t>(ids.begin(), ids.begin() + max_length);
    case Truncation::middle: {
      int64_t head = max_length / 2, tail = max_length - head;
      std::vector<int32_t> out(ids.begin(), ids.begin() + head);
      out.insert(out.end(), ids.end() - tail, ids.end());
      return out;
    }
    case Truncation::error:
      break;
  }
  return make_error(ErrorCode::out_of_range, "{} is {} tokens, longer than the limit {} (truncation=error)", what, len,
                    max_length);
}

at::Tensor compute_position_id_with_mask(const at::Tensor& attention_mask) {
  return torch::clamp_min(torch::cumsum(attention_mask, -1) - 1, 0).to(torch::kInt64);
}

Result<std::vector<std::filesystem::path>> data_files(const nlohmann::json& cfg, const std::string& key) {
  const nlohmann::json* v = config_find(cfg, key);
  if (v == nullptr) return make_error(ErrorCode::not_found, "config key '{}' is missing", key);
  std::vector<std::filesystem::path> out;
  auto expand = [](const std::string& p) { return std::filesystem::path(expand_user(p)); };
  if (v->is_string()) {
    out.push_back(expand(v->get<std::string>()));
  } else if (v->is_array()) {
    for (const auto& item : *v) {
      if (!item.is_string()) return make_error(ErrorCode::invalid_argument, "config key '{}' must list paths", key);
      out.push_back(expand(item.get<std::string>()));
    }
  }
  if (out.empty()) return make_error(ErrorCode::invalid_argument, "config key '{}' names no data file", key);
  return out;
}

Result<std::vector<std::filesystem::path>> optional_data_files(const nlohmann::json& cfg, const std::string& key) {
  const nlohmann::json* v = config_find(cfg, key);
  if (v == nullptr || v->is_null() || (v->is_array() && v->empty())) return std::vector<std::filesystem::path>{};
  return data_files(cfg, key);
}

Result<int32_t> dataset_pad_id(const tokenizer::Tokenizer& tokenizer) {
  if (auto pad = tokenizer.pad_token_id()) return *pad;
  if (auto eos = tokenizer.eos_token_id()) return *eos;
  return make_error(ErrorCode::invalid_argument, "tokenizer {} has neither a pad nor an eos token", tokenizer.source());
}

Result<RLHFDatasetOptions> RLHFDatasetOptions::from_config(const nlohmann::json& cfg) {
  RLHFDatasetOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.prompt_key, config_get<std::string>(cfg, "data.prompt_key"));
  TESSERA_ASSIGN_OR_RETURN(o.max_prompt_length, config_get<int64_t>(cfg, "data.max_prompt_length"));
  TESSERA_ASSIGN_OR_RETURN(std::string trunc, config_get<std::string>(cfg, "data.truncation"));
  TESSERA_ASSIGN_OR_RETURN(o.truncation, parse_truncation(trunc));
  TESSERA_ASSIGN_OR_RETURN(o.filter_overlong_prompts, config_get<bool>(cfg, "data.filter_overlong_prompts"));
  TESSERA_ASSIGN_OR_RETURN(auto tmpl, config_get_or<std::optional<std::string>>(
                                          cfg, "actor_rollout_ref.model.custom_chat_template", std::nullopt));
  o.chat_template = tmpl.value_or("auto");
  o.media_keys.clear();
  for (const char* key : {"data.image_key", "data.video_key"}) {
    TESSERA_ASSIGN_OR_RETURN(auto name, config_get_or<std::optional<std::string>>(cfg, key, std::nullopt));
    if (name) o.media_keys.push_back(*name);
  }
  if (const nlohmann::json* kwargs = config_find(cfg, "data.apply_chat_template_kwargs"); kwargs && !kwargs->is_null()) {
    if (!kwargs->is_object()) {
      return make_error(ErrorCode::invalid_argument, "data.apply_chat_template_kwargs must be a mapping, got {}",
                        kwargs->dump());
    }
    o.chat_template_variables = *kwargs;
  }
  if (o.max_prompt_length < 1) {
    return make_error(ErrorCode::invalid_argument, "data.max_prompt_length = {} must be >= 1", o.max_prompt_length);
  }
  return o;
}

Result<RLHFDataset> RLHFDataset::load(const std::vector<std::filesystem::path>& files,
                                      const tokenizer::Tokenizer& tokenizer, const RLHFDatasetOptions& options) {
  RLHFDataset ds;
  ds.options_ = options;
  TESSERA_ASSIGN_OR_RETURN(ds.pad_id_, dataset_pad_id(tokenizer));
  if (!options.chat_template_variables.empty() && (options.chat_template == "chatml" || options.chat_template == "plain")) {
    return make_error(ErrorCode::invalid_argument,
                      "data.apply_chat_template_kwargs needs a Jinja chat template, and "
                      "actor_rollout_ref.model.custom_chat_template={} has no variables", options.chat_template);
  }
  TESSERA_ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl,
                           tokenizer::ChatTemplate::from_name(options.chat_template, tokenizer.config(),
                                                              options.chat_template_variables));
  for (const auto& file : files) {
    TESSERA_RETURN_IF_ERROR(internal::for_each_record(file, [&](const internal::Record& row, const std::string& where) {
      TESSERA_ASSIGN_OR_RETURN(RLHFRow r, parse_row(row, where, options));
      TESSERA_RETURN_IF_ERROR(parse_messages(r.prompt, options.prompt_key, where).status());
      // All the messages' fields, their keys in the row's order (internal::Record).
      auto text = tmpl.render_json(row.at(options.prompt_key), /*add_generation_prompt=*/true);
      if (!text.ok()) return text.status().with_context(where);
      auto ids = tokenizer.encode(*text);
      if (!ids.ok()) return ids.status().with_context(where);
      if (options.filter_overlong_prompts && static_cast<int64_t>(ids->size()) > options.max_prompt_length) {
        ++ds.filtered_;
        return Status();
      }
      auto cut = truncate_ids(std::move(ids).value(), options.max_prompt_length, options.truncation,
                              where + ": the prompt");
      if (!cut.ok()) return cut.status();
      r.prompt_ids = std::move(cut).value();
      ds.has_agent_names_ |= !r.agent_name.empty();
      ds.rows_.push_back(std::move(r));
      return Status();
    }));
  }
  ds.find_columns();
  return ds;
}

void RLHFDataset::find_columns() {
  std::map<std::string, bool> strings;
  for (const RLHFRow& r : rows_) {
    for (const auto& [key, value] : r.columns.items()) {
      auto [it, fresh] = strings.emplace(key, value.is_string());
      if (!fresh) it->second = it->second && value.is_string();
    }
  }
  for (const auto& [key, all_strings] : strings) {
    bool everywhere = all_strings;
    for (const RLHFRow& r : rows_) everywhere = everywhere && r.columns.contains(key);
    columns_.emplace_back(key, everywhere);
  }
}

Result<RLHFDataset> RLHFDataset::from_rows(std::vector<RLHFRow> rows, const tokenizer::Tokenizer& tokenizer,
                                           const RLHFDatasetOptions& options) {
  RLHFDataset ds;
  ds.options_ = options;
  TESSERA_ASSIGN_OR_RETURN(ds.pad_id_, dataset_pad_id(tokenizer));
  for (const RLHFRow& r : rows) {
    if (r.prompt_ids.empty() || static_cast<int64_t>(r.prompt_ids.size()) > options.max_prompt_length) {
      return make_error(ErrorCode::invalid_argument, "{}: the prompt has {} tokens; data.max_prompt_length is {}",
                        r.source, r.prompt_ids.size(), options.max_prompt_length);
    }
    ds.has_agent_names_ |= !r.agent_name.empty();
  }
  ds.rows_ = std::move(rows);
  ds.find_columns();
  return ds;
}

Result<proto::DataProto> RLHFDataset::collate(const std::vector<int64_t>& indices) const {
  if (indices.empty()) return make_error(ErrorCode::invalid_argument, "RLHFDataset::collate: no indices");
  const int64_t b = static_cast<int64_t>(indices.size()), len = options_.max_prompt_length;
  at::Tensor ids = torch::full({b, len}, pad_id_, torch::kInt64);
  at::Tensor mask = torch::zeros({b, len}, torch::kInt64);
  std::vector<std::string> sources, abilities;
  std::vector<nlohmann::json> reward_model, extra_info, raw_prompt, raw_prompt_ids, tools_kwargs, interaction_kwargs;
  std::vector<int64_t> index;
  std::vector<std::string> agent_names;  // verl's agent_name column, when the dataset has one
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    int64_t k = indices[static_cast<size_t>(i)];
    if (k < 0 || k >= size()) {
      return make_error(ErrorCode::out_of_range, "RLHFDataset::collate: index {} outside [0, {})", k, size());
    }
    const RLHFRow& r = row(k);
    const int64_t n = static_cast<int64_t>(r.prompt_ids.size()), offset = len - n;  // left padding
    for (int64_t j = 0; j < n; ++j) ids_a[i][offset + j] = r.prompt_ids[static_cast<size_t>(j)], mask_a[i][offset + j] = 1;
    sources.push_back(r.data_source);
    abilities.push_back(r.ability);
    reward_model.push_back(r.reward_model);
    extra_info.push_back(r.extra_info);
    raw_prompt.push_back(r.prompt);
    raw_prompt_ids.push_back(r.prompt_ids);
    const nlohmann::json* idx = r.extra_info.is_object() ? &r.extra_info : nullptr;
    if (has_agent_names_) agent_names.push_back(r.agent_name.empty() ? "single_turn_agent" : r.agent_name);
    // verl's RLHFDataset: extra_info.tools_kwargs and interaction_kwargs (the multi-turn rollout's
    // per-row tool arguments and interaction).
    for (auto [key, column, own] : {std::tuple{"tools_kwargs", &tools_kwargs, &r.tools_kwargs},
                                    std::tuple{"interaction_kwargs", &interaction_kwargs, &r.interaction_kwargs}}) {
      column->push_back(!own->is_null()                                    ? *own
                        : idx && idx->contains(key) && !(*idx)[key].is_null() ? (*idx)[key]
                                                                              : nlohmann::json::object());
    }
    index.push_back(r.index                                                       ? *r.index
                    : idx && idx->contains("index") && (*idx)["index"].is_number_integer() ? (*idx)["index"].get<int64_t>()
                                                                                          : 0);
  }
  proto::TensorDict tensors;
  tensors.insert_or_assign("input_ids", ids);
  tensors.insert_or_assign("attention_mask", mask);
  tensors.insert_or_assign("position_ids", compute_position_id_with_mask(mask));
  proto::NonTensorBatch cols;
  cols.insert_or_assign("data_source", proto::Column::strings(std::move(sources)));
  cols.insert_or_assign("ability", proto::Column::strings(std::move(abilities)));
  cols.insert_or_assign("reward_model", proto::Column::jsons(std::move(reward_model)));
  cols.insert_or_assign("extra_info", proto::Column::jsons(std::move(extra_info)));
  cols.insert_or_assign("raw_prompt", proto::Column::jsons(std::move(raw_prompt)));
  cols.insert_or_assign("raw_prompt_ids", proto::Column::jsons(std::move(raw_prompt_ids)));
  cols.insert_or_assign("index", proto::Column::int64s(std::move(index)));
  cols.insert_or_assign("tools_kwargs", proto::Column::jsons(std::move(tools_kwargs)));
  cols.insert_or_assign("interaction_kwargs", proto::Column::jsons(std::move(interaction_kwargs)));
  if (!agent_names.empty()) cols.insert_or_assign("agent_name", proto::Column::strings(std::move(agent_names)));
  for (const auto& [key, strings] : columns_) {
    std::vector<nlohmann::json> values;
    std::vector<std::string> texts;
    for (int64_t k : indices) {
      const nlohmann::json& c = row(k).columns;
      if (strings) {
        texts.push_back(c.at(key).get<std::string>());
      } else {
        values.push_back(c.contains(key) ? c.at(key) : nlohmann::json());
      }
    }
    cols.insert_or_assign(key, strings ? proto::Column::strings(std::move(texts)) : proto::Column::jsons(std::move(values)));
  }
  return proto::DataProto::from_dict(std::move(tensors), std::move(cols));
}

}  // namespace tessera::driver
