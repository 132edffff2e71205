// unicode.hpp: the small amount of Unicode the tokenizer needs: lenient UTF-8 decoding, lossy
// repair, White_Space, and NFC normalisation (Qwen2/Qwen3's tokenizer.json declares an NFC
// normalizer). The character data comes from utf8proc (Debian's libutf8proc). Pure functions;
// safe from any thread.
//
// Bytes that are not well-formed UTF-8 are never an error here: decode_utf8 reports them as
// invalid "characters" one maximal ill-formed subpart long (Unicode §3.9, the same unit as
// U+FFFD substitution), and nfc() passes them through unchanged, so a byte-level tokenizer can
// round-trip arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "workers/tokenizer/jinja/utf8.hpp"

namespace tessera::tokenizer::unicode {

/// UTF-8 decoding and encoding (lenient, maximal ill-formed subparts): jinja/utf8.hpp.
using jinja::utf8::append_utf8;
using jinja::utf8::decode_utf8;
using jinja::utf8::Utf8Char;

/// True when `s` is entirely well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

/// `s` with every maximal ill-formed subpart replaced by U+FFFD (Rust's from_utf8_lossy).
std::string to_valid_utf8_lossy(std::string_view s);

/// True for code points with the Unicode White_Space property (Rust's char::is_whitespace).
bool is_white_space(uint32_t cp);

/// The canonical combining class of `cp` (0 for starters and unassigned code points).
uint8_t combining_class(uint32_t cp);

/// Unicode Normalization Form C of `s` (UAX #15). Ill-formed bytes are copied unchanged and
/// act as starters that never compose.
std::string nfc(std::string_view s);

/// The Unicode version of utf8proc's character data (Debian 12: "15.0.0").
const char* unicode_version();

}  // namespace tessera::tokenizer::unicode
