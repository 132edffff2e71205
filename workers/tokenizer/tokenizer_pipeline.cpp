// tokenizer_pipeline.cpp: byte-to-unicode and pre-tokenizers (HF semantics).
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

// GPT-2's bytes_to_unicode as code points: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100 onwards in byte order.
std::array<uint32_t, 256> byte_code_points() {
  std::array<uint32_t, 256> cps{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cps[b] = printable ? b : next++;
  }
  return cps;
}

// The GPT-2 ByteLevel regex (HF pre_tokenizers::byte_level).
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    const auto cps = byte_code_points();
    for (size_t b = 0; b < 256; ++b) unicode::append_utf8(cps[b], t[b]);
    return t;
  }();
  return table;
}

int unicode_to_byte(uint32_t cp) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> inv;
    inv.fill(-1);
    const auto cps = byte_code_points();
    for (int b = 0; b < 256; ++b) inv[cps[b]] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

Result<TokenizerRegex> parse_regex_pattern(const nlohmann::json& j, const JsonPath& where) {
  const JsonPath p = where / "pattern";
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* pattern, tokenizer_json::member(j, where, "pattern"));
  const nlohmann::json* regex = tokenizer_json::optional_member(*pattern, "Regex");
  const nlohmann::json* literal = tokenizer_json::optional_member(*pattern, "String");
  const nlohmann::json* text = regex != nullptr ? regex : literal;
  if (text == nullptr || !text->is_string()) return field_error(p, "expected {\"Regex\": ...} or {\"String\": ...}");
  auto re = TokenizerRegex::compile(text->get<std::string>(), regex == nullptr);
  if (!re.ok()) return field_error(p / (regex != nullptr ? "Regex" : "String"), re.status().message());
  return re;
}

Result<MetaspaceOptions> parse_metaspace_options(const nlohmann::json& j, const JsonPath& where) {
  MetaspaceOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.replacement, tokenizer_json::string_member(j, where, "replacement"));
  const unicode::Utf8Char c = o.replacement.empty() ? unicode::Utf8Char{0, 0, false}
                                                    : unicode::decode_utf8(o.replacement, 0);
  if (!c.valid || c.len != o.replacement.size()) return field_error(where / "replacement", "expected one character");
  static const std::map<std::string, MetaspaceOptions::Prepend> schemes = {
      {"always", MetaspaceOptions::Prepend::always},
      {"first", MetaspaceOptions::Prepend::first},
      {"never", MetaspaceOptions::Prepend::never}};
  TESSERA_ASSIGN_OR_RETURN(auto scheme, tokenizer_json::optional_string_member(j, where, "prepend_scheme"));
  if (scheme) {
    auto it = schemes.find(*scheme);
    if (it == schemes.end()) {
      return field_error(where / "prepend_scheme", fmt::format("unknown scheme '{}' (always, first, never)", *scheme));
    }
    o.prepend_scheme = it->second;
  }
  TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, tokenizer_json::bool_member(j, where, "add_prefix_space", true));
  if (!add_prefix_space && o.prepend_scheme != MetaspaceOptions::Prepend::never) {
    return field_error(where / "add_prefix_space", "false does not match prepend_scheme (absent means \"always\")");
  }
  TESSERA_ASSIGN_OR_RETURN(o.split, tokenizer_json::bool_member(j, where, "split", true));
  TESSERA_ASSIGN_OR_RETURN(auto str_rep, tokenizer_json::optional_string_member(j, where, "str_rep"));
  (void)str_rep;  // HF derives it from `replacement`
  return o;
}

// ---- Pre-tokenizers ----------------------------------------------------------------------

