// Native ports of verl v0.5.0's MATH, math_dapo and Search-R1 rule scorers (driver/reward_math.hpp).
//
// Note [Python strings in UTF-8]: verl's scorers work on Python str, i.e. on code points. Byte
// operations give the same answer for everything that only looks for ASCII needles (find, split,
// replace, count), so those stay on bytes; what indexes, slices or classifies characters (s[0],
// s[-300:], len(), str.lower/strip/split/isdigit, re's '.', \s, \w, \b and IGNORECASE) decodes code
// points first. A byte that is not UTF-8 is kept as one character of its own (0xDC80 + byte,
// Python's surrogateescape), which no class matches and lower() keeps.
//
// Character classes and case come from utf8proc (Unicode 15), not from tables of our own:
//   str.isspace, \s  ASCII 0x09..0x0D, 0x1C..0x20, U+0085, and categories Zs, Zl, Zp
//   str.isalnum, \w  categories L* and N* (and '_' for \w)
//   str.isdigit      category Nd
//   str.lower        utf8proc_tolower (the simple mapping), plus CPython's final-sigma rule with
//                    Case_Ignorable = Mn|Me|Cf|Lm|Sk or Word_Break MidLetter|MidNumLet|Single_Quote
//                    (17 code points, listed in py_case_ignorable) and Cased ~ Lu|Ll|Lt or has a
//                    simple case mapping
// Compared with CPython 3.11.7 (Unicode 14) once over every code point, they agree except where:
//   - Python's str.isdigit is also true for the 128 Numeric_Type=Digit characters that are not Nd:
//     superscripts ¹²³⁰⁴-⁹, subscripts ₀-₉, the circled, parenthesised and full-stop digits in
//     U+2460..2490, U+24EA..24FF, U+2776..2792 and U+1F100..1F10A, and U+1369..1371, U+19DA,
//     U+10A40..10A43, U+10E60..10E68, U+11052..1105A. utf8proc has no Numeric_Type, so for Tessera
//     they are not digits (math_dapo keeps the commas of "²,³"; verl drops them).
//   - Python's str.lower uses the full mapping of U+0130 İ, "i\u0307"; utf8proc has only the
//     simple one, "i".
//   - Python's Cased also includes ª, º (Other_Lowercase) and U+1F130..1F149, U+1F150..1F169,
//     U+1F170..1F189 (Other_Uppercase), so next to a Σ they can decide the final sigma differently.
//   - characters new in Unicode 15 (unassigned for Python 3.11) are classified and cased by utf8proc.
// tests/driver/reward_math_test.cpp checks parity with verl's Python away from these.
#include "driver/reward_math.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "workers/tokenizer/unicode.hpp"

namespace tessera::driver {
namespace {

// ---------------------------------------------------------------------------------------------
// Code points.

constexpr uint32_t kEscapedByte = 0xDC80;  // a byte that is not UTF-8: 0xDC80 + (byte - 0x80)

utf8proc_category_t category(uint32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }

// str.isspace() (also re's \s, str.strip() and str.split()): bidirectional class WS, B or S, or
// category Zs. Outside ASCII that is Zs, Zl, Zp and U+0085; in ASCII it includes U+001C..U+001F.
bool py_isspace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  if (cp == 0x85) return true;
  const utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

// str.isalnum() or '_' (re's \w and \b): categories L* and N*.
bool py_isword(uint32_t cp) {
  if (cp == '_') return true;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// str.isdigit(), approximated by category Nd (Numeric_Type=Decimal): see the Note.
bool py_isdigit(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }

// The simple lower-case mapping.
uint32_t py_lower_cp(uint32_t cp) {
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

// Case_Ignorable (UAX #44): Mn, Me, Cf, Lm, Sk, or Word_Break MidLetter, MidNumLet or Single_Quote
// (UAX #29), which utf8proc does not expose; those are the code points listed.
bool py_case_ignorable(uint32_t cp) {
  switch (cp) {
    case 0x27: case 0x2E: case 0x3A: case 0xB7: case 0x387: case 0x55F: case 0x5F4: case 0x2018: case 0x2019:
    case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
      return true;
    default:
      break;
  }
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return false;
  }
}

// Cased, approximated by Lu, Ll, Lt or having a simple case mapping (see the Note).
bool py_cased(uint32_t cp) {
  const utf8proc_category_t c = category(cp);
  if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) return true;
  const auto i = static_cast<utf8proc_int32_t>(cp);
  return utf8proc_tolower(i) != i || utf8proc_toupper(i) != i;
}

// One character of `s` at byte `pos`: its code point and byte length (lenient: a byte that does
// not start well-formed UTF-8 is one character, kEscapedByte + its value).
struct Char {
  uint32_t cp;
  size_t len;
};

Char decode(std::string_view s, size_t pos) {
  const tokenizer::unicode::Utf8Char c = tokenizer::unicode::decode_utf8(s, pos);
  if (c.valid) return {c.cp, c.len};
  return {kEscapedByte + (static_cast<unsigned char>(s[pos]) - 0x80u), 1};  // one byte at a time
}

void append_cp(uint32_t cp, std::string& out) {
  if (cp >= kEscapedByte && cp < kEscapedByte + 0x80) {
    out += static_cast<char>(cp - kEscapedByte + 0x80);  // the original byte back
    return;
  }
  tokenizer::unicode::append_utf8(cp, out);
}

std::vector<uint32_t> to_code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Char c = decode(s, i);
    out.push_back(c.cp);
    i += c.len;
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_cp(cp, out);
  return out;
}

// len(s).
size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += decode(s, i).len) ++n;
  return n;
}

