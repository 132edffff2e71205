// demo_run.cpp: run_demo, the body of `tessera demo` (see demo_task.hpp).
#include <chrono>
#include <fstream>
#include <map>

#include "driver/config.hpp"
#include "driver/demo_task.hpp"
#include "driver/plot.hpp"
#include "driver/ppo_trainer.hpp"
#include "driver/sft_trainer.hpp"
#include "workers/models/init_model.hpp"

namespace tessera::driver {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kMarker = ".tessera-demo";

struct SplitOverrides {
  std::map<std::string, std::string> demo;  // demo.<key> -> value
  std::vector<std::string> sft, grpo;
};

// "++sft.a=1" -> ("++", "sft.a=1").
std::pair<std::string, std::string> split_prefix(const std::string& o) {
  size_t n = 0;
  while (n < o.size() && n < 2 && (o[n] == '+' || o[n] == '~')) ++n;
  return {o.substr(0, n), o.substr(n)};
}

Result<SplitOverrides> split_overrides(const std::vector<std::string>& overrides) {
  SplitOverrides out;
  for (const auto& o : overrides) {
    auto [prefix, rest] = split_prefix(o);
    if (rest.rfind("demo.", 0) == 0) {
      const size_t eq = rest.find('=');
      if (!prefix.empty() || eq == std::string::npos) {
        return make_error(ErrorCode::invalid_argument, "override '{}': demo options take the form demo.key=value", o);
      }
      out.demo[rest.substr(5, eq - 5)] = rest.substr(eq + 1);
    } else if (rest.rfind("sft.", 0) == 0) {
      out.sft.push_back(prefix + rest.substr(4));
    } else {
      out.grpo.push_back(o);
    }
  }
  return out;
}

struct ModelShape {
  int64_t hidden = 64, layers = 2;
};

Result<int64_t> parse_int(const std::string& key, const std::string& v) {
  try {
    size_t used = 0;
    const int64_t x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (...) {
  }
  return make_error(ErrorCode::invalid_argument, "demo.{}: '{}' is not an integer", key, v);
}

Status apply_demo_options(const std::map<std::string, std::string>& kv, DemoTaskOptions& task, ModelShape& shape) {
  std::map<std::string, int64_t*> ints = {{"digits", &task.digits},           {"rl_train_size", &task.rl_train_size},
                                          {"rl_val_size", &task.rl_val_size}, {"sft_train_size", &task.sft_train_size},
                                          {"sft_val_size", &task.sft_val_size}, {"hidden", &shape.hidden},
                                          {"layers", &shape.layers}};
  for (const auto& [k, v] : kv) {
    if (auto it = ints.find(k); it != ints.end()) {
      TESSERA_ASSIGN_OR_RETURN(*it->second, parse_int(k, v));
    } else if (k == "seed") {
      TESSERA_ASSIGN_OR_RETURN(int64_t s, parse_int(k, v));
      task.seed = static_cast<uint64_t>(s);
    } else if (k == "sft_noise") {
      try {
        task.sft_noise = std::stod(v);
      } catch (...) {
        return make_error(ErrorCode::invalid_argument, "demo.sft_noise: '{}' is not a number", v);
      }
    } else {
      return make_error(ErrorCode::invalid_argument, "demo.{}: unknown demo option (digits, sft_noise, seed, hidden, "
                        "layers, rl_train_size, rl_val_size, sft_train_size, sft_val_size)", k);
    }
  }
  return validate_demo_task_options(task);
}

// Clears a previous demo's run directory; refuses any other non-empty directory.
Status prepare_run_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!fs::exists(dir / kMarker)) {
      return make_error(ErrorCode::already_exists, "trainer.default_local_dir '{}' is not empty and not a demo run "
                        "directory; choose another (trainer.default_local_dir=...)", dir.string());
    }
    fs::remove_all(dir, ec);
    if (ec) return make_error(ErrorCode::io_error, "{}: cannot clear: {}", dir.string(), ec.message());
  }
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: cannot create: {}", dir.string(), ec.message());
  std::ofstream(dir / kMarker) << "created by tessera demo\n";
  return Status();
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void say(std::FILE* out, const std::string& line) {
  if (out == nullptr) return;
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The val-core mean metric of a validation entry ("val-core/<ds>/<var>/mean@N").
std::optional<std::pair<std::string, double>> val_core(const Metrics& m) {
  for (const auto& [k, v] : m) {
    if (k.rfind("val-core/", 0) == 0 && k.find("/mean@") != std::string::npos) return std::make_pair(k, v);
  }
  return std::nullopt;
}

Result<fs::path> run_sft_phase(const DemoRunOptions& o, const fs::path& run_dir, const std::vector<std::string>& user,
                               const runtime::WorkerTypeRegistry& registry) {
  const fs::path data = run_dir / "data";
  std::vector<std::string> fixed = {"data.train_files=" + (data / "sft_train.jsonl").string(),
                                    "data.val_files=" + (data / "sft_val.jsonl").string(),
                                    "model.partial_pretrain=" + (run_dir / "init_model").string(),
                                    "trainer.default_local_dir=" + (run_dir / "sft").string()};
  TESSERA_ASSIGN_OR_RETURN(json cfg, load_config(ConfigKind::sft, o.examples_dir / "sft.yaml", concat(fixed, user)));
  SftTrainerOptions so;
  so.console = nullptr;
  so.progress = o.progress;
  TESSERA_ASSIGN_OR_RETURN(auto trainer, FSDPSFTTrainer::create(std::move(cfg), registry, so));
  TESSERA_RETURN_IF_ERROR(trainer->fit());
  if (!trainer->last_hf_dir()) return make_error(ErrorCode::internal, "demo: the SFT phase saved no checkpoint");
  if (!trainer->history().empty()) {
    const Metrics& last = trainer->history().back().second;
    if (auto it = last.find("val/loss"); it != last.end()) say(o.out, fmt::format("  SFT validation loss {:.4f}", it->second));
  }
  return *trainer->last_hf_dir();
}

Status run_rl_phase(const DemoRunOptions& o, const fs::path& run_dir, const fs::path& model,
                    const std::vector<std::string>& user, const runtime::WorkerTypeRegistry& registry, DemoReport& r) {
  const fs::path data = run_dir / "data";
  std::vector<std::string> fixed = {"data.train_files=" + (data / "rl_train.jsonl").string(),
                                    "data.val_files=" + (data / "rl_val.jsonl").string(),
                                    "actor_rollout_ref.model.path=" + model.string(),
                                    "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                                    "++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32"};
  TESSERA_ASSIGN_OR_RETURN(json cfg, load_config(ConfigKind::ppo, o.examples_dir / "grpo.yaml", concat(fixed, user)));
  PpoTrainerOptions po;
  po.console = nullptr;
  po.progress = o.progress;
  TESSERA_ASSIGN_OR_RETURN(auto trainer, RayPPOTrainer::create(std::move(cfg), registry, po));
  TESSERA_RETURN_IF_ERROR(trainer->init_workers());
  TESSERA_RETURN_IF_ERROR(trainer->fit());
  bool first = true;
  for (const auto& [step, m] : trainer->history()) {
    auto v = val_core(m);
    if (!v) continue;
    if (first) r.metric = v->first, r.val_before = v->second, r.best_after = v->second;
    first = false;
    r.val_after = v->second;
    r.best_after = std::max(r.best_after, v->second);
  }
  if (first) return make_error(ErrorCode::internal, "demo: the RL phase logged no validation metric");
  return Status();
}

}  // namespace

Result<DemoReport> run_demo(const DemoRunOptions& o, const runtime::WorkerTypeRegistry& registry) {
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(SplitOverrides ov, split_overrides(o.overrides));
  DemoTaskOptions task;
  ModelShape shape;
  TESSERA_RETURN_IF_ERROR(apply_demo_options(ov.demo, task, shape));
  TESSERA_ASSIGN_OR_RETURN(json probe, load_config(ConfigKind::ppo, o.examples_dir / "grpo.yaml", ov.grpo));
  DemoReport r;
  TESSERA_ASSIGN_OR_RETURN(std::string run_dir, config_get<std::string>(probe, "trainer.default_local_dir"));
  r.run_dir = run_dir;
  TESSERA_RETURN_IF_ERROR(prepare_run_dir(r.run_dir));
  say(o.out, fmt::format("[1/4] data: {}-digit addition, {:.0f}% of SFT answers deliberately wrong -> {}", task.digits,
                         task.sft_noise * 100, (r.run_dir / "data").string()));
  TESSERA_RETURN_IF_ERROR(write_demo_datasets(task, (r.run_dir / "data").string()));
  models::InitModelOptions im;
  im.arch = "qwen2", im.hidden = shape.hidden, im.layers = shape.layers, im.heads = 4, im.kv_heads = 2;
  im.tokenizer = std::string("chars:") + kDemoAlphabet;
  im.seed = task.seed, im.max_position = 64, im.out = (r.run_dir / "init_model").string();
  say(o.out, fmt::format("[2/4] init-model: qwen2 hidden {} x {} layers, character tokenizer", shape.hidden, shape.layers));
  TESSERA_RETURN_IF_ERROR(models::init_model(im));
  say(o.out, "[3/4] SFT warm-up (2 CPU ranks, FSDP)");
  const auto t1 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(fs::path sft_model, run_sft_phase(o, r.run_dir, ov.sft, registry));
  r.sft_seconds = seconds_since(t1);
  say(o.out, fmt::format("[4/4] GRPO through the worker groups (model {})", sft_model.string()));
  const auto t2 = std::chrono::steady_clock::now();
  TESSERA_RETURN_IF_ERROR(run_rl_phase(o, r.run_dir, sft_model, ov.grpo, registry, r));
  r.rl_seconds = seconds_since(t2);
  auto plots = plot_run(r.run_dir);
  r.total_seconds = seconds_since(t0);
  say(o.out, fmt::format("validation {}: before RL {:.3f}, after RL {:.3f} (best {:.3f}), change {:+.3f}", r.metric,
                         r.val_before, r.val_after, r.best_after, r.val_after - r.val_before));
  say(o.out, fmt::format("time: SFT {:.0f} s, RL {:.0f} s, total {:.0f} s; run directory {}", r.sft_seconds,
                         r.rl_seconds, r.total_seconds, r.run_dir.string()));
  if (!plots.ok()) say(o.out, "plots: " + plots.status().to_string());
  else say(o.out, fmt::format("plots: {} files in {}", plots->written.size(), (r.run_dir / "plots").string()));
  return r;
}

}  // namespace tessera::driver