namespace {

// A stretch [begin, end) of a piece; `flag` is "is a match" before the behaviour is applied and
// "remove me" after.
struct Span {
  size_t begin;
  size_t end;
  bool flag;
};
using SplitBehavior = std::vector<Span> (*)(std::vector<Span>);

std::vector<Span> behave_removed(std::vector<Span> spans) { return spans; }

std::vector<Span> behave_isolated(std::vector<Span> spans) {
  for (auto& s : spans) s.flag = false;
  return spans;
}

// Contiguous / MergedWithPrevious / MergedWithNext share this fold (HF normalizer.rs `split`):
// a span joins the last output span when `joins(is_match, previous_was_match)`.
template <bool (*joins)(bool, bool)>
std::vector<Span> fold_spans(std::vector<Span> spans) {
  std::vector<Span> out;
  bool previous = false;
  for (const Span& s : spans) {
    if (joins(s.flag, previous) && !out.empty()) {
      out.back().end = s.end;
    } else {
      out.push_back({s.begin, s.end, false});
    }
    previous = s.flag;
  }
  return out;
}
bool joins_contiguous(bool is_match, bool previous) { return is_match == previous; }
bool joins_merged_with_previous(bool is_match, bool previous) { return is_match && !previous; }

std::vector<Span> behave_merged_with_next(std::vector<Span> spans) {
  std::vector<Span> reversed(spans.rbegin(), spans.rend());
  std::vector<Span> out;
  bool previous = false;
  for (const Span& s : reversed) {
    if (s.flag && !previous && !out.empty()) {
      out.back().begin = s.begin;
    } else {
      out.push_back({s.begin, s.end, false});
    }
    previous = s.flag;
  }
  return std::vector<Span>(out.rbegin(), out.rend());
}

const std::map<std::string, SplitBehavior>& split_behaviors() {
  static const std::map<std::string, SplitBehavior> table = {
      {"Removed", behave_removed},
      {"Isolated", behave_isolated},
      {"Contiguous", fold_spans<joins_contiguous>},
      {"MergedWithPrevious", fold_spans<joins_merged_with_previous>},
      {"MergedWithNext", behave_merged_with_next},
  };
  return table;
}

// Matches of `re` plus the gaps between them, covering `piece` (HF Pattern::find_matches).
Status match_spans(const TokenizerRegex& re, std::string_view piece, bool invert, std::vector<Span>& spans) {
  std::vector<std::pair<size_t, size_t>> matches;
  TESSERA_RETURN_IF_ERROR(re.find_all(piece, matches));
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < piece.size()) spans.push_back({prev, piece.size(), invert});
  return Status();
}

// The pieces of `piece` that survive `behavior` (a piece keeps at_start only at offset 0).
void emit_spans(const PreToken& piece, const std::vector<Span>& spans, std::vector<PreToken>& out) {
  for (const Span& s : spans) {
    if (s.flag || s.end <= s.begin) continue;
    out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

PreTokenizeStep make_split_step(TokenizerRegex re, SplitBehavior behavior, bool invert) {
  return [re = std::move(re), behavior, invert](const PreToken& piece, std::vector<PreToken>& out) {
    std::vector<Span> spans;
    TESSERA_RETURN_IF_ERROR(match_spans(re, piece.text, invert, spans));
    emit_spans(piece, behavior(std::move(spans)), out);
    return Status();
  };
}

Result<PreTokenizeStep> parse_split(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(TokenizerRegex re, parse_regex_pattern(j, where));
  TESSERA_ASSIGN_OR_RETURN(std::string behavior, tokenizer_json::string_member(j, where, "behavior"));
  auto it = split_behaviors().find(behavior);
  if (it == split_behaviors().end()) return field_error(where / "behavior", fmt::format("unknown behavior '{}'", behavior));
  TESSERA_ASSIGN_OR_RETURN(bool invert, tokenizer_json::bool_member(j, where, "invert", false));
  return make_split_step(std::move(re), it->second, invert);
}

Result<PreTokenizeStep> parse_byte_level(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, tokenizer_json::bool_member(j, where, "add_prefix_space", true));
  TESSERA_ASSIGN_OR_RETURN(bool use_regex, tokenizer_json::bool_member(j, where, "use_regex", true));
  TESSERA_ASSIGN_OR_RETURN(bool trim_offsets, tokenizer_json::bool_member(j, where, "trim_offsets", true));
  (void)trim_offsets;  // offsets only; see the header
  std::shared_ptr<const TokenizerRegex> re;
  if (use_regex) {
    TESSERA_ASSIGN_OR_RETURN(TokenizerRegex compiled, TokenizerRegex::compile(kByteLevelPattern, false));
    re = std::make_shared<const TokenizerRegex>(std::move(compiled));
  }
  return PreTokenizeStep([add_prefix_space, re](const PreToken& piece, std::vector<PreToken>& out) {
    std::string text;
    if (add_prefix_space && (piece.text.empty() || piece.text[0] != ' ')) text.push_back(' ');
    text.append(piece.text);
    std::vector<std::pair<size_t, size_t>> parts;
    if (re) {
      std::vector<Span> spans;
      TESSERA_RETURN_IF_ERROR(match_spans(*re, text, false, spans));
      for (const Span& s : spans) parts.emplace_back(s.begin, s.end);
    } else {
      parts.emplace_back(0, text.size());
    }
    const auto& table = byte_to_unicode();
    for (const auto& [b, e] : parts) {
      if (e == b) continue;
      std::string mapped;
      mapped.reserve(2 * (e - b));
      for (size_t i = b; i < e; ++i) mapped += table[static_cast<uint8_t>(text[i])];
      out.push_back({std::move(mapped), piece.at_start && b == 0});
    }
    return Status();
  });
}

// HF Metaspace::pre_tokenize: spaces become the replacement, which is prepended per the scheme
// ("first": only to a piece at byte 0 of the input), then the piece is split before each
// replacement (MergedWithNext) when `split`.
PreTokenizeStep make_metaspace_step(MetaspaceOptions o) {
  return [o](const PreToken& piece, std::vector<PreToken>& out) {
    std::string text;
    text.reserve(piece.text.size() + o.replacement.size());
    const bool prepend = o.prepend_scheme == MetaspaceOptions::Prepend::always ||
                         (o.prepend_scheme == MetaspaceOptions::Prepend::first && piece.at_start);
    if (prepend && piece.text[0] != ' ' && piece.text.compare(0, o.replacement.size(), o.replacement) != 0) {
      text = o.replacement;
    }
    for (char c : piece.text) {
      if (c == ' ') {
        text += o.replacement;
      } else {
        text.push_back(c);
      }
    }
    if (!o.split) {
      out.push_back({std::move(text), piece.at_start});
      return Status();
    }
    std::vector<Span> spans;
    size_t prev = 0;
    for (size_t at = text.find(o.replacement); at != std::string::npos; at = text.find(o.replacement, prev)) {
      if (at > prev) spans.push_back({prev, at, false});
      prev = at + o.replacement.size();
      spans.push_back({at, prev, true});
    }
    if (prev < text.size()) spans.push_back({prev, text.size(), false});
    emit_spans({std::move(text), piece.at_start}, behave_merged_with_next(std::move(spans)), out);
    return Status();
  };
}

Result<PreTokenizeStep> parse_metaspace(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(MetaspaceOptions o, parse_metaspace_options(j, where));
  return make_metaspace_step(std::move(o));
}

Result<std::vector<PreTokenizeStep>> parse_pre_tokenizer_steps(const nlohmann::json& j, const JsonPath& where);

Result<PreTokenizeStep> parse_pre_tokenizer_sequence(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<PreTokenizeStep> steps, parse_pre_tokenizer_steps(j, where));
  return PreTokenizeStep([steps](const PreToken& piece, std::vector<PreToken>& out) {
    std::vector<PreToken> pieces{piece}, next;
    for (const auto& step : steps) {
      next.clear();
      for (const auto& p : pieces) TESSERA_RETURN_IF_ERROR(step(p, next));
      pieces.swap(next);
    }
    for (auto& p : pieces) out.push_back(std::move(p));
    return Status();
  });
}

