// jinja.hpp: a small Jinja interpreter for HF chat templates, rendering them byte for byte the way
// transformers' `apply_chat_template` does (jinja2 3.1 in an ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension; keep_trailing_newline off).
//
// The subset is what real chat templates use (Qwen2.5/Qwen3, Llama 3.x, Mistral, Gemma,
// DeepSeek-R1 distills): text with `{{ }}`, `{% %}` and `{# #}` and `-`/`+` whitespace control;
// if/elif/else, for (loop.*, `else`, tuple targets, `for x in xs if cond`), set (plain, tuple,
// `ns.attr`, block), macro/call, filter blocks, break/continue, with, raw, transformers'
// `generation` tag; Python-semantics expressions (literals, attribute/item access, slices, calls,
// arithmetic, comparisons, `in`, `is` tests, `~`, conditional expressions); jinja2's built-in
// filters and tests that templates use; str/dict/list methods; and the globals transformers adds:
// raise_exception(msg), strftime_now(fmt), namespace(...), dict(...), range(...).
// Undefined values behave like jinja2's default Undefined: they print as "", are falsy and
// iterate as empty, and raise "'x' is undefined" when an attribute, item or operator is applied.
//
// Not supported (they fail to parse, naming the tag or filter and the line): template inheritance
// and loading (extends/block/include/import/from; transformers' environment has no loader, so
// include, extends and import fail there too, when rendered), autoescape, recursive loops, and the
// rarely used filters (urlize, xmlattr, pprint, striptags, ...). Known differences from jinja2 are
// listed in tests/workers/tokenizer/chat_templates/README.md.
//
// Strings are UTF-8 and behave as Python str: length, indexing and slicing count code points.
//
// The implementation (internal/, one file per concern: lexer, parser, interpreter, operators,
// methods, filters, tests, globals) is private to this component.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "proto/status.hpp"

namespace tessera::jinja {

namespace internal {
struct Program;
}  // namespace internal

/// A parsed template. Immutable after parse(): copies share the parsed form, and render() may be
/// called from any thread.
class Template {
 public:
  /// Parses `text`. A syntax error is invalid_argument with one line naming the template and
  /// line: "<source_name>:<line>: <what jinja2 would report>".
  static Result<Template> parse(std::string_view text, std::string source_name = "<template>");

  /// Renders with `context` as the template's variables (a JSON object: messages, tools,
  /// add_generation_prompt, bos_token, ... and any extra kwargs). Objects keep their key order,
  /// as Python dicts do, which `tojson` and `.items()` show. A template that raises
  /// (raise_exception, a misused undefined, a type error) is invalid_argument with one line:
  /// "<source_name>:<line>: <message>", where the message is jinja2's (raise_exception's text).
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  /// Same as above for a `nlohmann::json` context. Its objects are sorted by key, so dict
  /// iteration and `tojson` output follow key order rather than the caller's order.
  Result<std::string> render(const nlohmann::json& context) const;

  /// The name given to parse(), used in error messages.
  const std::string& source_name() const;

 private:
  explicit Template(std::shared_ptr<const internal::Program> program) : program_(std::move(program)) {}

  std::shared_ptr<const internal::Program> program_;
};

}  // namespace tessera::jinja
