// agent_host.cpp: see agent_host.hpp.
#include "workers/rollout/agent_host.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/python_child.hpp"
#include "workers/rollout/internal/leader_relay.hpp"

namespace tessera::rollout {
namespace {

using nlohmann::json;
using runtime::Clock;

constexpr const char* kKey = "actor_rollout_ref.rollout.agent.agent_loop_config_path";

// The child: verl's AgentLoopWorker without Ray, its server manager a bridge to the parent.
constexpr const char* kAgentScript = R"PY(
import asyncio, concurrent.futures, contextvars
spec = json.loads(requests.readline())
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)

try:
    import hydra
    from omegaconf import OmegaConf
    import verl.experimental.agent_loop  # registers verl's single_turn_agent and tool_agent
    from verl.experimental.agent_loop import agent_loop as verl_loops
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local
    from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
    config = OmegaConf.create(spec["config"])
    tokenizer = hf_tokenizer(copy_to_local(spec["tokenizer_path"]), trust_remote_code=True)
    entries = OmegaConf.load(spec["agent_loop_config_path"])
    for entry in entries:
        if not isinstance(entry.get("name"), str) or not isinstance(entry.get("_target_"), str):
            raise ValueError(f"each entry needs a string name and _target_, got {entry}")
        verl_loops._agent_loop_registry[entry.name] = entry
    trace = config.actor_rollout_ref.rollout.get("trace", None) or {}
    RolloutTraceConfig.init(config.trainer.project_name, config.trainer.experiment_name, trace.get("backend"),
                            trace.get("token2text", False))
except BaseException as e:
    send({"fatal": f"{type(e).__name__}: {e}"})
    sys.exit(1)
send({"ready": True, "agents": list(verl_loops._agent_loop_registry), "defined": [e.name for e in entries]})

current_row = contextvars.ContextVar("tessera_row", default=None)
reader = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # the pipe, apart from the loops' executor

class ServerManager:
    """verl's AsyncLLMServerManager for the loops: generate() requests become Tessera engine calls."""

    def __init__(self):
        self.pending, self.live, self.wake, self.since = [], 0, asyncio.Event(), None
        self.rows = {}  # request_id -> row, for calls from threads that lost the row's context

    @rollout_trace_op
    async def generate(self, request_id, *, prompt_ids, sampling_params):
        row = current_row.get()
        if row is None:
            row = self.rows.get(request_id)
        if row is None:
            raise RuntimeError("server_manager.generate was called outside an agent loop's run()")
        self.rows[request_id] = row
        request = encodable({"row": row, "prompt_ids": [int(t) for t in prompt_ids],
                             "sampling_params": dict(sampling_params)})
        future = asyncio.get_running_loop().create_future()
        if not self.pending:
            self.since = loop.time()
        self.pending.append((request, future))
        self.wake.set()
        return await future

def output_of(out):
    metrics = out.metrics.model_dump() if hasattr(out.metrics, "model_dump") else dict(out.metrics)
    return encodable({"prompt_ids": [int(t) for t in out.prompt_ids], "response_ids": [int(t) for t in out.response_ids],
                      "response_mask": [int(t) for t in out.response_mask], "num_turns": int(out.num_turns),
                      "metrics": metrics})

async def run_row(server, i, row, sampling_params, trajectory):
    current_row.set(i)
    try:
        with rollout_trace_attr(step=trajectory["step"], sample_index=trajectory["sample_index"],
                                rollout_n=trajectory["rollout_n"], validate=trajectory["validate"], name="agent_loop"):
            agent = hydra.utils.instantiate(config=verl_loops._agent_loop_registry[row["agent_name"]],
                                            trainer_config=verl_loops._DummyConfig(config=config),
                                            server_manager=server, tokenizer=tokenizer)
            out = await agent.run(row["messages"], dict(sampling_params))
        return output_of(out)
    except BaseException as e:  # a loop's SystemExit or CancelledError is its row's error too
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        server.live -= 1
        server.wake.set()

async def run_batch(batch):
    server = ServerManager()
    rows = batch["rows"]
    server.live = len(rows)
    trajectories = await verl_loops.get_trajectory_info(batch["step"], [r["index"] for r in rows], batch["validate"])
    tasks = [loop.create_task(run_row(server, i, row, batch["sampling_params"], t))
             for i, (row, t) in enumerate(zip(rows, trajectories))]
    while server.live > 0 or server.pending:
        quiet = False
        try:
            await asyncio.wait_for(server.wake.wait(), 0.05)
        except asyncio.TimeoutError:
            quiet = True
        server.wake.clear()
        if not server.pending:
            continue
        # Sent when every unfinished loop waits on the model, when none asked for 50 ms (some are
        # in slow tools), or when the oldest request has waited 200 ms.
        waiting = len({r["row"] for r, _ in server.pending})
        if waiting < server.live and not quiet and loop.time() - server.since < 0.2:
            continue
        sent, server.pending = server.pending, []
        send({"op": "generate", "requests": [r for r, _ in sent]})
        line = await loop.run_in_executor(reader, requests.readline)
        if not line:
            os._exit(0)
        for (_, future), result in zip(sent, json.loads(line)["results"]):
            if future.done():
                continue
            if "error" in result:
                future.set_exception(RuntimeError(result["error"]))
            else:
                future.set_result(result["tokens"])
    results = await asyncio.gather(*tasks, return_exceptions=True)
    send({"op": "done", "rows": [r if isinstance(r, dict) else {"error": f"{type(r).__name__}: {r}"} for r in results]})

while line := requests.readline():
    loop.run_until_complete(run_batch(json.loads(line)))
)PY";

