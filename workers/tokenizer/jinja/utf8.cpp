// utf8.cpp: see utf8.hpp.
#include "workers/tokenizer/jinja/utf8.hpp"

#include <utility>

namespace tessera::jinja::utf8 {
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

}  // namespace tessera::jinja::utf8
