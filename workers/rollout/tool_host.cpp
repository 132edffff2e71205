// tool_host.cpp: see tool_host.hpp.
#include "workers/rollout/tool_host.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/python_child.hpp"
#include "workers/rollout/internal/leader_relay.hpp"

namespace tessera::rollout {
namespace {

using nlohmann::json;
using runtime::Clock;

// The child. verl's loader builds the tools; each request line is {"op", "items"}, answered by one
// line holding a list of per-item results.
constexpr const char* kToolScript = R"PY(
import asyncio, inspect
tool_path, interaction_path = sys.argv[1], sys.argv[2]
# The loop verl's registry builds MCP clients on is the one every batch runs on.
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
try:
    tools, interactions = {}, {}
    if tool_path:
        from verl.tools.utils.tool_registry import initialize_tools_from_config
        for tool in initialize_tools_from_config(tool_path):
            if tool.name in tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            tools[tool.name] = tool
    if interaction_path:
        from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
        interactions = initialize_interactions_from_config(interaction_path)
    schemas = {name: tool.tool_schema.model_dump() for name, tool in tools.items()}
    agent_schemas = {name: tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                     for name, tool in tools.items()}
except BaseException as e:
    send({"fatal": f"{type(e).__name__}: {e}"})
    sys.exit(1)
send({"ready": True, "schemas": schemas, "agent_schemas": agent_schemas, "interactions": list(interactions)})

def encode(answer):
    try:
        return json.dumps(encodable(answer), allow_nan=False)
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

async def interact(op, item):
    interaction = interactions[item["tool"]]
    if op == "start":
        await interaction.start_interaction(item["instance"], **item["kwargs"])
        return {}
    if op == "respond":
        end, text, reward, metrics = await interaction.generate_response(item["instance"], item["parameters"],
                                                                         **item["kwargs"])
        return {"terminate": bool(end), "text": str(text), "reward": reward, "metrics": metrics}
    # finalize: verl's base class takes no instance id, its gsm8k interaction does.
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    params = inspect.signature(interaction.finalize_interaction).parameters.values()
    if any(p.kind in positional for p in params):
        await interaction.finalize_interaction(item["instance"])
    else:
        await interaction.finalize_interaction()
    return {}

async def run(op, item):
    try:
        if op in ("start", "respond", "finalize"):
            return await interact(op, item)
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
  return options.python.empty() ? runtime::python_from_env("TESSERA_TOOL_PYTHON") : options.python;
}

}  // namespace

struct ToolHost::Child : runtime::PythonChild {};

ToolHost::ToolHost(ToolHostOptions options, std::unique_ptr<Child> child)
    : options_(std::move(options)), child_(std::move(child)) {}

ToolHost::~ToolHost() {
  if (child_ != nullptr) runtime::kill_child(*child_);
}

Result<std::unique_ptr<ToolHost>> ToolHost::start(const ToolHostOptions& options) {
  const std::string what = "actor_rollout_ref.rollout.multi_turn";
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild spawned,
                           runtime::spawn_python(interpreter(options), kToolScript,
                                                 {options.config_path, options.interaction_config_path}, what));
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
    return make_error(ErrorCode::invalid_argument, "{}: cannot load {}: {}", what, host->describe(), why);
  }
  // Re-parse the schemas in their key order: the chat template prints them with tojson.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(*line, nullptr, false);
  host->schemas_ = ordered["schemas"];
  host->agent_schemas_ = ordered.value("agent_schemas", nlohmann::ordered_json::object());
  for (const auto& name : ordered.value("interactions", nlohmann::ordered_json::array())) {
    host->interactions_.push_back(name.get<std::string>());
  }
  if (!options.config_path.empty() && host->schemas_.empty()) {
    return make_error(ErrorCode::invalid_argument, "{}.tool_config_path: '{}' defines no tools", what,
                      options.config_path);
  }
  if (!options.interaction_config_path.empty() && host->interactions_.empty()) {
    return make_error(ErrorCode::invalid_argument, "{}.interaction_config_path: '{}' defines no interactions", what,
                      options.interaction_config_path);
  }
  return host;
}

std::string ToolHost::describe() const {
  std::string out;
  if (!options_.config_path.empty()) out = "tool_config_path=" + options_.config_path;
  if (!options_.interaction_config_path.empty()) {
    out += (out.empty() ? "" : ", ") + std::string("interaction_config_path=") + options_.interaction_config_path;
  }
  return "actor_rollout_ref.rollout.multi_turn." + out;
}

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
  const bool interaction = op == "start" || op == "respond" || op == "finalize";
  for (const ToolRequest& r : requests) {
    if (interaction ? !has_interaction(r.tool) : !has_tool(r.tool)) {
      return make_error(ErrorCode::invalid_argument, "{} '{}' is not in {}", interaction ? "interaction" : "tool", r.tool,
                        describe());
    }
    items.push_back({{"tool", r.tool},
                     {"instance", r.instance},
                     {"parameters", r.parameters},
                     {"kwargs", r.kwargs},
                     {"release_kwargs", r.release_kwargs}});
  }
  const json request = {{"op", op}, {"items", std::move(items)}};
  const auto deadline = Clock::now() + options_.timeout;
  const std::string where = fmt::format("{} {} '{}' ({})", interaction ? "interaction" : "tool", op,
                                        requests.front().tool, describe());
  Status sent = runtime::write_all(*child_, request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", deadline);
  if (!sent.ok()) return fail(Status(sent.code(), fmt::format("{}: the tool process is gone: {}", where, sent.message())));
  Result<std::string> line = runtime::read_line(*child_, deadline);
  if (!line.ok()) {
    const std::string why =
        line.status().code() == ErrorCode::timeout
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
    answers[i].terminate = a.value("terminate", false);
    answers[i].reward = a.value("reward", json());
    answers[i].metrics = a.value("metrics", json());
  }
  return answers;
}

