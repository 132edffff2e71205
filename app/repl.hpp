// repl.hpp: the driver REPL's command interpreter (`tessera repl`). One Repl owns a trainer
// (with its runtime, worker groups, tokenizer and training data). execute() runs one input line and never throws: a bad command prints its error and the
// help, and the session goes on. The line editor (readline) lives in cmd_repl.cpp; this class is
// what tests drive.
//
// Commands (see kReplHelp in repl.cpp for the text users see):
//   help | groups | methods GROUP | call GROUP METHOD [rows=N] [meta=JSON] [ARG_JSON...]
//   inspect [rows=K] | generate "PROMPT" [max_tokens=N] | step | run N | validate
//   metrics [PREFIX] | save | quit
// Values: the last DataProto any command produced is kept for `inspect`.
//
// Thread contract: one thread (the session's) drives a Repl.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/metrics.hpp"
#include "driver/ppo_trainer.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::app {

/// Splits a command line into words: whitespace separates, '...' and "..." group (quotes
/// removed, backslash escapes the next character inside double quotes). Error: an unclosed quote.
Result<std::vector<std::string>> split_command_line(const std::string& line);

/// The REPL's interpreter.
class Repl {
 public:
  /// Builds the trainer from `cfg` (a loaded PPO config) and starts its workers.
  static Result<std::unique_ptr<Repl>> create(nlohmann::json cfg, std::FILE* out);
  ~Repl();

  /// Runs one line. Returns false after `quit` / `exit`; every error is printed, not returned.
  bool execute(const std::string& line);

  /// Candidate completions of `word` at position `index` of the line `words_before` (command
  /// names first, then group names, then the group's method names).
  std::vector<std::string> complete(const std::vector<std::string>& words_before,
                                    const std::string& word) const;

  /// The help text.
  static const char* help();

 private:
  Repl() = default;
  Status run(const std::vector<std::string>& words);
  Status cmd_groups();
  Status cmd_methods(const std::vector<std::string>& words);
  Status cmd_call(const std::vector<std::string>& words);
  Status cmd_inspect(const std::vector<std::string>& words);
  Status cmd_generate(const std::vector<std::string>& words);
  Status cmd_steps(int64_t n);
  Status cmd_metrics(const std::vector<std::string>& words);
  Result<dispatch::WorkerGroup*> group(const std::string& name) const;
  void print_proto_summary(const proto::DataProto& p);

  std::FILE* out_ = stdout;
  std::unique_ptr<driver::RayPPOTrainer> trainer_;
  int64_t data_cursor_ = 0;
  std::optional<proto::DataProto> last_;
  driver::Metrics last_metrics_;
};

}  // namespace tessera::app
