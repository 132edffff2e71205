// tool_host.hpp: verl's tools (actor_rollout_ref.rollout.multi_turn.tool_config_path) and
// interactions (simulated users, multi_turn.interaction_config_path) hosted in a Python child
// process of the rollout worker (runtime/python_child.hpp).
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
//   start    interaction.start_interaction(instance_id, **interaction_kwargs)
//   respond  interaction.generate_response(instance_id, messages, **interaction_kwargs)
//            -> (should_terminate, text, reward, metrics)
//   finalize interaction.finalize_interaction(instance_id) (verl's base class: no argument)
// Interactions come from verl's initialize_interactions_from_config, by their names.
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

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::rollout {

struct ToolHostOptions {
  std::string config_path;  ///< multi_turn.tool_config_path (empty: no tools).
  std::string interaction_config_path;  ///< multi_turn.interaction_config_path (empty: none).
  /// The interpreter (verl and the tools' packages importable); empty: $TESSERA_TOOL_PYTHON, else python3.
  std::string python;
  std::chrono::milliseconds timeout{300'000};  ///< Per batch of calls (start-up: at least 5 minutes).
};

/// One tool call of a batch. Which fields are read depends on the operation (see the header).
struct ToolRequest {
  std::string tool;                  ///< The tool's name (its schema's function.name), or the interaction's.
  std::string instance;              ///< The instance id (one per sequence and tool).
  nlohmann::json parameters = nlohmann::json::object();  ///< execute: the call's arguments; respond: the messages.
  nlohmann::json kwargs = nlohmann::json::object();      ///< create/execute/calc_reward kwargs.
  nlohmann::json release_kwargs = nlohmann::json::object();  ///< finish: release's kwargs.
};

/// One call's answer: `error` set when the tool raised; otherwise `text` (execute, respond),
/// `reward` (execute, finish, respond; null when none was given), `metrics` (execute, respond) and
/// `terminate` (respond: the interaction ends the conversation).
struct ToolAnswer {
  std::string error;
  std::string text;
  nlohmann::json reward;
  nlohmann::json metrics;
  bool terminate = false;
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
  /// The interactions' names.
  virtual const std::vector<std::string>& interactions() const = 0;
  /// Whether a tool (interaction) of this name was loaded.
  bool has_tool(const std::string& name) const { return schemas().contains(name); }
  bool has_interaction(const std::string& name) const {
    return std::find(interactions().begin(), interactions().end(), name) != interactions().end();
  }
  /// `op` is "create", "execute", "finish", "release", "start", "respond" or "finalize". One answer
  /// per request, in order.
  virtual Result<std::vector<ToolAnswer>> call(const std::string& op, const std::vector<ToolRequest>& requests) = 0;
  /// The same on an error path, its answers ignored. Never collective: a TP relay's rank 0 runs it
  /// alone (its peers may not be on the same path).
  virtual void call_best_effort(const std::string& op, const std::vector<ToolRequest>& requests) {
    (void)call(op, requests);
  }
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
  const std::vector<std::string>& interactions() const override { return interactions_; }
  Result<std::vector<ToolAnswer>> call(const std::string& op, const std::vector<ToolRequest>& requests) override;
  /// The config keys and paths it loaded, for errors.
  std::string describe() const;

 private:
  struct Child;
  ToolHost(ToolHostOptions options, std::unique_ptr<Child> child);
  Status fail(Status why);

  ToolHostOptions options_;
  std::unique_ptr<Child> child_;
  nlohmann::ordered_json schemas_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json agent_schemas_ = nlohmann::ordered_json::object();
  std::vector<std::string> interactions_;
  Status broken_;  ///< Set once the child is gone: every later call fails with it.
};

/// Rollout TP: the TP group's rank 0 hosts the tools (`leader`: its ToolHost::start result; other
/// ranks pass nullptr) and every peer's call() returns rank 0's answers, or its error. Collective
/// over `tp_group`: every peer calls relay_tools, then call() with the same operations in the
/// same order (TP peers run identical conversations). A failed start on rank 0 is every peer's
/// error; a failed exchange breaks the relay (later calls fail at once, without a collective).
/// The peers wait for rank 0 up to `timeout` (the tools' batch timeout) plus a minute.
Result<std::unique_ptr<ToolSet>> relay_tools(std::shared_ptr<collective::Communicator> tp_group,
                                             Result<std::unique_ptr<ToolHost>> leader,
                                             std::chrono::milliseconds timeout);

}  // namespace tessera::rollout