// s[start:] (Python slice semantics: a negative start counts from the end).
std::string_view py_slice_from(std::string_view s, long long start) {
  const long long n = static_cast<long long>(cp_count(s));
  if (start < 0) start = std::max(0LL, start + n);
  if (start >= n) return s.substr(s.size());
  size_t i = 0;
  for (long long k = 0; k < start; ++k) i += decode(s, i).len;
  return s.substr(i);
}

// s.strip().
std::string_view py_strip(std::string_view s) {
  size_t a = 0;
  while (a < s.size()) {
    const Char c = decode(s, a);
    if (!py_isspace(c.cp)) break;
    a += c.len;
  }
  size_t b = a, end = a;  // end: just past the last non-space character
  while (b < s.size()) {
    const Char c = decode(s, b);
    b += c.len;
    if (!py_isspace(c.cp)) end = b;
  }
  return s.substr(a, end - a);
}

// s.replace(old, new) (old non-empty).
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t j; (j = s.find(old, i)) != std::string_view::npos; i = j + old.size()) {
    out.append(s.substr(i, j - i));
    out.append(repl);
  }
  out.append(s.substr(i));
  return out;
}

// s.split(sep) (sep non-empty).
std::vector<std::string_view> py_split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  size_t i = 0;
  for (size_t j; (j = s.find(sep, i)) != std::string_view::npos; i = j + sep.size()) out.push_back(s.substr(i, j - i));
  out.push_back(s.substr(i));
  return out;
}

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// ---------------------------------------------------------------------------------------------
// math.py

// math.fix_fracs; nullopt where verl raises (IndexError on a "\frac" at the very end).
std::optional<std::string> fix_fracs(const std::string& string) {
  const std::vector<std::string_view> substrs = py_split(string, "\\frac");
  std::string new_str(substrs[0]);
  for (size_t k = 1; k < substrs.size(); ++k) {
    const std::string_view substr = substrs[k];
    new_str += "\\frac";
    if (substr.empty()) return std::nullopt;  // substr[0]
    if (substr[0] == '{') {
      new_str += substr;
      continue;
    }
    const Char a = decode(substr, 0);
    if (a.len == substr.size()) return string;  // assert len(substr) >= 2 -> the input unchanged
    const Char b = decode(substr, a.len);
    const std::string_view sa = substr.substr(0, a.len), sb = substr.substr(a.len, b.len);
    const std::string_view post = substr.substr(a.len + b.len);
    new_str += "{";
    new_str += sa;
    if (sb != "{") {
      new_str += "}{";
      new_str += sb;
      new_str += "}";
    } else {
      new_str += "}";
      new_str += sb;
    }
    new_str += post;
  }
  return new_str;
}

// An ASCII decimal that int() parses and str() prints back unchanged, within CPython's default
// int_max_str_digits (4300).
bool is_canonical_int(std::string_view s) {
  const bool negative = !s.empty() && s[0] == '-';
  const std::string_view digits = s.substr(negative ? 1 : 0);
  if (digits.empty() || digits.size() > 4300) return false;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  if (digits[0] == '0') return digits.size() == 1 && !negative;  // "0"; not "00" or "-0"
  return true;
}