std::string interpreter(const AgentHostOptions& options) {
  return options.python.empty() ? runtime::python_from_env("TESSERA_AGENT_PYTHON") : options.python;
}

}  // namespace

struct AgentHost::Child : runtime::PythonChild {};

AgentHost::AgentHost(AgentHostOptions options) : options_(std::move(options)) {}

AgentHost::~AgentHost() {
  if (child_ != nullptr) runtime::kill_child(*child_);
}

Result<std::unique_ptr<AgentHost>> AgentHost::start_host(const AgentHostOptions& options) {
  std::unique_ptr<AgentHost> host(new AgentHost(options));
  TESSERA_RETURN_IF_ERROR(host->launch());
  return host;
}

Status AgentHost::launch() {
  if (child_ != nullptr) runtime::kill_child(*child_);
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild spawned,
                           runtime::spawn_python(interpreter(options_), kAgentScript, {}, kKey));
  child_ = std::make_unique<Child>();
  static_cast<runtime::PythonChild&>(*child_) = std::move(spawned);
  // Importing verl, the loops' modules and the tokenizer may outlast one batch's timeout.
  const auto deadline = Clock::now() + std::max<std::chrono::milliseconds>(options_.timeout, std::chrono::minutes(5));
  const json spec = {{"config", options_.trainer_config},
                     {"tokenizer_path", options_.tokenizer_path},
                     {"agent_loop_config_path", options_.agent_loop_config_path}};
  Status sent = runtime::write_all(*child_, spec.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", deadline);
  Result<std::string> line = sent.ok() ? runtime::read_line(*child_, deadline) : Result<std::string>(sent);
  const json ready = line.ok() ? json::parse(*line, nullptr, false) : json();
  if (!ready.is_object() || !ready.value("ready", false) || !ready.contains("agents")) {
    const std::string why = !line.ok() ? line.status().message()
                            : ready.is_object() && ready.contains("fatal") ? ready["fatal"].get<std::string>()
                                                                           : "unexpected output: " +
                                                                                 runtime::first_line(*line);
    return make_error(ErrorCode::invalid_argument, "{}: cannot load '{}': {}", kKey, options_.agent_loop_config_path,
                      why);
  }
  if (ready.value("defined", json::array()).empty()) {
    return make_error(ErrorCode::invalid_argument, "{}: '{}' defines no agent loop (a list of {{name, _target_}})",
                      kKey, options_.agent_loop_config_path);
  }
  agents_.clear();
  for (const auto& name : ready["agents"]) {
    if (name.is_string()) agents_.push_back(name.get<std::string>());  // the child checked the config's names
  }
  in_batch_ = false;
  return Status();
}

Status AgentHost::fail(Status why) {
  broken_ = why;
  if (child_ != nullptr) runtime::kill_child(*child_);
  return why;
}

