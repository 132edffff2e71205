// internal/ops.hpp: Python's operators as jinja2 compiles them (operators.cpp): arithmetic with
// 64-bit ints that refuse to wrap, comparisons, `in`, slicing, and Markup's escaping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

// a - b; fails instead of wrapping (Python ints are unbounded; Tessera's are 64-bit).
int64_t sub64(int64_t a, int64_t b);

// l <op> r for + - * / // % **.
Value binary_op(std::string_view op, const Value& l, const Value& r);

// l <op> r for == != < <= > >= in notin.
bool compare_op(std::string_view op, const Value& l, const Value& r);

// a < b (Python); fails for unordered type pairs. `op` names the operator in that error.
bool py_less(const Value& a, const Value& b, std::string_view op = "<");

// `item in container`.
bool contains(const Value& container, const Value& item);

// obj[start:stop:step] for str, list and tuple.
Value slice_of(const Value& obj, const Value& start, const Value& stop, const Value& step);

// markupsafe.escape's replacements.
std::string html_escape(std::string_view s);

// markupsafe.escape(v) for a string argument of a Markup operation (other values pass).
Value escape_arg(const Value& v);

}  // namespace tessera::jinja::internal
