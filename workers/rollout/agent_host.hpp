// agent_host.hpp: the user's agent loops (actor_rollout_ref.rollout.agent.agent_loop_config_path)
// hosted in a Python child process of the rollout worker (runtime/python_child.hpp), driven by
// the rollout (agent_loops.hpp), which generates their tokens with Tessera's engine.
//
// The child sets up what verl's AgentLoopWorker sets up: the trainer config as an OmegaConf
// DictConfig, the tokenizer (verl.utils.hf_tokenizer), verl's loop registry (its own
// single_turn_agent and tool_agent, then every entry of the config file), RolloutTraceConfig. Per
// batch, each row gets a loop built as verl builds it (hydra.utils.instantiate of its registry
// entry with trainer_config, server_manager and tokenizer) and run as verl runs it
// (`await loop.run(messages, sampling_params)`), all rows concurrently on one asyncio loop. The
// server_manager is a bridge: its `generate(request_id, prompt_ids=..., sampling_params=...)`
// queues the request and sends the queue to this process when every unfinished loop waits on
// one, when none arrived for 50 ms (some loop is in a slow tool call) or when the oldest has
// waited 200 ms, as one message:
//   child -> {"op": "generate", "requests": [{"row", "prompt_ids", "sampling_params"}]}
//   parent -> {"results": [{"tokens": [...]} | {"error": "..."}]}   (the error is raised in the loop)
// and, when every loop returned,
//   child -> {"op": "done", "rows": [{"prompt_ids", "response_ids", "response_mask", "num_turns",
//            "metrics"} | {"error": "<Type>: <message>"}]}
// A loop that raises (anything, SystemExit and cancellation included), or returns what JSON cannot
// carry, gives its row's error; the others run on.
//
// The child prints nothing into the protocol (its stdout is stderr), so a loop's print is safe.
// A child that dies, breaks the protocol, or sends nothing for `timeout` ends the host: the
// call returns an error naming the config key, and every later call fails alike. A batch the
// caller abandoned (its engine call failed) leaves loops waiting in the child: the next start()
// replaces the child with a fresh one.
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

struct AgentHostOptions {
  std::string agent_loop_config_path;  ///< verl's YAML: a list of {name, _target_, ...kwargs}.
  nlohmann::json trainer_config;       ///< The whole resolved config (the loops' trainer_config.config).
  std::string tokenizer_path;          ///< The model directory the worker loaded.
  /// The interpreter (verl, hydra and the loops' packages importable); empty: $TESSERA_AGENT_PYTHON,
  /// else python3.
  std::string python;
  /// How long the loops may go without sending anything (engine_kwargs.tessera.tool_timeout_s).
  std::chrono::milliseconds timeout{300'000};
};

/// The agent loops of a rollout rank: an AgentHost, or a TP group's relay of one. A batch is
/// start(), then answer() for every "generate" message, until the "done" message.
class AgentLoops {
 public:
  virtual ~AgentLoops() = default;
  /// The loop names rows may give as agent_name (verl's and the config file's).
  virtual const std::vector<std::string>& agents() const = 0;
  /// Starts a batch: {"rows": [{"agent_name", "messages", "index"}], "sampling_params": {...},
  /// "step": int, "validate": bool}. Returns the loops' first message.
  virtual Result<nlohmann::json> start(const nlohmann::json& batch) = 0;
  /// Answers a "generate" message: {"results": [...]}, one per request. Returns the next message.
  virtual Result<nlohmann::json> answer(const nlohmann::json& results) = 0;
};

class AgentHost final : public AgentLoops {
 public:
  /// Starts the child and loads the loops; an error names the config key and what Python raised.
  static Result<std::unique_ptr<AgentHost>> start_host(const AgentHostOptions& options);
  ~AgentHost() override;
  AgentHost(const AgentHost&) = delete;
  AgentHost& operator=(const AgentHost&) = delete;

  const std::vector<std::string>& agents() const override { return agents_; }
  Result<nlohmann::json> start(const nlohmann::json& batch) override;
  Result<nlohmann::json> answer(const nlohmann::json& results) override;

 private:
  struct Child;
  explicit AgentHost(AgentHostOptions options);
  Status launch();  // starts the child and reads its loops' names
  Result<nlohmann::json> exchange(const nlohmann::json& message, const char* what);
  Status fail(Status why);

  AgentHostOptions options_;
  std::unique_ptr<Child> child_;
  std::vector<std::string> agents_;
  bool in_batch_ = false;  ///< A batch was started and its "done" not read yet.
  Status broken_;  ///< Set once the child is gone: every later call fails with it.
};

/// Rollout TP: the TP group's rank 0 runs the loops (`leader`: its AgentHost::start_host result;
/// other ranks pass nullptr) and every peer receives each of its messages, so all peers make the
/// same engine calls. Collective over `tp_group`: every peer calls relay_agent_loops, then start()
/// and answer() in the same order (the peers' arguments are ignored). An error on rank 0 is
/// every peer's. The peers wait up to `timeout` plus a minute for each message.
Result<std::unique_ptr<AgentLoops>> relay_agent_loops(std::shared_ptr<collective::Communicator> tp_group,
                                                      Result<std::unique_ptr<AgentHost>> leader,
                                                      std::chrono::milliseconds timeout);

}  // namespace tessera::rollout