// math.fix_a_slash_b: "a/b" with integers a, b -> "\frac{a}{b}".
std::string fix_a_slash_b(const std::string& string) {
  const std::vector<std::string_view> parts = py_split(string, "/");
  if (parts.size() != 2) return string;
  // verl: int(a), int(b), then assert string == "{}/{}".format(a, b).
  if (!is_canonical_int(parts[0]) || !is_canonical_int(parts[1])) return string;
  return "\\frac{" + std::string(parts[0]) + "}{" + std::string(parts[1]) + "}";
}

// math.remove_right_units; nullopt where verl's assertion fails (two "\text{ ").
std::optional<std::string> remove_right_units(const std::string& string) {
  if (!contains(string, "\\text{ ")) return string;
  const std::vector<std::string_view> splits = py_split(string, "\\text{ ");
  if (splits.size() != 2) return std::nullopt;
  return std::string(splits[0]);
}

// math.fix_sqrt; nullopt where verl raises (IndexError on a "\sqrt" at the very end).
std::optional<std::string> fix_sqrt(const std::string& string) {
  if (!contains(string, "\\sqrt")) return string;
  const std::vector<std::string_view> splits = py_split(string, "\\sqrt");
  std::string new_string(splits[0]);
  for (size_t k = 1; k < splits.size(); ++k) {
    const std::string_view split = splits[k];
    if (split.empty()) return std::nullopt;  // split[0]
    if (split[0] != '{') {
      const size_t a = decode(split, 0).len;
      new_string += "\\sqrt{";
      new_string += split.substr(0, a);
      new_string += "}";
      new_string += split.substr(a);
    } else {
      new_string += "\\sqrt";
      new_string += split;
    }
  }
  return new_string;
}

// ---------------------------------------------------------------------------------------------
// math_dapo.py

// From `idx` to the '}' that closes the first '{' after it (verl's brace-counting loop, shared by
// math.py and math_dapo.py), or nullopt when the braces never balance.
std::optional<std::string> through_balanced_brace(std::string_view string, size_t idx) {
  int open = 0;
  for (size_t i = idx; i < string.size(); ++i) {
    if (string[i] == '{') ++open;
    if (string[i] == '}' && --open == 0) return std::string(string.substr(idx, i + 1 - idx));
  }
  return std::nullopt;
}

// math_dapo.last_boxed_only_string: the last "\boxed{...}" with balanced braces.
std::optional<std::string> dapo_last_boxed_only_string(std::string_view string) {
  const size_t idx = string.rfind("\\boxed{");
  if (idx == std::string_view::npos) return std::nullopt;
  return through_balanced_brace(string, idx);
}

// The end of the line holding byte `i` (the next '\n', or the end): re's '.' stops there.
size_t line_end(std::string_view s, size_t i) { return std::min(s.find('\n', i), s.size()); }

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s): every line with two '$' becomes the text
// between its first two, within '$'.
std::string sub_dollars(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t end = line_end(s, i);
    const std::string_view line = s.substr(i, end - i);
    const size_t a = line.find('$');
    const size_t b = a == std::string_view::npos ? a : line.find('$', a + 1);
    if (b != std::string_view::npos) {
      out += '$';
      out += line.substr(a + 1, b - a - 1);
      out += '$';
    } else {
      out += line;
    }
    if (end == s.size()) break;
    out += '\n';
    i = end + 1;
  }
  return out;
}

// re.sub(r"(<prefix>)(.*?)(\})", "\\2", s), or with (.*) when `greedy`.
std::string sub_braced(std::string_view s, std::string_view prefix, bool greedy) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (starts_with(s.substr(i), prefix)) {
      const size_t body = i + prefix.size();
      const std::string_view rest = s.substr(body, line_end(s, body) - body);
      const size_t close = greedy ? rest.rfind('}') : rest.find('}');
      if (close != std::string_view::npos) {
        out += rest.substr(0, close);
        i = body + close + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s) (two_args) or re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s).
