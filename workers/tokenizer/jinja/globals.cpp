// globals.cpp: jinja2's range/dict/namespace and transformers' raise_exception/strftime_now.
#include <cstdio>
#include <ctime>
#include <vector>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/interp.hpp"

namespace tessera::jinja::internal {
namespace {

Dict dict_from_args(const char* fn, const CallArgs& a) {
  Dict d;
  if (a.pos.size() > 1) fail(fmt::format("{} expected at most 1 argument, got {}", fn, a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.kind == Kind::dict) {
      d = *src.dict;
    } else {
      for (const auto& pair : iterate(src)) {
        const ValueList kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& kw : a.kw) d.set(Value::string(kw.first), kw.second);
  return d;
}

std::string strftime_now(const std::string& format) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const time_t now = ts.tv_sec;
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string f;  // datetime.strftime handles %f itself
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] == '%' && k + 1 < format.size() && format[k + 1] == 'f') {
      char us[24];
      std::snprintf(us, sizeof us, "%06ld", static_cast<long>(ts.tv_nsec / 1000));
      f += us;
      ++k;
    } else if (format[k] == '%' && k + 1 < format.size() && format[k + 1] == '%') {
      f += "%%";
      ++k;
    } else {
      f.push_back(format[k]);
    }
  }
  if (f.empty()) return "";
  std::vector<char> buf(256 + f.size() * 4);
  while (true) {
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0 || buf.size() > 65536) return std::string(buf.data(), n);
    buf.resize(buf.size() * 4);
  }
}

}  // namespace

void add_globals(Scope& g) {
  g.set("range", Value::function("range", [](Interp&, CallArgs& a) {
    if (!a.kw.empty()) fail("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) fail(fmt::format("range expected at most 3 arguments, got {}", a.pos.size()));
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) stop = int_arg(a.pos[0], "range");
    else start = int_arg(a.pos[0], "range"), stop = int_arg(a.pos[1], "range");
    if (a.pos.size() == 3) step = int_arg(a.pos[2], "range");
    if (step == 0) fail("range() arg 3 must not be zero");
    return make_range(start, stop, step);
  }));
  g.set("dict", Value::function("dict", [](Interp&, CallArgs& a) { return Value::make_dict(dict_from_args("dict", a)); }));
  g.set("namespace", Value::function("namespace", [](Interp& in, CallArgs& a) {
    Value v;
    v.kind = Kind::ns;
    v.ns = std::make_shared<Namespace>();
    in.track(v.ns);
    v.ns->attrs = dict_from_args("dict", a);
    for (const auto& kv : v.ns->attrs.items) if (kv.first.kind == Kind::string) Interp::check_namespace_name(kv.first.s);
    return v;
  }));
  g.set("raise_exception", Value::function("raise_exception", [](Interp&, CallArgs& a) -> Value {
    fail(to_str(bind("raise_exception", a, {"message"})[0]));
  }));
  g.set("strftime_now", Value::function("strftime_now", [](Interp&, CallArgs& a) {
    return Value::string(strftime_now(str_arg(bind("strftime_now", a, {"format"})[0], "strftime")));
  }));
}

}  // namespace tessera::jinja::internal
