// `tessera demo [overrides]`: the built-in demo (driver::run_demo): init-model, SFT warm-up,
// GRPO through the worker groups, plots. Its configs are examples/demo/{sft,grpo}.yaml.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/worker_types.hpp"
#include "driver/demo_task.hpp"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

// --config-dir, else examples/demo under the working directory, else beside the source tree the
// binary was built from (<repo>/build*/bin/tessera -> <repo>/examples/demo).
Result<fs::path> find_examples_dir(const std::string& given) {
  std::vector<fs::path> tried;
  if (!given.empty()) tried.push_back(given);
  tried.push_back(fs::current_path() / "examples" / "demo");
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(exe.parent_path().parent_path().parent_path() / "examples" / "demo");
  for (const auto& d : tried) {
    if (fs::exists(d / "grpo.yaml") && fs::exists(d / "sft.yaml")) return d;
    if (!given.empty()) break;  // an explicit directory must hold the files
  }
  std::string list;
  for (const auto& d : tried) list += (list.empty() ? "" : ", ") + d.string();
  return make_error(ErrorCode::not_found, "no grpo.yaml + sft.yaml in {} (pass --config-dir)", list);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Tiny model -> SFT warm-up -> GRPO on addition; prints validation before/after");
  static std::string config_dir;
  static std::vector<std::string> overrides;
  cmd->add_option("--config-dir", config_dir, "directory holding sft.yaml and grpo.yaml (default: examples/demo)");
  cmd->add_option("overrides", overrides,
                  "a.b.c=value (GRPO config), sft.a.b=value (SFT config), demo.key=value (digits, sft_noise, seed, ...)");
  cmd->callback([] {
    auto dir = find_examples_dir(config_dir);
    if (!dir.ok()) {
      std::fprintf(stderr, "tessera demo: %s\n", dir.status().to_string().c_str());
      exit_code() = 2;
      return;
    }
    driver::DemoRunOptions o;
    o.examples_dir = *dir;
    o.overrides = overrides;
    auto report = driver::run_demo(o, worker_types());
    if (!report.ok()) std::fprintf(stderr, "tessera demo: %s\n", report.status().to_string().c_str());
    exit_code() = report.ok() ? 0 : 1;
  });
}

}  // namespace tessera::app