std::string sub_shorthand(std::string_view s, std::string_view name, bool two_args) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (starts_with(s.substr(i), name) && i + name.size() < s.size() && s[i + name.size()] != '{') {
      const size_t p2 = i + name.size();
      const Char c2 = decode(s, p2);  // [^{]: any character, '\n' included
      if (!two_args) {
        out += name;
        out += '{';
        out += s.substr(p2, c2.len);
        out += '}';
        i = p2 + c2.len;
        continue;
      }
      const size_t p3 = p2 + c2.len;
      if (p3 < s.size() && s[p3] != '\n') {  // '.': any character but '\n'
        const Char c3 = decode(s, p3);
        out += name;
        out += '{';
        out += s.substr(p2, c2.len);
        out += "}{";
        out += s.substr(p3, c3.len);
        out += '}';
        i = p3 + c3.len;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// re.findall(r"(?i)Answer\s*:\s*([^\n]+)", s).
std::vector<std::string_view> find_answer_lines(std::string_view s) {
  std::vector<std::string_view> found;
  constexpr std::string_view kWord = "answer";
  size_t i = 0;
  while (i < s.size()) {
    // IGNORECASE: each letter also matches its upper case, and 's' the long s U+017F.
    size_t j = i;
    bool ok = true;
    for (char want : kWord) {
      if (j >= s.size()) {
        ok = false;
        break;
      }
      const Char c = decode(s, j);
      ok = c.cp == static_cast<uint32_t>(want) || c.cp + 32 == static_cast<uint32_t>(want) || (want == 's' && c.cp == 0x17F);
      if (!ok) break;
      j += c.len;
    }
    auto skip_spaces = [&](size_t k, std::vector<size_t>* starts) {
      while (k < s.size()) {
        const Char c = decode(s, k);
        if (!py_isspace(c.cp)) break;
        if (starts != nullptr) starts->push_back(k);
        k += c.len;
      }
      return k;
    };
    if (ok) {
      j = skip_spaces(j, nullptr);
      ok = j < s.size() && s[j] == ':';
    }
    if (ok) {
      std::vector<size_t> spaces;
      size_t k = skip_spaces(j + 1, &spaces);
      if (k == s.size()) {
        // ([^\n]+) needs a character: \s* gives back spaces until one is not '\n'.
        k = std::string_view::npos;
        for (auto it = spaces.rbegin(); it != spaces.rend(); ++it) {
          if (s[*it] != '\n') {
            k = *it;
            break;
          }
        }
      }
      if (k != std::string_view::npos) {
        const size_t end = line_end(s, k);
        found.push_back(s.substr(k, end - k));
        i = end;
        continue;
      }
    }
    ++i;
  }
  return found;
}

// ---------------------------------------------------------------------------------------------
// search_r1_like_qa_em.py

// str.lower(): utf8proc's simple lower-case mapping with the final-sigma rule (see the Note).
std::vector<uint32_t> py_lower(const std::vector<uint32_t>& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const uint32_t cp = s[i];
    if (cp == 0x3A3) {
      // CPython's handle_capital_sigma: final after a cased letter (case-ignorables skipped)
      // unless another cased letter follows.
      size_t j = i;
      while (j > 0 && py_case_ignorable(s[j - 1])) --j;
      bool final_sigma = j > 0 && py_cased(s[j - 1]);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < s.size() && py_case_ignorable(s[k])) ++k;
        final_sigma = k == s.size() || !py_cased(s[k]);
      }
      out.push_back(final_sigma ? 0x3C2 : 0x3C3);
    } else {
      out.push_back(py_lower_cp(cp));
    }
  }
  return out;
}

bool is_ascii_punctuation(uint32_t cp) {  // string.punctuation
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}

