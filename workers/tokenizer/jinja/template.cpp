// template.cpp: jinja.hpp's Template: lex, parse and check once; render with a fresh interpreter
// each time, turning the interpreter's Error into one-line Status messages.
//
// "Exactly like transformers" is the contract of the whole component, so comments name the jinja2
// 3.1 / CPython behaviour a rule copies wherever it is not the obvious one, and
// tests/workers/tokenizer/jinja/jinja_test.cpp checks the whole against the Python original.
#include "workers/tokenizer/jinja/jinja.hpp"

#include <nlohmann/json.hpp>

#include "workers/tokenizer/jinja/internal/interp.hpp"
#include "workers/tokenizer/jinja/internal/parser.hpp"

namespace tessera::jinja {
namespace {

// One line: newlines inside the message (a raise_exception text, say) are written as "\n".
Status template_error(const std::string& source, const internal::Error& e) {
  std::string message;
  for (char c : e.message) {
    if (c == '\n') message += "\\n";
    else if (c != '\r') message.push_back(c);
  }
  if (e.line > 0) return make_error(ErrorCode::invalid_argument, "{}:{}: {}", source, e.line, message);
  return make_error(ErrorCode::invalid_argument, "{}: {}", source, message);
}

}  // namespace

Result<Template> Template::parse(std::string_view text, std::string source_name) {
  auto program = std::make_shared<internal::Program>();
  program->source_name = std::move(source_name);
  try {
    internal::Parser parser(internal::lex(text));
    program->body = parser.parse_template();
    internal::check(program->body);
  } catch (const internal::Error& e) {
    return template_error(program->source_name, e);
  }
  return Template(std::move(program));
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{}: the render context must be a JSON object, not {}", program_->source_name,
                      context.type_name());
  }
  try {
    const internal::Value vars = internal::from_json(context);
    internal::Interp interp;
    return interp.render(*program_, vars);
  } catch (const internal::Error& e) {
    return template_error(program_->source_name, e);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{}: rendering failed: {}", program_->source_name, e.what());
  }
}

Result<std::string> Template::render(const nlohmann::json& context) const { return render(nlohmann::ordered_json(context)); }

const std::string& Template::source_name() const { return program_->source_name; }

}  // namespace tessera::jinja
