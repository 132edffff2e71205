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
  TESSERA_ASSIGN_OR_RETURN(o.multiturn, config_get_or<bool>(cfg, "data.multiturn.enable", false));
  for (auto [key, out] : {std::pair{"data.multiturn.messages_key", &o.messages_key},
                          std::pair{"data.multiturn.tools_key", &o.tools_key},
                          std::pair{"data.multiturn.enable_thinking_key", &o.enable_thinking_key}}) {
    TESSERA_ASSIGN_OR_RETURN(auto value, config_get_or<std::optional<std::string>>(cfg, key, std::nullopt));
    if (value) *out = *value;
  }
  if (o.truncation == Truncation::middle) {
    return make_error(ErrorCode::unimplemented, "data.truncation = 'middle' is not supported for SFT (verl neither)");
  }
  if (o.max_length < 2) return make_error(ErrorCode::invalid_argument, "data.max_length = {} must be >= 2", o.max_length);
  return o;
}

namespace {

// verl's MultiTurnSFTDataset: the conversation tokenized message by message (data.hpp).
class ConversationTokenizer {
 public:
  ConversationTokenizer(const tokenizer::Tokenizer& tokenizer, const SFTDatasetOptions& options)
      : tokenizer_(tokenizer), options_(options) {}

  Result<SFTExample> tokenize(const internal::Record& row, const std::string& where) {
    const std::string& key = options_.messages_key;
    auto it = row.find(key);
    if (it == row.end() || !it->is_array() || it->empty()) {
      return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a non-empty list of chat messages", where, key);
    }
    const nlohmann::ordered_json& messages = *it;
    nlohmann::ordered_json tools;  // null: no tools
    if (auto t = row.find(options_.tools_key); t != row.end() && !t->is_null()) {
      if (!t->is_array()) return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a list", where, options_.tools_key);
      tools = *t;
    }
    nlohmann::json thinking;  // null: the template's default
    if (auto t = row.find(options_.enable_thinking_key); t != row.end() && !t->is_null()) {
      if (!t->is_boolean()) {
        return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a boolean", where, options_.enable_thinking_key);
      }
      thinking = t->get<bool>();
    }
    auto chosen = template_for(thinking);
    if (!chosen.ok()) return chosen.status().with_context(where);
    const tokenizer::ChatTemplate* chat = *chosen;
    auto render = [&](size_t end, bool generation_prompt) -> Result<std::string> {
      nlohmann::ordered_json head = nlohmann::ordered_json::array();
      for (size_t k = 0; k < end; ++k) head.push_back(messages[k]);
      auto text = chat->render_json(head, tools, generation_prompt);
      if (!text.ok()) return text.status().with_context(fmt::format("{}: {}", where, key));
      return text;
    };
    SFTExample ex;
    ex.source = where;
    auto append = [&](const std::string& text, uint8_t trained) -> Status {
      TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_.encode(text));
      ex.ids.insert(ex.ids.end(), ids.begin(), ids.end());
      ex.trained.insert(ex.trained.end(), ids.size(), trained);
      return Status();
    };
    // verl cuts each rendering at the previous one's length (a template that rewrites earlier
    // turns gives the same tokens as there).
    auto after = [](const std::string& text, const std::string& prefix) {
      return text.size() > prefix.size() ? text.substr(prefix.size()) : std::string();
    };
    for (size_t i = 0; i < messages.size();) {
      const nlohmann::ordered_json& m = messages[i];
      const std::string role = m.is_object() && m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>()
                                                                                             : std::string();
      size_t end = i + 1;
      if (role == "tool") {
        while (end < messages.size() && messages[end].is_object() && messages[end].contains("role") &&
               messages[end]["role"] == "tool") {
          ++end;
        }
      } else if (role == "system" && i != 0) {
        return make_error(ErrorCode::corrupt_data, "{}: {}[{}]: a system message must be the first", where, key, i);
      } else if (role != "assistant" && role != "user" && role != "system") {
        return make_error(ErrorCode::corrupt_data, "{}: {}[{}] has role '{}' (expected system, user, assistant or tool)",
                          where, key, i, role);
      }
      std::string prev;
      if (i > 0) {
        TESSERA_ASSIGN_OR_RETURN(prev, render(i, false));
      }
      TESSERA_ASSIGN_OR_RETURN(std::string cur, render(end, false));
      if (role == "assistant") {
        if (i == 0) {
          return make_error(ErrorCode::corrupt_data, "{}: {}[0] is the assistant's: a conversation starts with the "
                            "system or the user", where, key);
        }
        TESSERA_ASSIGN_OR_RETURN(std::string prompted, render(i, true));
        TESSERA_RETURN_IF_ERROR(append(after(prompted, prev), 0).with_context(where));
        TESSERA_RETURN_IF_ERROR(append(after(cur, prompted), 1).with_context(where));
      } else {
        TESSERA_RETURN_IF_ERROR(append(after(cur, prev), 0).with_context(where));
      }
      i = end;
    }
    // verl compares with the whole conversation's tokens and, when they differ, warns and trains
    // on the pieces: a template that renders earlier turns differently once later ones follow
    // (Qwen3's think blocks before the last user turn) then yields text that no rendering has.
    TESSERA_ASSIGN_OR_RETURN(std::string whole, render(messages.size(), false));
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> whole_ids, tokenizer_.encode(whole));
    if (whole_ids != ex.ids) {
      return make_error(ErrorCode::corrupt_data,
                        "{}: the chat template renders this conversation's earlier turns differently once later "
                        "ones follow, so it cannot be cut into per-message pieces (verl would train on text no "
                        "rendering has); use a chat template that keeps earlier turns as they are "
                        "(data.chat_template), or one assistant turn per row",
                        where);
    }
    if (std::find(ex.trained.begin(), ex.trained.end(), 1) == ex.trained.end()) {
      return make_error(ErrorCode::corrupt_data, "{}: '{}' has no assistant message to train on", where, key);
    }
    return ex;
  }

 private:
  // One template per enable_thinking value (null, false, true), with data's chat template.
  Result<const tokenizer::ChatTemplate*> template_for(const nlohmann::json& thinking) {
    const int k = thinking.is_null() ? 0 : thinking.get<bool>() ? 2 : 1;
    if (!templates_[k]) {
      const nlohmann::json vars = thinking.is_null() ? nlohmann::json::object() : nlohmann::json{{"enable_thinking", thinking}};
      TESSERA_ASSIGN_OR_RETURN(tokenizer::ChatTemplate t,
                               tokenizer::ChatTemplate::from_name(options_.chat_template, tokenizer_.config(), vars));
      templates_[k].emplace(std::move(t));
    }
    return &*templates_[k];
  }

  const tokenizer::Tokenizer& tokenizer_;
  const SFTDatasetOptions& options_;
  std::optional<tokenizer::ChatTemplate> templates_[3];
};

}  // namespace

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
  if (options.multiturn) {
    ConversationTokenizer conversations(tokenizer, options);
    for (const auto& file : files) {
      TESSERA_RETURN_IF_ERROR(internal::for_each_record(file, [&](const internal::Record& row, const std::string& where) {
        TESSERA_ASSIGN_OR_RETURN(SFTExample ex, conversations.tokenize(row, where));
        if (static_cast<int64_t>(ex.ids.size()) > options.max_length && options.truncation == Truncation::error) {
          return make_error(ErrorCode::out_of_range, "{}: the conversation is {} tokens, longer than data.max_length {} "
                            "(truncation=error)", where, ex.ids.size(), options.max_length);
        }
        ds.examples_.push_back(std::move(ex));
        return Status();
      }));
    }
    return ds;
  }
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

