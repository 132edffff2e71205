// tool_host.cpp: see tool_host.hpp.
#include "workers/rollout/tool_host.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "runtime/python_child.hpp"

namespace tessera::rollout {
namespace {

using nlohmann::json;
using runtime::Clock;

// The child. verl's loader builds the tools; each request line is {"op", "items"}, answered by one
// line holding a list of per-item results.
constexpr const char* kToolScript = R"PY(
import asyncio, math
config_path = sys.argv[1]
# The loop verl's registry builds MCP clients on is the one every batch runs on.
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
try:
    from verl.tools.utils.tool_registry import initialize_tools_from_config
    tools = {}
    for tool in initialize_tools_from_config(config_path):
        if tool.name in tools:
            raise ValueError(f"two tools are named {tool.name!r}")
        tools[tool.name] = tool
    schemas = {name: tool.tool_schema.model_dump() for name, tool in tools.items()}
    agent_schemas = {name: tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                     for name, tool in tools.items()}
except BaseException as e:
    proto.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}) + "\n")
    proto.flush()
    sys.exit(1)
proto.write(json.dumps({"ready": True, "schemas": schemas, "agent_schemas": agent_schemas}) + "\n")
proto.flush()

def plain(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    return o.item() if hasattr(o, "item") else str(o)

def finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o

def encode(answer):
    try:
        return json.dumps(finite(json.loads(json.dumps(answer, default=plain))), allow_nan=False)
    except Exception as e:
        return json.dumps({"error": f"the tool's answer cannot be sent: {type(e).__name__}: {e}"})

def text_of(response):
    if isinstance(response, str):
        return response
    if getattr(response, "image", None) or getattr(response, "video", None):
        raise ValueError("the tool answered with images or video; Tessera's rollout is text-only")
    text = getattr(response, "text", None)
    if text is None and isinstance(response, dict):
        text = response.get("text")
    return "" if text is None else str(text)

async def run(op, item):
    try:
        tool = tools[item["tool"]]
        if op == "create":
            await tool.create(item["instance"], **item["kwargs"])
            return {}
        if op == "execute":
            response, reward, metrics = await tool.execute(item["instance"], item["parameters"], **item["kwargs"])
            return {"text": text_of(response), "reward": reward, "metrics": metrics}
        if op == "release":
            await tool.release(item["instance"], **item["release_kwargs"])
            return {}
        try:
            reward = await tool.calc_reward(item["instance"], **item["kwargs"])
        finally:
            await tool.release(item["instance"], **item["release_kwargs"])
        return {"reward": reward}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}

async def batch(op, items):
    return await asyncio.gather(*[run(op, item) for item in items])

for line in requests:
    request = json.loads(line)
    answers = loop.run_until_complete(batch(request["op"], request["items"]))
    proto.write("[" + ", ".join(encode(a) for a in answers) + "]\n")
    proto.flush()
)PY";

std::string interpreter(const ToolHostOptions& options) {
  if (!options.python.empty()) return options.python;
  const char* env = std::getenv("TESSERA_TOOL_PYTHON");
  return env != nullptr && *env != '\0' ? env : "python3";
}

}  // namespace

struct ToolHost::Child : runtime::PythonChild {};

ToolHost::ToolHost(ToolHostOptions options, std::unique_ptr<Child> child)
    : options_(std::move(options)), child_(std::move(child)) {}

ToolHost::~ToolHost() {
  if (child_ != nullptr) runtime::kill_child(*child_);
}