namespace {

class ToolRelay final : public ToolSet {
 public:
  ToolRelay(std::shared_ptr<collective::Communicator> group, std::unique_ptr<ToolHost> host,
            nlohmann::ordered_json schemas, nlohmann::ordered_json agent_schemas, std::vector<std::string> interactions,
            std::chrono::milliseconds timeout)
      : timeout_(timeout),
        group_(std::move(group)),
        host_(std::move(host)),
        schemas_(std::move(schemas)),
        agent_schemas_(std::move(agent_schemas)),
        interactions_(std::move(interactions)) {}

  const nlohmann::ordered_json& schemas() const override { return schemas_; }
  const nlohmann::ordered_json& agent_schemas() const override { return agent_schemas_; }
  const std::vector<std::string>& interactions() const override { return interactions_; }

  void call_best_effort(const std::string& op, const std::vector<ToolRequest>& requests) override {
    if (host_ != nullptr) (void)host_->call(op, requests);
  }

  Result<std::vector<ToolAnswer>> call(const std::string& op, const std::vector<ToolRequest>& requests) override {
    if (!broken_.ok()) return broken_;
    nlohmann::ordered_json message;
    std::vector<ToolAnswer> answers;
    if (host_ != nullptr) {
      auto got = host_->call(op, requests);
      if (got.ok()) {
        answers = std::move(got).value();
        message = nlohmann::ordered_json::array();
        for (const ToolAnswer& a : answers) {
          message.push_back({{"error", a.error},
                             {"text", a.text},
                             {"reward", a.reward},
                             {"metrics", a.metrics},
                             {"terminate", a.terminate}});
        }
      } else {
        message = internal::error_message(got.status());
      }
    }
    if (Status sent = internal::send_or_receive(*group_, message, timeout_, "the tool answers"); !sent.ok()) {
      broken_ = sent;
      return sent;
    }
    TESSERA_RETURN_IF_ERROR(internal::error_of(message));
    if (host_ != nullptr) return answers;
    if (!message.is_array() || message.size() != requests.size()) {
      broken_ = make_error(ErrorCode::internal, "rollout TP: TP rank 0 answered {} tool calls where this rank made {}",
                           message.is_array() ? message.size() : 0, requests.size());
      return broken_;
    }
    for (const auto& a : message) {
      answers.push_back({a.value("error", ""), a.value("text", ""), json::parse(a["reward"].dump()),
                         json::parse(a["metrics"].dump()), a.value("terminate", false)});
    }
    return answers;
  }

 private:
  std::chrono::milliseconds timeout_;
  std::shared_ptr<collective::Communicator> group_;
  std::unique_ptr<ToolHost> host_;  ///< Rank 0's; null on the other peers.
  Status broken_;
  nlohmann::ordered_json schemas_, agent_schemas_;
  std::vector<std::string> interactions_;
};

}  // namespace

Result<std::unique_ptr<ToolSet>> relay_tools(std::shared_ptr<collective::Communicator> tp_group,
                                             Result<std::unique_ptr<ToolHost>> leader,
                                             std::chrono::milliseconds timeout) {
  // Rank 0 may spend a whole batch timeout on the tools (and at least 5 minutes starting them).
  const auto wait = timeout + std::chrono::minutes(1);
  const auto start_wait = std::max<std::chrono::milliseconds>(timeout, std::chrono::minutes(5)) + std::chrono::minutes(1);
  const bool lead = tp_group->rank() == 0;
  std::unique_ptr<ToolHost> host;
  nlohmann::ordered_json message;
  if (lead) {
    if (leader.ok() && *leader != nullptr) {
      host = std::move(leader).value();
      message = {{"schemas", host->schemas()},
                 {"agent_schemas", host->agent_schemas()},
                 {"interactions", host->interactions()}};
    } else {
      message = internal::error_message(leader.ok() ? Status(ErrorCode::internal, "rollout TP: rank 0 has no tool host")
                                          : leader.status());
    }
  }
  TESSERA_RETURN_IF_ERROR(internal::send_or_receive(*tp_group, message, start_wait, "the tool answers"));
  TESSERA_RETURN_IF_ERROR(internal::error_of(message));
  std::vector<std::string> interactions;
  for (const auto& name : message["interactions"]) interactions.push_back(name.get<std::string>());
  return std::unique_ptr<ToolSet>(new ToolRelay(std::move(tp_group), std::move(host), message["schemas"],
                                                message["agent_schemas"], std::move(interactions), wait));
}

}  // namespace tessera::rollout
