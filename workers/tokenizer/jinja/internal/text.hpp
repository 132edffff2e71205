// internal/text.hpp: UTF-8 as Python str (code points), Python's whitespace and case rules, and
// repr() of floats and strings. Pure functions, defined in text.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::jinja::internal {

// Decodes the code point at s[i] and advances i. A byte that does not start well-formed UTF-8
// decodes as U+DC80+byte (Python's surrogateescape) so that encode() gives the byte back.
uint32_t decode(std::string_view s, size_t& i);
void encode(uint32_t cp, std::string& out);

using U32 = std::u32string;

U32 to_u32(std::string_view s);
std::string to_utf8(std::u32string_view s);
size_t cp_length(std::string_view s);

bool is_digit(char c);  // ASCII 0-9

// Per code point, as CPython's str methods decide.
bool py_isspace(uint32_t c);
bool py_isprintable(uint32_t c);
bool py_iscased(uint32_t c);
bool py_isupper_cp(uint32_t c);
bool py_islower_cp(uint32_t c);
uint32_t to_upper_cp(uint32_t c);
uint32_t to_lower_cp(uint32_t c);
uint32_t to_title_cp(uint32_t c);

// str.upper/lower/title/capitalize.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);

// str.strip/lstrip/rstrip: `chars` null means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string rstrip_ws(std::string_view s);
bool all_space(std::string_view s);  // non-empty and all whitespace
bool starts_with(std::string_view s, std::string_view p);
bool ends_with(std::string_view s, std::string_view p);

std::string py_float_repr(double x);    // repr() of a float
std::string py_repr_str(std::string_view s);  // repr() of a str

}  // namespace tessera::jinja::internal