Result<std::unique_ptr<ToolHost>> ToolHost::start(const ToolHostOptions& options) {
  const std::string what = "actor_rollout_ref.rollout.multi_turn.tool_config_path";
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild spawned,
                           runtime::spawn_python(interpreter(options), kToolScript, {options.config_path}, what));
  auto child = std::make_unique<Child>();
  static_cast<runtime::PythonChild&>(*child) = std::move(spawned);
  std::unique_ptr<ToolHost> host(new ToolHost(options, std::move(child)));
  // Importing verl and building the tools (an MCP client retries for 20 s) may outlast one batch's timeout.
  const auto startup = std::max<std::chrono::milliseconds>(options.timeout, std::chrono::minutes(5));
  Result<std::string> line = runtime::read_line(*host->child_, Clock::now() + startup);
  const json ready = line.ok() ? json::parse(*line, nullptr, false) : json();
  if (!ready.is_object() || !ready.value("ready", false) || !ready.contains("schemas")) {
    const std::string why = !line.ok() ? line.status().message()
                            : ready.is_object() && ready.contains("fatal") ? ready["fatal"].get<std::string>()
                                                                           : "unexpected output: " +
                                                                                 runtime::first_line(*line);
    return make_error(ErrorCode::invalid_argument, "{}: cannot load the tools of '{}': {}", what, options.config_path,
                      why);
  }
  // Re-parse the schemas in their key order: the chat template prints them with tojson.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(*line, nullptr, false);
  host->schemas_ = ordered["schemas"];
  host->agent_schemas_ = ordered.value("agent_schemas", nlohmann::ordered_json::object());
  if (host->schemas_.empty()) {
    return make_error(ErrorCode::invalid_argument, "{}: '{}' defines no tools", what, options.config_path);
  }
  return host;
}

bool ToolHost::has_tool(const std::string& name) const { return schemas_.contains(name); }

Status ToolHost::fail(Status why) {
  broken_ = why;
  runtime::kill_child(*child_);
  return why;
}

Result<std::vector<ToolAnswer>> ToolHost::call(const std::string& op, const std::vector<ToolRequest>& requests) {
  if (!broken_.ok()) return broken_;
  std::vector<ToolAnswer> answers(requests.size());
  if (requests.empty()) return answers;
  json items = json::array();
  for (const ToolRequest& r : requests) {
    if (!has_tool(r.tool)) {
      return make_error(ErrorCode::invalid_argument, "tool '{}' is not in {}", r.tool, options_.config_path);
    }
    items.push_back({{"tool", r.tool},
                     {"instance", r.instance},
                     {"parameters", r.parameters},
                     {"kwargs", r.kwargs},
                     {"release_kwargs", r.release_kwargs}});
  }
  const json request = {{"op", op}, {"items", std::move(items)}};
  const auto deadline = Clock::now() + options_.timeout;
  const std::string where = fmt::format("tool {} '{}' (actor_rollout_ref.rollout.multi_turn.tool_config_path={})", op,
                                        requests.front().tool, options_.config_path);
  Status sent = runtime::write_all(*child_, request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", deadline);
  if (!sent.ok()) return fail(Status(sent.code(), fmt::format("{}: the tool process is gone: {}", where, sent.message())));
  Result<std::string> line = runtime::read_line(*child_, deadline);
  if (!line.ok()) {
    const std::string why = line.status().code() == ErrorCode::timeout
                                ? fmt::format("no answer within {} s (actor_rollout_ref.rollout.engine_kwargs.tessera.tool_timeout_s)",
                                              static_cast<double>(options_.timeout.count()) / 1000.0)
                                : "the tool process exited: " + line.status().message();
    return fail(Status(line.status().code(), fmt::format("{}: {}", where, why)));
  }
  const json answer = json::parse(*line, nullptr, false);
  if (!answer.is_array() || answer.size() != requests.size()) {
    return fail(Status(ErrorCode::internal, fmt::format("{}: the tool process answered '{}'", where,
                                                        runtime::first_line(*line).substr(0, 120))));
  }
  for (size_t i = 0; i < answer.size(); ++i) {
    const json& a = answer[i];
    if (!a.is_object()) continue;
    if (a.contains("error")) {
      answers[i].error = a["error"].is_string() ? a["error"].get<std::string>() : a["error"].dump();
      continue;
    }
    if (a.contains("text") && a["text"].is_string()) answers[i].text = a["text"].get<std::string>();
    answers[i].reward = a.value("reward", json());
    answers[i].metrics = a.value("metrics", json());
  }
  return answers;
}

}  // namespace tessera::rollout
