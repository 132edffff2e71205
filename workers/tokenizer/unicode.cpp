// unicode.cpp: UTF-8 decoding and NFC. NFC follows UAX #15 literally: full canonical
// decomposition, canonical ordering of non-starter runs, then canonical composition, with the
// Hangul syllable arithmetic of Unicode §3.12. The tables are in unicode_tables.cpp.
#include "workers/tokenizer/unicode.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "workers/tokenizer/unicode_tables.hpp"

namespace tessera::tokenizer::unicode {
namespace {

namespace tables = unicode_tables;

// Ill-formed bytes travel through NFC as these out-of-range "code points".
constexpr uint32_t kRawByteBase = 0x110000;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

bool in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

// Allowed range of the second byte after lead byte `lead` (Unicode 14 Table 3-7).
std::pair<uint8_t, uint8_t> second_byte_range(uint8_t lead) {
  if (lead == 0xE0) return {0xA0, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {0x80, 0xBF};
}

const tables::CanonicalDecomposition* find_decomposition(uint32_t cp) {
  const auto* begin = tables::kCanonicalDecompositions;
  const auto* end = begin + tables::kCanonicalDecompositionCount;
  const auto* it = std::lower_bound(begin, end, cp, [](const auto& d, uint32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

void decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* d = cp < 0xC0 ? nullptr : find_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose_into(d->first, out);
  if (d->second != 0) decompose_into(d->second, out);
}

// Sorted (first << 32 | second) -> composite, for primary composites only.
const std::vector<std::pair<uint64_t, uint32_t>>& composition_table() {
  static const std::vector<std::pair<uint64_t, uint32_t>> table = [] {
    std::vector<std::pair<uint64_t, uint32_t>> t;
    for (size_t i = 0; i < tables::kCanonicalDecompositionCount; ++i) {
      const auto& d = tables::kCanonicalDecompositions[i];
      if (d.composes) t.emplace_back((uint64_t{d.first} << 32) | d.second, d.cp);
    }
    std::sort(t.begin(), t.end());
    return t;
  }();
  return table;
}

// The primary composite of (a, b), or 0 when there is none.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& t = composition_table();
  const uint64_t key = (uint64_t{a} << 32) | b;
  auto it = std::lower_bound(t.begin(), t.end(), key, [](const auto& e, uint64_t k) { return e.first < k; });
  return (it != t.end() && it->first == key) ? it->second : 0;
}

uint8_t ccc_of(uint32_t cp) { return cp >= kRawByteBase ? 0 : combining_class(cp); }

// Canonical ordering: stable-sort each run of non-starters by combining class.
void canonical_order(std::vector<uint32_t>& cps) {
  size_t i = 0;
  while (i < cps.size()) {
    if (ccc_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc_of(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](uint32_t a, uint32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
}

// Canonical composition (UAX #15 §1.3, the reference algorithm), in place.
void canonical_compose(std::vector<uint32_t>& cps) {
  if (cps.empty()) return;
  size_t starter = 0;
  int last_class = ccc_of(cps[0]) == 0 ? 0 : 256;
  size_t out = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const int cls = ccc_of(c);
    const uint32_t composite =
        (cps[starter] < kRawByteBase && c < kRawByteBase) ? compose_pair(cps[starter], c) : 0;
    if (composite != 0 && (last_class < cls || last_class == 0)) {
      cps[starter] = composite;
      continue;
    }
    if (cls == 0) starter = out;
    last_class = cls;
    cps[out++] = c;
  }
  cps.resize(out);
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
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = tables::kCombiningClassRuns;
  const auto* end = begin + tables::kCombiningClassRunCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t c, const auto& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<uint8_t>(ch) < 0x80; })) {
    return std::string(s);
  }
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = decode_utf8(s, pos);
    if (c.valid) {
      decompose_into(c.cp, cps);
    } else {
      for (uint32_t k = 0; k < c.len; ++k) cps.push_back(kRawByteBase + static_cast<uint8_t>(s[pos + k]));
    }
    pos += c.len;
  }
  canonical_order(cps);
  canonical_compose(cps);
  std::string out;
  out.reserve(s.size());
  for (uint32_t cp : cps) {
    if (cp >= kRawByteBase) {
      out.push_back(static_cast<char>(cp - kRawByteBase));
    } else {
      append_utf8(cp, out);
    }
  }
  return out;
}

const char* unicode_version() { return tables::kUnicodeVersion; }

}  // namespace tessera::tokenizer::unicode
