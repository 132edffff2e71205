// utf8.hpp: UTF-8 decoding and encoding by the rules of Unicode §3.9 (Table 3-7), which utf8proc
// does not expose: a bad byte sequence decodes as one "invalid character" as long as its maximal
// ill-formed subpart (the unit of U+FFFD substitution). Shared by the Jinja interpreter (Python's
// str semantics) and the tokenizer (tokenizer/unicode.hpp), which sits above it. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::jinja::utf8 {

/// One step of UTF-8 decoding.
struct Utf8Char {
  uint32_t cp = 0;    ///< The code point; meaningless when !valid.
  uint32_t len = 1;   ///< Bytes consumed (>= 1): the character, or the maximal ill-formed subpart.
  bool valid = true;  ///< False for bytes that are not well-formed UTF-8.
};

/// Decodes the character that starts at s[pos]. REQUIRES: pos < s.size().
Utf8Char decode_utf8(std::string_view s, size_t pos);

/// Appends the UTF-8 encoding of `cp`. REQUIRES: cp <= 0x10FFFF and not a surrogate.
void append_utf8(uint32_t cp, std::string& out);

}  // namespace tessera::jinja::utf8
