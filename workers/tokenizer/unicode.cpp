// unicode.cpp: UTF-8 validity and lossy repair (on jinja/utf8.hpp's decoder), and the Unicode
// Character Database through utf8proc: NFC, combining classes and the White_Space property.
#include "workers/tokenizer/unicode.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

namespace tessera::tokenizer::unicode {
namespace {

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
