// unicode.cpp: UTF-8 decoding (the maximal-subpart rule of Unicode §3.9, which utf8proc does not
// expose), and the Unicode Character Database through utf8proc: NFC, combining classes and the
// White_Space property.
#include "workers/tokenizer/unicode.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

namespace tessera::tokenizer::unicode {
namespace {

bool in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

// Allowed range of the second byte after lead byte `lead` (Unicode §3.9, Table 3-7).
std::pair<uint8_t, uint8_t> second_byte_range(uint8_t lead) {
  if (lead == 0xE0) return {0xA0, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {0x80, 0xBF};
}

// NFC of well-formed `s` through utf8proc.
void append_nfc(std::string_view s, std::string& out) {
  if (s.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {  // only on allocation failure: the input is well-formed by construction
    std::free(mapped);
    throw std::bad_alloc();
  }
  out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
}

}  // namespace

Utf8Char decode_utf8(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {b0, 1, true};
  int need = in(b0, 0xC2, 0xDF) ? 1 : in(b0, 0xE0, 0xEF) ? 2 : in(b0, 0xF0, 0xF4) ? 3 : -1;
  if (need < 0) return {0, 1, false};
  uint32_t cp = b0 & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
  auto [lo, hi] = second_byte_range(b0);
  uint32_t len = 1;
  for (int k = 0; k < need; ++k) {
    if (pos + len >= s.size()) return {0, len, false};
    const auto b = static_cast<uint8_t>(s[pos + len]);
    if (!in(b, lo, hi)) return {0, len, false};
    cp = (cp << 6) | (b & 0x3F);
    ++len;
    lo = 0x80;
    hi = 0xBF;
  }
  return {cp, len, true};
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = decode_utf8(s, pos);
    if (!c.valid) return false;
    pos += c.len;
  }
  return true;
}

std::string to_valid_utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = decode_utf8(s, pos);
    if (c.valid) {
      out.append(s.substr(pos, c.len));
    } else {
      append_utf8(0xFFFD, out);
    }
    pos += c.len;
  }
  return out;
}

bool is_white_space(uint32_t cp) {
  // White_Space is exactly the separators (Zs, Zl, Zp) plus the controls TAB..CR and NEL.
  if (cp <= 0x20 || cp == 0x85) return cp == 0x20 || cp == 0x85 || (cp >= 0x09 && cp <= 0x0D);
  if (cp > 0x10FFFF) return false;
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

uint8_t combining_class(uint32_t cp) {
  if (cp > 0x10FFFF) return 0;
  return static_cast<uint8_t>(utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class);
}

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<uint8_t>(ch) < 0x80; })) {
    return std::string(s);
  }
  // Ill-formed bytes are starters that never compose, so the well-formed runs between them
  // normalise independently and the bytes are copied as they are.
  std::string out;
  out.reserve(s.size());
  size_t run = 0;
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = decode_utf8(s, pos);
    if (!c.valid) {
      append_nfc(s.substr(run, pos - run), out);
      out.append(s.substr(pos, c.len));
      run = pos + c.len;
    }
    pos += c.len;
  }
  append_nfc(s.substr(run), out);
  return out;
}

const char* unicode_version() { return utf8proc_unicode_version(); }

}  // namespace tessera::tokenizer::unicode