// re.sub(r"\b(a|an|the)\b", " ", text).
std::vector<uint32_t> remove_articles(const std::vector<uint32_t>& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto word_at = [&](size_t i) { return i < s.size() && py_isword(s[i]); };
  size_t i = 0;
  while (i < s.size()) {
    if (i == 0 || !py_isword(s[i - 1])) {
      size_t len = 0;
      for (std::u32string_view article : {U"a", U"an", U"the"}) {
        if (i + article.size() <= s.size() && std::equal(article.begin(), article.end(), s.begin() + i) &&
            !word_at(i + article.size())) {
          len = article.size();
          break;
        }
      }
      if (len > 0) {
        out.push_back(' ');
        i += len;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// math.py

std::optional<std::string> math_last_boxed_only_string(std::string_view string) {
  size_t idx = string.rfind("\\boxed");
  if (contains(string, "\\boxed ")) {
    // "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    const std::string_view tail = string.substr(string.rfind("\\boxed ") + 7);
    return "\\boxed " + std::string(tail.substr(0, tail.find('$')));
  }
  if (idx == std::string_view::npos) {
    idx = string.rfind("\\fbox");
    if (idx == std::string_view::npos) return std::nullopt;
  }
  return through_balanced_brace(string, idx);
}

std::optional<std::string> math_remove_boxed(std::string_view s) {
  if (contains(s, "\\boxed ")) {
    if (!starts_with(s, "\\boxed ")) return std::nullopt;
    return std::string(s.substr(7));
  }
  if (!starts_with(s, "\\boxed{") || s.back() != '}') return std::nullopt;
  return std::string(s.substr(7, s.size() - 8));
}

std::optional<std::string> math_strip_string(std::string_view input) {
  std::string string = py_replace(input, "\n", "");  // linebreaks
  string = py_replace(string, "\\!", "");            // inverse spaces
  string = py_replace(string, "\\\\", "\\");
  string = py_replace(string, "tfrac", "frac");
  string = py_replace(string, "dfrac", "frac");
  string = py_replace(string, "\\left", "");
  string = py_replace(string, "\\right", "");
  string = py_replace(string, "^{\\circ}", "");  // degrees
  string = py_replace(string, "^\\circ", "");
  string = py_replace(string, "\\$", "");  // dollar signs
  std::optional<std::string> units = remove_right_units(string);
  if (!units) return std::nullopt;
  string = py_replace(*units, "\\%", "");  // percentage (verl's "\%" is the same two characters)
  string = py_replace(string, " .", " 0.");
  string = py_replace(string, "{.", "{0.");
  if (string.empty()) return string;
  if (string[0] == '.') string = "0" + string;
  // "k = " or "q = " at the beginning
  const std::vector<std::string_view> eq = py_split(string, "=");
  if (eq.size() == 2 && cp_count(eq[0]) <= 2) string = std::string(eq[1]);
  std::optional<std::string> sqrt = fix_sqrt(string);
  if (!sqrt) return std::nullopt;
  string = py_replace(*sqrt, " ", "");
  std::optional<std::string> fracs = fix_fracs(string);
  if (!fracs) return std::nullopt;
  string = std::move(*fracs);
  if (string == "0.5") string = "\\frac{1}{2}";
  return fix_a_slash_b(string);
}

bool math_is_equiv(std::string_view a, std::string_view b) {
  std::optional<std::string> sa = math_strip_string(a), sb = math_strip_string(b);
  if (!sa || !sb) return a == b;  // verl: except Exception: return str1 == str2
  return *sa == *sb;
}

double math_compute_score(std::string_view solution, std::string_view ground_truth) {
  std::optional<std::string> boxed = math_last_boxed_only_string(solution);
  if (!boxed) return 0.0;
  std::optional<std::string> answer = math_remove_boxed(*boxed);
  if (!answer) return 0.0;  // verl prints the AssertionError and scores 0
  return math_is_equiv(*answer, ground_truth) ? 1.0 : 0.0;
}

// ---------------------------------------------------------------------------------------------
// math_dapo.py

std::string math_dapo_normalize_final_answer(std::string_view answer) {
  // SUBSTITUTIONS, then REMOVED_EXPRESSIONS, in verl's order.
  static constexpr std::string_view kSubstitutions[][2] = {
      {"an ", ""},  {"a ", ""},   {".$", "$"},  {"\\$", ""}, {"\\ ", ""}, {" ", ""}, {"mbox", "text"},
      {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"},
  };
  static constexpr std::string_view kRemoved[] = {
      "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
      "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
      "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
      "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
      ",\\!", "{,}", "\"", "\\dots",
  };
  const size_t eq = answer.rfind('=');  // final_answer.split("=")[-1]
  std::string s(eq == std::string_view::npos ? answer : answer.substr(eq + 1));
  for (const auto& sub : kSubstitutions) s = py_replace(s, sub[0], sub[1]);
  for (std::string_view expr : kRemoved) s = py_replace(s, expr, "");
  // Extract and normalise LaTeX math.
  s = sub_dollars(s);
  s = sub_braced(s, "\\text{", false);
  s = sub_braced(s, "\\textbf{", false);
  s = sub_braced(s, "\\overline{", false);
  s = sub_braced(s, "\\boxed{", true);
  // Shorthand TeX: \fracab -> \frac{a}{b}, \sqrta -> \sqrt{a}.
  s = sub_shorthand(s, "frac", true);
  s = sub_shorthand(s, "sqrt", false);
  s = py_replace(s, "$", "");
  // Numbers: "1,000" -> "1000" (str.isdigit: any Unicode digit).
  const std::string no_commas = py_replace(s, ",", "");
  bool digits = !no_commas.empty();
  for (size_t i = 0; digits && i < no_commas.size();) {
    const Char c = decode(no_commas, i);
    digits = py_isdigit(c.cp);
    i += c.len;
  }
  if (digits) s = no_commas;
  return std::string(py_strip(s));
}

nlohmann::json math_dapo_compute_score(std::string_view solution, std::string_view ground_truth,
                                       bool strict_box_verify, std::optional<long long> pause_tokens_last_index) {
  solution = py_slice_from(solution, -300);  // the longest MATH-500 answer has 159 characters
  if (strict_box_verify) {  // is_correct_strict_box
    const std::string_view pred = py_slice_from(solution, pause_tokens_last_index ? *pause_tokens_last_index - 100 : -100);
    const std::optional<std::string> boxed = dapo_last_boxed_only_string(pred);
    nlohmann::json extracted = nullptr;
    if (boxed) extracted = boxed->substr(7, boxed->size() - 8);  // remove_boxed
    const bool correct = boxed && extracted.get_ref<const std::string&>() == ground_truth;
    return {{"score", correct ? 1.0 : -1.0}, {"acc", correct}, {"pred", std::move(extracted)}};
  }
  // is_correct_minerva
  const std::vector<std::string_view> found = find_answer_lines(solution);
  const std::string pred = math_dapo_normalize_final_answer(found.empty() ? std::string_view("[INVALID]") : found.back());
  const bool correct = pred == math_dapo_normalize_final_answer(ground_truth);
  return {{"score", correct ? 1.0 : -1.0}, {"acc", correct}, {"pred", pred}};
}

// ---------------------------------------------------------------------------------------------
// search_r1_like_qa_em.py

std::string search_r1_normalize_answer(std::string_view s) {
  // white_space_fix(remove_articles(remove_punc(lower(s))))
  std::vector<uint32_t> text = py_lower(to_code_points(s));
  text.erase(std::remove_if(text.begin(), text.end(), is_ascii_punctuation), text.end());
  text = remove_articles(text);
  std::vector<uint32_t> joined;  // " ".join(text.split())
  for (size_t i = 0; i < text.size();) {
    if (py_isspace(text[i])) {
      ++i;
      continue;
    }
    if (!joined.empty()) joined.push_back(' ');
    while (i < text.size() && !py_isspace(text[i])) joined.push_back(text[i++]);
  }
  return from_code_points(joined);
}

std::optional<std::string> search_r1_extract_solution(std::string_view solution) {
  // re.finditer(r"<answer>(.*?)</answer>", solution, re.DOTALL): the last match, stripped.
  std::optional<std::string_view> last;
  for (size_t i = 0;;) {
    const size_t open = solution.find("<answer>", i);
    if (open == std::string_view::npos) break;
    const size_t close = solution.find("</answer>", open + 8);
    if (close == std::string_view::npos) break;
    last = solution.substr(open + 8, close - open - 8);
    i = close + 9;
  }
  if (!last) return std::nullopt;
  return std::string(py_strip(*last));
}

std::optional<double> search_r1_compute_score(std::string_view solution, const nlohmann::json& ground_truth,
                                              double format_score, double score) {
  const std::optional<std::string> answer = search_r1_extract_solution(solution);
  if (!answer) return 0.0;
  if (!ground_truth.is_object() || !ground_truth.contains("target")) return std::nullopt;  // ground_truth["target"]
  const nlohmann::json& target = ground_truth["target"];
  // em_check: a string target is a list of one.
  const nlohmann::json targets = target.is_string() ? nlohmann::json::array({target}) : target;
  if (!targets.is_array()) return std::nullopt;
  const std::string prediction = search_r1_normalize_answer(*answer);
  bool match = false;
  for (const nlohmann::json& golden : targets) {
    if (!golden.is_string()) return std::nullopt;  // verl: golden_answer.lower() raises
    if (search_r1_normalize_answer(golden.get_ref<const std::string&>()) == prediction) {
      match = true;
      break;
    }
  }
  if (!match) return format_score;
  // count_answer_tags: many tags score a quarter (verl: "prevent output a lot of </answer>").
  size_t opening = 0, closing = 0;
  for (size_t i = 0; (i = solution.find("<answer>", i)) != std::string_view::npos; i += 8) ++opening;
  for (size_t i = 0; (i = solution.find("</answer>", i)) != std::string_view::npos; i += 9) ++closing;
  return opening > 10 || closing > 10 ? score / 4 : score;
}

}  // namespace tessera::driver