Result<SFTDataset> SFTDataset::from_items(std::vector<SFTExample> items, const tokenizer::Tokenizer& tokenizer,
                                          const SFTDatasetOptions& options) {
  SFTDataset ds;
  ds.options_ = options;
  TESSERA_ASSIGN_OR_RETURN(ds.pad_id_, dataset_pad_id(tokenizer));
  for (const SFTExample& ex : items) {
    for (const size_t n : {ex.item_ids.size(), ex.item_mask.size(), ex.item_positions.size(), ex.item_loss.size()}) {
      if (static_cast<int64_t>(n) != options.max_length) {
        return make_error(ErrorCode::invalid_argument, "{}: a column of {} values; data.max_length is {}", ex.source, n,
                          options.max_length);
      }
    }
  }
  ds.examples_ = std::move(items);
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
    if (!ex.item_ids.empty()) {  // the user's class built the example: its columns as they are
      for (int64_t j = 0; j < len; ++j) {
        ids_a[i][j] = ex.item_ids[static_cast<size_t>(j)];
        mask_a[i][j] = ex.item_mask[static_cast<size_t>(j)];
        loss_a[i][j] = ex.item_loss[static_cast<size_t>(j)];
      }
      continue;
    }
    if (options_.multiturn) {
      // verl's truncation of the conversation, then the trained tokens shifted to the positions
      // that predict them; positions 0 on padding (verl: arange * attention_mask).
      const int64_t total = static_cast<int64_t>(ex.ids.size()), n = std::min(total, len);
      const int64_t from = options_.truncation == Truncation::left ? total - n : 0;
      for (int64_t j = 0; j < n; ++j) {
        ids_a[i][j] = ex.ids[static_cast<size_t>(from + j)];
        mask_a[i][j] = 1;
        if (j + 1 < n) loss_a[i][j] = ex.trained[static_cast<size_t>(from + j + 1)];
      }
      continue;
    }
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
  at::Tensor positions = options_.multiturn ? torch::arange(len, torch::kInt64).unsqueeze(0) * mask
                                            : compute_position_id_with_mask(mask);
  for (int64_t i = 0; i < b; ++i) {
    const SFTExample& ex = example(indices[static_cast<size_t>(i)]);
    if (!ex.item_positions.empty()) {
      positions[i].copy_(torch::tensor(std::vector<int64_t>(ex.item_positions.begin(), ex.item_positions.end())));
    }
  }
  proto::TensorDict tensors;
  tensors.insert_or_assign("input_ids", ids);
  tensors.insert_or_assign("attention_mask", mask);
  tensors.insert_or_assign("position_ids", positions);
  tensors.insert_or_assign("loss_mask", loss);
  return proto::DataProto::from_dict(std::move(tensors));
}

}  // namespace tessera::driver
