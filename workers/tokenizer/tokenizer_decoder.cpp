// tokenizer_decoder.cpp: HF decoders and post-processors (the parts that act on token lists).
#include "workers/tokenizer/tokenizer_pipeline.hpp"

#include <map>
#include <memory>
#include <utility>

#include "workers/tokenizer/tokenizer_regex.hpp"
#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::field_error;
using tokenizer_json::unsupported_error;

namespace {

// HF ByteLevel::decode_chain: each token's characters map back to bytes; a token holding a
// character outside the table (an added token such as "<|im_end|>" is not) keeps its own bytes.
void append_byte_level_token(const std::string& token, std::string& out) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const unicode::Utf8Char c = unicode::decode_utf8(token, pos);
    const int b = c.valid ? unicode_to_byte(c.cp) : -1;
    if (b < 0) {
      out += token;
      return;
    }
    bytes.push_back(static_cast<char>(b));
    pos += c.len;
  }
  out += bytes;
}

Result<TokenDecodeStep> parse_byte_level_decoder(const nlohmann::json&, const JsonPath&) {
  return TokenDecodeStep([](std::vector<std::string> tokens) {
    std::string text;
    for (const auto& t : tokens) append_byte_level_token(t, text);
    return std::vector<std::string>{std::move(text)};
  });
}

Result<TokenDecodeStep> parse_fuse_decoder(const nlohmann::json&, const JsonPath&) {
  return TokenDecodeStep([](std::vector<std::string> tokens) {
    std::string text;
    for (const auto& t : tokens) text += t;
    return std::vector<std::string>{std::move(text)};
  });
}

Result<TokenDecodeStep> parse_replace_decoder(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(TokenizerRegex re, parse_regex_pattern(j, where));
  TESSERA_ASSIGN_OR_RETURN(std::string content, tokenizer_json::string_member(j, where, "content"));
  auto shared = std::make_shared<const TokenizerRegex>(std::move(re));
  return TokenDecodeStep([shared, content](std::vector<std::string> tokens) {
    for (auto& t : tokens) {
      auto replaced = shared->replace_all(t, content);
      if (replaced.ok()) t = std::move(replaced).value();  // a failed match (PCRE2 limits) keeps the token
    }
    return tokens;
  });
}

// HF Strip: drops up to `start` leading and `stop` trailing copies of the character `content`.
Result<TokenDecodeStep> parse_strip_decoder(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string content, tokenizer_json::string_member(j, where, "content"));
  if (content.empty() || unicode::decode_utf8(content, 0).len != content.size()) {
    return field_error(where / "content", "expected one character");
  }
  const nlohmann::json* start = tokenizer_json::optional_member(j, "start");
  const nlohmann::json* stop = tokenizer_json::optional_member(j, "stop");
  if (start == nullptr || !start->is_number_unsigned() || stop == nullptr || !stop->is_number_unsigned()) {
    return field_error(where, "Strip needs non-negative integers 'start' and 'stop'");
  }
  const size_t n_start = start->get<size_t>(), n_stop = stop->get<size_t>();
  return TokenDecodeStep([content, n_start, n_stop](std::vector<std::string> tokens) {
    for (auto& t : tokens) {
      for (size_t k = 0; k < n_start && t.compare(0, content.size(), content) == 0; ++k) {
        t.erase(0, content.size());
      }
      for (size_t k = 0; k < n_stop && t.size() >= content.size() &&
                         t.compare(t.size() - content.size(), content.size(), content) == 0;
           ++k) {
        t.erase(t.size() - content.size());
      }
    }
    return tokens;
  });
}

// The byte of a "<0xXX>" token as HF's ByteFallback reads it (Rust u8::from_str_radix on the
// two characters, which also takes "+F"), or -1.
int byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (token[3] == '+') return hex(token[4]);
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Appends a run of byte tokens: their text when it is well-formed UTF-8, else one U+FFFD per byte.
void flush_bytes(std::string& bytes, std::vector<std::string>& out) {
  if (bytes.empty()) return;
  if (unicode::is_valid_utf8(bytes)) {
    out.push_back(bytes);
  } else {
    out.insert(out.end(), bytes.size(), "\xEF\xBF\xBD");
  }
  bytes.clear();
}

// HF ByteFallback: runs of "<0xXX>" tokens become the text of their bytes.
Result<TokenDecodeStep> parse_byte_fallback_decoder(const nlohmann::json&, const JsonPath&) {
  return TokenDecodeStep([](std::vector<std::string> tokens) {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string bytes;
    for (auto& t : tokens) {
      const int b = byte_fallback_value(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        continue;
      }
      flush_bytes(bytes, out);
      out.push_back(std::move(t));
    }
    flush_bytes(bytes, out);
    return out;
  });
}

// HF Metaspace::decode_chain: the replacement becomes " ", except in the first token, where
// every replacement is dropped unless prepend_scheme is "never".
Result<TokenDecodeStep> parse_metaspace_decoder(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(MetaspaceOptions o, parse_metaspace_options(j, where));
  return TokenDecodeStep([o](std::vector<std::string> tokens) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string with = i == 0 && o.prepend_scheme != MetaspaceOptions::Prepend::never ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      size_t prev = 0;
      for (size_t at = t.find(o.replacement); at != std::string::npos; at = t.find(o.replacement, prev)) {
        out.append(t, prev, at - prev).append(with);
        prev = at + o.replacement.size();
      }
      out.append(t, prev, std::string::npos);
      tokens[i] = std::move(out);
    }
    return tokens;
  });
}

Result<TokenDecodeStep> parse_decoder_step(const nlohmann::json& j, const JsonPath& where);

