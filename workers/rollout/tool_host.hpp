// tool_host.hpp: verl's tools (actor_rollout_ref.rollout.multi_turn.tool_config_path) hosted in a
// Python child process of the rollout worker (runtime/python_child.hpp).
//
// The child builds the tools with verl's own loader (verl.tools.utils.tool_registry.
// initialize_tools_from_config), so a tool YAML that runs under verl runs here: native tools by
// class_name, MCP tools through verl's client manager. It reports every tool's OpenAI schema (in
// their key order, as verl's SGLang rollout and its agent loop each dump them) and then runs
// batches of calls, each batch's coroutines concurrently on one asyncio loop:
//   create   tool.create(instance_id, **create_kwargs)
//   execute  tool.execute(instance_id, parameters, **execute_kwargs) -> (response, reward, metrics)
//   finish   tool.calc_reward(instance_id, **calc_reward_kwargs), then (also when it raised)
//            tool.release(instance_id, **release_kwargs)
//   release  tool.release(instance_id, **release_kwargs) (a rollout that stops early)
// A call that raises, or answers something JSON cannot carry, answers {"error": "<Type>:
// <message>"}; the batch goes on (NaN and infinities become null). A response is
// verl 0.5's str or a later ToolResponse's text (one with images or video is an error: the
// rollout is text-only).
//
// A batch that takes longer than the timeout, a child that dies or breaks the protocol, ends the
// host: the call returns an error naming the tool config, and every later call fails alike.
//
// With rollout TP the peers of a TP group run the same conversations: relay_tools() has the
// group's rank 0 run the tools once and every peer receive its answers.
//
// Thread-safety: none; one owner (the rollout worker's thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::rollout {

struct ToolHostOptions {
  std::string config_path;  ///< multi_turn.tool_config_path.
  /// The interpreter (verl and the tools' packages importable); empty: $TESSERA_TOOL_PYTHON, else python3.
  std::string python;
  std::chrono::milliseconds timeout{300'000};  ///< Per batch of calls (start-up: at least 5 minutes).
};

/// One tool call of a batch. Which fields are read depends on the operation (see the header).
struct ToolRequest {
  std::string tool;                  ///< The tool's name (its schema's function.name).
  std::string instance;              ///< The instance id (one per sequence and tool).
  nlohmann::json parameters = nlohmann::json::object();  ///< execute: the call's arguments.
  nlohmann::json kwargs = nlohmann::json::object();      ///< create/execute/calc_reward kwargs.
  nlohmann::json release_kwargs = nlohmann::json::object();  ///< finish: release's kwargs.
};

/// One call's answer: `error` set when the tool raised; otherwise `text` (execute), `reward`
/// (execute, finish; null when the tool gave none) and `metrics` (execute).
struct ToolAnswer {
  std::string error;
  std::string text;
  nlohmann::json reward;
  nlohmann::json metrics;
};

/// The tools a multi-turn rollout calls: a ToolHost, or a TP group's relay of one.
class ToolSet {
 public:
  virtual ~ToolSet() = default;
  /// The tools' OpenAI function schemas by name, in the config's order, as verl's SGLang rollout
  /// dumps them (model_dump()) and as its agent loop does (model_dump(exclude_unset=True,
  /// exclude_none=True)).
  virtual const nlohmann::ordered_json& schemas() const = 0;
  virtual const nlohmann::ordered_json& agent_schemas() const = 0;
  /// Whether a tool of this name was loaded.
  bool has_tool(const std::string& name) const { return schemas().contains(name); }
  /// `op` is "create", "execute", "finish" or "release". One answer per request, in order.
  virtual Result<std::vector<ToolAnswer>> call(const std::string& op, const std::vector<ToolRequest>& requests) = 0;
};

class ToolHost final : public ToolSet {
 public:
  /// Starts the child and loads the tools; an error names the config and what Python raised.
  static Result<std::unique_ptr<ToolHost>> start(const ToolHostOptions& options);
  ~ToolHost() override;
  ToolHost(const ToolHost&) = delete;
  ToolHost& operator=(const ToolHost&) = delete;

  const nlohmann::ordered_json& schemas() const override { return schemas_; }
  const nlohmann::ordered_json& agent_schemas() const override { return agent_schemas_; }
  Result<std::vector<ToolAnswer>> call(const std::string& op, const std::vector<ToolRequest>& requests) override;

 private:
  struct Child;
  ToolHost(ToolHostOptions options, std::unique_ptr<Child> child);
  Status fail(Status why);

  ToolHostOptions options_;
  std::unique_ptr<Child> child_;
  nlohmann::ordered_json schemas_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json agent_schemas_ = nlohmann::ordered_json::object();
  Status broken_;  ///< Set once the child is gone: every later call fails with it.
};

/// Rollout TP: the TP group's rank 0 hosts the tools (`leader`: its ToolHost::start result; other
/// ranks pass nullptr) and every peer's call() returns rank 0's answers, or its error. Collective
/// over `tp_group`: every peer calls relay_tools, then call() with the same operations in the
/// same order (TP peers run identical conversations). A failed start on rank 0 is every peer's
/// error.
Result<std::unique_ptr<ToolSet>> relay_tools(std::shared_ptr<collective::Communicator> tp_group,
                                             Result<std::unique_ptr<ToolHost>> leader);

}  // namespace tessera::rollout