using PreTokenizerParser = Result<PreTokenizeStep> (*)(const nlohmann::json&, const JsonPath&);

const std::map<std::string, PreTokenizerParser>& pre_tokenizer_parsers() {
  static const std::map<std::string, PreTokenizerParser> table = {
      {"Split", parse_split},
      {"ByteLevel", parse_byte_level},
      {"Metaspace", parse_metaspace},
      {"Sequence", parse_pre_tokenizer_sequence},
  };
  return table;
}

Result<PreTokenizeStep> parse_pre_tokenizer_step(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, tokenizer_json::string_member(j, where, "type"));
  auto it = pre_tokenizer_parsers().find(type);
  if (it == pre_tokenizer_parsers().end()) {
    return unsupported_error(where / "type", fmt::format("pre-tokenizer '{}' is not supported (Split, ByteLevel, Metaspace, Sequence)", type));
  }
  return it->second(j, where);
}

// The members of a Sequence's `pretokenizers` array.
Result<std::vector<PreTokenizeStep>> parse_pre_tokenizer_steps(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* list, tokenizer_json::member(j, where, "pretokenizers"));
  if (!list->is_array()) return field_error(where / "pretokenizers", "expected an array");
  std::vector<PreTokenizeStep> steps;
  for (size_t i = 0; i < list->size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(PreTokenizeStep s, parse_pre_tokenizer_step((*list)[i], (where / "pretokenizers").at(i)));
    steps.push_back(std::move(s));
  }
  return steps;
}

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json* j, const JsonPath& where) {
  PreTokenizer p;
  if (j == nullptr || j->is_null()) return p;
  TESSERA_ASSIGN_OR_RETURN(std::string type, tokenizer_json::string_member(*j, where, "type"));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(p.steps_, parse_pre_tokenizer_steps(*j, where));
  } else {
    TESSERA_ASSIGN_OR_RETURN(PreTokenizeStep s, parse_pre_tokenizer_step(*j, where));
    p.steps_.push_back(std::move(s));
  }
  return p;
}

Status PreTokenizer::run(std::string_view text, bool at_start, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return Status();
  std::vector<PreToken> current{{std::string(text), at_start}}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (const auto& p : current) TESSERA_RETURN_IF_ERROR(step(p, next));
    current.swap(next);
  }
  pieces.reserve(current.size());
  for (auto& p : current) pieces.push_back(std::move(p.text));
  return Status();
}

}  // namespace tessera::tokenizer