Result<TokenDecodeStep> parse_decoder_sequence(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* list, tokenizer_json::member(j, where, "decoders"));
  if (!list->is_array()) return field_error(where / "decoders", "expected an array");
  std::vector<TokenDecodeStep> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(TokenDecodeStep s, parse_decoder_step((*list)[i], (where / "decoders").at(i)));
    steps.push_back(std::move(s));
  }
  return TokenDecodeStep([steps](std::vector<std::string> tokens) {
    for (const auto& s : steps) tokens = s(std::move(tokens));
    return tokens;
  });
}

using TokenDecoderParser = Result<TokenDecodeStep> (*)(const nlohmann::json&, const JsonPath&);

const std::map<std::string, TokenDecoderParser>& decoder_parsers() {
  static const std::map<std::string, TokenDecoderParser> table = {
      {"ByteLevel", parse_byte_level_decoder},
      {"ByteFallback", parse_byte_fallback_decoder},
      {"Metaspace", parse_metaspace_decoder},
      {"Fuse", parse_fuse_decoder},
      {"Replace", parse_replace_decoder},
      {"Strip", parse_strip_decoder},
      {"Sequence", parse_decoder_sequence},
  };
  return table;
}

Result<TokenDecodeStep> parse_decoder_step(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, tokenizer_json::string_member(j, where, "type"));
  auto it = decoder_parsers().find(type);
  if (it == decoder_parsers().end()) {
    return unsupported_error(where / "type",
                             fmt::format("decoder '{}' is not supported "
                                         "(ByteLevel, ByteFallback, Metaspace, Fuse, Replace, Strip, Sequence)", type));
  }
  return it->second(j, where);
}

}  // namespace

Result<TokenDecoder> TokenDecoder::from_json(const nlohmann::json* j, const JsonPath& where) {
  TokenDecoder d;
  if (j == nullptr || j->is_null()) return d;
  TESSERA_ASSIGN_OR_RETURN(TokenDecodeStep s, parse_decoder_step(*j, where));
  d.has_decoder_ = true;
  d.steps_.push_back(std::move(s));
  return d;
}

std::string TokenDecoder::decode(std::vector<std::string> tokens) const {
  std::string text;
  if (!has_decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i == 0 ? "" : " ") + tokens[i];
    return text;
  }
  for (const auto& s : steps_) tokens = s(std::move(tokens));
  for (const auto& t : tokens) text += t;
  return text;
}

// ---- Post-processors ---------------------------------------------------------------------

/// Parses post-processor JSON into PostProcessor::templates_.
struct PostProcessorParser {
  static Status parse(const nlohmann::json& j, const JsonPath& where, PostProcessor& out);
  static Status parse_template(const nlohmann::json& j, const JsonPath& where, PostProcessor& out);
};

Status PostProcessorParser::parse_template(const nlohmann::json& j, const JsonPath& where, PostProcessor& out) {
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* single, tokenizer_json::member(j, where, "single"));
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* specials, tokenizer_json::member(j, where, "special_tokens"));
  if (!single->is_array()) return field_error(where / "single", "expected an array");
  std::vector<PostProcessor::Item> items;
  for (size_t i = 0; i < single->size(); ++i) {
    const JsonPath p = (where / "single").at(i);
    const nlohmann::json& piece = (*single)[i];
    if (const auto* seq = tokenizer_json::optional_member(piece, "Sequence")) {
      TESSERA_ASSIGN_OR_RETURN(std::string id, tokenizer_json::string_member(*seq, p / "Sequence", "id"));
      if (id != "A") return field_error(p / "Sequence" / "id", "a single-sequence template can only use A");
      items.push_back({true, {}});
      continue;
    }
    const auto* special = tokenizer_json::optional_member(piece, "SpecialToken");
    if (special == nullptr) return field_error(p, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    TESSERA_ASSIGN_OR_RETURN(std::string name, tokenizer_json::string_member(*special, p / "SpecialToken", "id"));
    const auto* entry = tokenizer_json::optional_member(*specials, name);
    const nlohmann::json* ids = entry == nullptr ? nullptr : tokenizer_json::optional_member(*entry, "ids");
    if (ids == nullptr || !ids->is_array()) return field_error(where / "special_tokens" / name, "missing or has no 'ids' list");
    PostProcessor::Item item;
    for (const auto& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) return field_error(where / "special_tokens" / name, "bad id");
      item.ids.push_back(id.get<int32_t>());
    }
    items.push_back(std::move(item));
  }
  out.templates_.push_back(std::move(items));
  return Status();
}

Status PostProcessorParser::parse(const nlohmann::json& j, const JsonPath& where, PostProcessor& out) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, tokenizer_json::string_member(j, where, "type"));
  if (type == "ByteLevel") return Status();  // adjusts offsets only
  if (type == "TemplateProcessing") return parse_template(j, where, out);
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* list, tokenizer_json::member(j, where, "processors"));
    if (!list->is_array()) return field_error(where / "processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      TESSERA_RETURN_IF_ERROR(parse((*list)[i], (where / "processors").at(i), out));
    }
    return Status();
  }
  return unsupported_error(where / "type", fmt::format(
      "post-processor '{}' is not supported (ByteLevel, TemplateProcessing, Sequence)", type));
}

Result<PostProcessor> PostProcessor::from_json(const nlohmann::json* j, const JsonPath& where) {
  PostProcessor p;
  if (j == nullptr || j->is_null()) return p;
  TESSERA_RETURN_IF_ERROR(PostProcessorParser::parse(*j, where, p));
  return p;
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  for (const auto& items : templates_) {
    std::vector<int32_t> out;
    for (const auto& item : items) {
      const auto& src = item.is_sequence ? ids : item.ids;
      out.insert(out.end(), src.begin(), src.end());
    }
    ids = std::move(out);
  }
  return ids;
}

}  // namespace tessera::tokenizer
