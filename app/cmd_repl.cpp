// `tessera repl [CONFIG] [a.b.c=value ...]`: the interactive driver. Starts the trainer's worker
// groups (embedded, or on cluster.agents) and reads commands with readline (history in
// ~/.tessera_history, tab completion of commands, groups and methods). When stdin is not a
// terminal, commands are read line by line without readline, so scripts and tests can drive it.
#include <CLI/CLI.hpp>
#include <readline/history.h>
#include <readline/readline.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/repl.hpp"
#include "driver/config.hpp"

namespace tessera::app {
namespace {

Repl* g_repl = nullptr;  // readline's completion callbacks take no user pointer
std::vector<std::string> g_matches;

char* completion_generator(const char* text, int state) {
  if (state == 0) {
    std::string line(rl_line_buffer, static_cast<size_t>(rl_point));
    std::vector<std::string> words;
    auto split = split_command_line(line);
    if (split.ok()) words = *split;
    if (!line.empty() && !std::isspace(static_cast<unsigned char>(line.back())) && !words.empty()) words.pop_back();
    g_matches = g_repl->complete(words, text);
  }
  if (static_cast<size_t>(state) >= g_matches.size()) return nullptr;
  return strdup(g_matches[static_cast<size_t>(state)].c_str());
}

char** completion(const char* text, int, int) {
  rl_attempted_completion_over = 1;  // no file-name fallback
  return rl_completion_matches(text, completion_generator);
}

int interactive_loop(Repl& repl) {
  g_repl = &repl;
  rl_attempted_completion_function = completion;
  const char* home = std::getenv("HOME");
  std::string history = std::string(home ? home : ".") + "/.tessera_history";
  read_history(history.c_str());
  std::printf("tessera repl: type `help` for commands, `quit` to leave\n");
  while (char* raw = readline("tessera> ")) {
    std::string line(raw);
    std::free(raw);
    if (!line.empty()) {
      add_history(line.c_str());
      append_history(1, history.c_str());
    }
    if (!repl.execute(line)) break;
  }
  g_repl = nullptr;
  return 0;
}

int script_loop(Repl& repl) {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::printf("tessera> %s\n", line.c_str());
    std::fflush(stdout);
    if (!repl.execute(line)) break;
  }
  return 0;
}

}  // namespace

void add_repl_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "repl", "Interactive driver: inspect worker groups, call methods, generate, step the trainer");
  cmd->add_option("config", opts->config, "Trainer YAML (verl keys); empty for the defaults");
  cmd->add_option("overrides", opts->overrides, "a.b.c=value overrides (Hydra syntax)");
  cmd->callback([opts] {
    std::string file = opts->config;
    std::vector<std::string> overrides = opts->overrides;
    if (file.find('=') != std::string::npos) {  // `tessera repl a.b=c` without a file
      overrides.insert(overrides.begin(), file);
      file.clear();
    }
    Result<nlohmann::json> cfg = driver::load_config(driver::ConfigKind::ppo, file, overrides);
    if (!cfg.ok()) {
      std::fprintf(stderr, "tessera repl: %s\n", cfg.status().to_string().c_str());
      exit_code() = 2;
      return;
    }
    Result<std::unique_ptr<Repl>> repl = Repl::create(std::move(*cfg), stdout);
    if (!repl.ok()) {
      std::fprintf(stderr, "tessera repl: %s\n", repl.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    exit_code() = ::isatty(STDIN_FILENO) ? interactive_loop(**repl) : script_loop(**repl);
  });
}

}  // namespace tessera::app