Result<json> AgentHost::exchange(const json& message, const char* what) {
  if (!broken_.ok()) return broken_;
  const auto deadline = Clock::now() + options_.timeout;
  const std::string where = fmt::format("{}={} ({})", kKey, options_.agent_loop_config_path, what);
  Status sent = runtime::write_all(*child_, message.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", deadline);
  if (!sent.ok()) return fail(Status(sent.code(), fmt::format("{}: the agent-loop process is gone: {}", where, sent.message())));
  Result<std::string> line = runtime::read_line(*child_, deadline);
  if (!line.ok()) {
    const std::string why =
        line.status().code() == ErrorCode::timeout
            ? fmt::format("the agent loops sent nothing for {} s (actor_rollout_ref.rollout.engine_kwargs.tessera."
                          "tool_timeout_s)", static_cast<double>(options_.timeout.count()) / 1000.0)
            : "the agent-loop process exited: " + line.status().message();
    return fail(Status(line.status().code(), fmt::format("{}: {}", where, why)));
  }
  json next = json::parse(*line, nullptr, false);
  const std::string op = next.is_object() ? next.value("op", "") : "";
  in_batch_ = op != "done";
  if ((op != "generate" || !next.contains("requests") || !next["requests"].is_array()) &&
      (op != "done" || !next.contains("rows") || !next["rows"].is_array())) {
    return fail(Status(ErrorCode::internal, fmt::format("{}: the agent-loop process answered '{}'", where,
                                                        runtime::first_line(*line).substr(0, 120))));
  }
  return next;
}

Result<json> AgentHost::start(const json& batch) {
  // The last batch was abandoned mid-way: its loops still wait for tokens in the child.
  if (in_batch_ && broken_.ok()) {
    if (Status relaunched = launch(); !relaunched.ok()) return fail(relaunched);
  }
  return exchange(batch, "a batch");
}

Result<json> AgentHost::answer(const json& results) { return exchange(results, "generated tokens"); }

namespace {

class AgentRelay final : public AgentLoops {
 public:
  AgentRelay(std::shared_ptr<collective::Communicator> group, std::unique_ptr<AgentHost> host,
             std::vector<std::string> agents, std::chrono::milliseconds timeout, std::chrono::milliseconds start_timeout)
      : timeout_(timeout),
        start_timeout_(start_timeout),
        group_(std::move(group)),
        host_(std::move(host)),
        agents_(std::move(agents)) {}

  const std::vector<std::string>& agents() const override { return agents_; }
  // A start may first replace rank 0's child (an abandoned batch): the peers wait as at start-up.
  Result<json> start(const json& batch) override {
    if (!broken_.ok()) return broken_;
    return relay(host_ != nullptr ? host_->start(batch) : Result<json>(json()), start_timeout_);
  }
  Result<json> answer(const json& results) override {
    if (!broken_.ok()) return broken_;
    return relay(host_ != nullptr ? host_->answer(results) : Result<json>(json()), timeout_);
  }

 private:
  // Rank 0's message (or its error) on every peer.
  Result<json> relay(Result<json> mine, std::chrono::milliseconds timeout) {
    nlohmann::ordered_json message;
    if (host_ != nullptr) message = mine.ok() ? nlohmann::ordered_json(*mine) : internal::error_message(mine.status());
    if (Status st = internal::send_or_receive(*group_, message, timeout, "the agent loops' messages"); !st.ok()) {
      broken_ = st;
      return st;
    }
    if (host_ != nullptr) return mine;
    TESSERA_RETURN_IF_ERROR(internal::error_of(message));
    return json::parse(message.dump());
  }

  std::chrono::milliseconds timeout_, start_timeout_;
  std::shared_ptr<collective::Communicator> group_;
  std::unique_ptr<AgentHost> host_;  ///< Rank 0's; null on the other peers.
  std::vector<std::string> agents_;
  Status broken_;
};

}  // namespace

Result<std::unique_ptr<AgentLoops>> relay_agent_loops(std::shared_ptr<collective::Communicator> tp_group,
                                                      Result<std::unique_ptr<AgentHost>> leader,
                                                      std::chrono::milliseconds timeout) {
  const auto wait = timeout + std::chrono::minutes(1);
  const auto start_wait = std::max<std::chrono::milliseconds>(timeout, std::chrono::minutes(5)) + std::chrono::minutes(1);
  std::unique_ptr<AgentHost> host;
  nlohmann::ordered_json message;
  if (tp_group->rank() == 0) {
    if (leader.ok() && *leader != nullptr) {
      host = std::move(leader).value();
      message = {{"agents", host->agents()}};
    } else {
      message = internal::error_message(leader.ok() ? Status(ErrorCode::internal, "rollout TP: rank 0 has no agent host")
                                                    : leader.status());
    }
  }
  TESSERA_RETURN_IF_ERROR(internal::send_or_receive(*tp_group, message, start_wait, "the agent loops' messages"));
  TESSERA_RETURN_IF_ERROR(internal::error_of(message));
  std::vector<std::string> agents;
  for (const auto& name : message["agents"]) {
    if (name.is_string()) agents.push_back(name.get<std::string>());
  }
  return std::unique_ptr<AgentLoops>(
      new AgentRelay(std::move(tp_group), std::move(host), std::move(agents), wait, start_wait));
}

}  // namespace tessera::rollout
