// custom_reward_function in Python worker processes (driver/python_reward.hpp).
#include "driver/python_reward.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "driver/config.hpp"
#include "runtime/python_child.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using runtime::Clock;
using runtime::first_line;

// The child: imports the user's file, then answers one JSON line per request line. The protocol
// keeps private copies of the pipes (runtime::kProtocolPipes), so the user's prints, and whatever
// their code starts, stay out of it.
constexpr const char* kChildScript = R"PY(
import importlib.util, traceback
path, name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    spec = importlib.util.spec_from_file_location("tessera_custom_reward", path)
    if spec is None:
        raise ImportError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tessera_custom_reward"] = module
    spec.loader.exec_module(module)
    fn = getattr(module, name)
except BaseException as e:
    proto.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}) + "\n")
    proto.flush()
    sys.exit(1)
proto.write(json.dumps({"ready": True}) + "\n")
proto.flush()
def plain(o):
    return o.item() if hasattr(o, "item") else str(o)
for line in requests:
    results = []
    for item in json.loads(line):
        try:
            r = fn(data_source=item[0], solution_str=item[1], ground_truth=item[2], extra_info=item[3], **kwargs)
            results.append({"dict": r} if isinstance(r, dict) else {"score": float(r)})
        except Exception as e:
            results.append({"error": f"{type(e).__name__}: {e}"})
    proto.write(json.dumps(results, default=plain) + "\n")
    proto.flush()
)PY";

}  // namespace

struct PythonRewardPool::Process : runtime::PythonChild {};

Result<PythonRewardOptions> python_reward_options(const json& cfg) {
  PythonRewardOptions o;
  TESSERA_ASSIGN_OR_RETURN(auto path, config_get<std::optional<std::string>>(cfg, "custom_reward_function.path"));
  TESSERA_ASSIGN_OR_RETURN(o.name, config_get<std::string>(cfg, "custom_reward_function.name"));
  if (const json* kw = config_find(cfg, "custom_reward_function.reward_kwargs"); kw != nullptr && !kw->is_null()) {
    if (!kw->is_object()) {
      return make_error(ErrorCode::invalid_argument, "custom_reward_function.reward_kwargs must be a mapping");
    }
    o.kwargs = *kw;
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t procs, config_get<int64_t>(cfg, "custom_reward_function.processes"));
  TESSERA_ASSIGN_OR_RETURN(double timeout, config_get<double>(cfg, "custom_reward_function.timeout_s"));
  TESSERA_ASSIGN_OR_RETURN(std::string on_error, config_get<std::string>(cfg, "custom_reward_function.on_error"));
  if (procs < 1 || procs > 256) {
    return make_error(ErrorCode::invalid_argument, "custom_reward_function.processes = {} must be in [1, 256]", procs);
  }
  if (!(timeout > 0)) {
    return make_error(ErrorCode::invalid_argument, "custom_reward_function.timeout_s = {} must be > 0", timeout);
  }
  if (on_error != "stop" && on_error != "zero") {
    return make_error(ErrorCode::invalid_argument, "custom_reward_function.on_error = '{}' is not one of: stop, zero",
                      on_error);
  }
  o.processes = static_cast<int>(procs);
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  o.errors_score_zero = on_error == "zero";
  if (!path) return o;
  o.path = *path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.path, ec)) {
    return make_error(ErrorCode::not_found, "custom_reward_function.path: '{}' is not a file", o.path);
  }
  return o;
}

PythonRewardPool::PythonRewardPool(PythonRewardOptions options) : options_(std::move(options)) {
  if (options_.python.empty()) {
    options_.python = runtime::python_from_env("TESSERA_REWARD_PYTHON");
  }
}

PythonRewardPool::~PythonRewardPool() {
  for (size_t i = 0; i < procs_.size(); ++i) stop(i);
  if (!options_.owned_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(options_.owned_dir, ec);
  }
}

void PythonRewardPool::stop(size_t slot) { runtime::kill_child(*procs_[slot]); }

Status PythonRewardPool::spawn(size_t slot) {
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild child,
                           runtime::spawn_python(options_.python, kChildScript,
                                                  {options_.path, options_.name, options_.kwargs.dump()},
                                                  "custom_reward_function"));
  static_cast<runtime::PythonChild&>(*procs_[slot]) = std::move(child);
  return Status();
}

Result<std::shared_ptr<PythonRewardPool>> PythonRewardPool::start(const PythonRewardOptions& options) {
  std::shared_ptr<PythonRewardPool> pool(new PythonRewardPool(options));
  const auto deadline = Clock::now() + pool->options_.timeout;
  for (int i = 0; i < pool->options_.processes; ++i) {
    pool->procs_.push_back(std::make_unique<Process>());
    TESSERA_RETURN_IF_ERROR(pool->spawn(static_cast<size_t>(i)));
  }
  for (auto& p : pool->procs_) {
    auto line = runtime::read_line(*p, deadline);
    json ready = line.ok() ? json::parse(*line, nullptr, false) : json();
    if (ready.is_object() && ready.value("ready", false)) continue;
    std::string why = !line.ok() ? line.status().message()
                      : ready.is_object() && ready.contains("fatal") ? ready["fatal"].get<std::string>()
                                                                     : "unexpected output: " + first_line(*line);
    return make_error(ErrorCode::invalid_argument, "custom_reward_function: cannot load {}() from {}: {}",
                      pool->options_.name, pool->options_.path, why);
  }
  return pool;
}

Result<std::vector<ScoreResult>> PythonRewardPool::score(const std::vector<ScoreRequest>& rows) {
  const size_t n = rows.size(), procs = procs_.size();
  std::vector<ScoreResult> results(n);
  if (n == 0) return results;
  // Contiguous chunks, one per process.
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t k = 0; k < procs; ++k) {
    const size_t begin = n * k / procs, end = n * (k + 1) / procs;
    chunks.emplace_back(begin, end);
  }
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<Status> sent(procs);
  for (size_t k = 0; k < procs; ++k) {
    auto [begin, end] = chunks[k];
    if (begin == end) continue;
    json request = json::array();
    for (size_t i = begin; i < end; ++i) {
      request.push_back(json::array({rows[i].data_source, rows[i].solution_str, rows[i].ground_truth, rows[i].extra_info}));
    }
    sent[k] = procs_[k]->pid > 0
                  ? runtime::write_all(*procs_[k], request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n")
                  : Status(ErrorCode::unavailable, "the process is not running");
  }
  Status first;
  for (size_t k = 0; k < procs; ++k) {
    auto [begin, end] = chunks[k];
    if (begin == end) continue;
    const std::string span = end - begin == 1 ? fmt::format("row {}", begin) : fmt::format("rows {}..{}", begin, end - 1);
    Result<std::string> line = sent[k].ok() ? runtime::read_line(*procs_[k], deadline) : sent[k];
    json answer = line.ok() ? json::parse(*line, nullptr, false) : json();
    if (!line.ok() || !answer.is_array() || answer.size() != end - begin) {
      // Replace the process: it timed out, died or broke the protocol.
      stop(k);
      Status restarted = spawn(k);
      if (restarted.ok()) {
        auto ready = runtime::read_line(*procs_[k], Clock::now() + options_.timeout);
        if (!ready.ok()) stop(k);
      }
      const std::string why = !line.ok() ? (line.status().code() == ErrorCode::timeout
                                                 ? fmt::format("timed out after {} s", options_.timeout.count() / 1000.0)
                                                 : line.status().message())
                                         : "answered something that is not one result per row";
      if (first.ok()) {
        first = Status(line.ok() ? ErrorCode::internal : line.status().code(),
                       fmt::format("custom_reward_function {}: {} (data_source '{}'): {}", options_.name, span,
                                   rows[begin].data_source, why));
      }
      continue;
    }
    for (size_t i = begin; i < end; ++i) {
      const json& r = answer[i - begin];
      if (r.contains("score") && r["score"].is_number()) {
        results[i].score = r["score"].get<double>();
      } else if (r.contains("dict") && r["dict"].is_object() && r["dict"].contains("score") &&
                 r["dict"]["score"].is_number()) {
        results[i].score = r["dict"]["score"].get<double>();
        results[i].dict = true;
        for (const auto& [key, value] : r["dict"].items()) {
          if (key != "score") results[i].extra[key] = value;
        }
      } else {
        const std::string why = r.contains("error") ? r["error"].get<std::string>()
                                : r.contains("dict") ? std::string("returned a dict without a numeric 'score'")
                                                     : std::string("returned no score");
        const std::string msg = fmt::format("custom_reward_function {}: row {} (data_source '{}'): {}", options_.name,
                                            i, rows[i].data_source, first_line(why));
        if (!options_.errors_score_zero) {
          if (first.ok()) first = Status(ErrorCode::invalid_argument, msg);
          continue;
        }
        std::fprintf(stderr, "warning: %s; scored 0 (custom_reward_function.on_error=zero)\n", msg.c_str());
        results[i].score = 0.0;
        results[i].failed = true;
      }
    }
  }
  if (!first.ok()) return first;
  return results;
}

bool is_verl_python_source(std::string_view ds) {
  for (const char* name : {"numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                           "numina_cn_k12", "numina_olympiads", "codecontests", "apps", "codeforces", "taco",
                           "hiyouga/geometry3k"}) {
    if (ds == name) return true;
  }
  return false;
}

Result<SandboxFusionOptions> sandbox_fusion_options(const json& cfg) {
  SandboxFusionOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.url, config_get<std::optional<std::string>>(cfg, "reward_model.sandbox_fusion.url"));
  TESSERA_ASSIGN_OR_RETURN(o.max_concurrent, config_get_or<int64_t>(cfg, "reward_model.sandbox_fusion.max_concurrent", 64));
  TESSERA_ASSIGN_OR_RETURN(o.memory_limit_mb,
                           config_get_or<int64_t>(cfg, "reward_model.sandbox_fusion.memory_limit_mb", 1024));
  if (o.url && o.url->empty()) o.url.reset();
  if (o.max_concurrent < 1) {
    return make_error(ErrorCode::invalid_argument, "reward_model.sandbox_fusion.max_concurrent = {} must be >= 1",
                      o.max_concurrent);
  }
  if (o.memory_limit_mb < 1) {
    return make_error(ErrorCode::invalid_argument, "reward_model.sandbox_fusion.memory_limit_mb = {} must be >= 1",
                      o.memory_limit_mb);
  }
  return o;
}

Result<std::shared_ptr<PythonRewardPool>> start_verl_scorer_pool(PythonRewardOptions options,
                                                                 const std::string& data_source,
                                                                 const SandboxFusionOptions& sandbox) {
  // A small module that re-exports verl's scorer (with the sandbox settings when set), in a
  // directory the pool owns: every process imports it, also one that replaces a timed-out one.
  char dir_template[] = "/tmp/tessera-verl-scorer-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    return make_error(ErrorCode::io_error, "cannot create a temporary directory: {}", std::strerror(errno));
  }
  const std::filesystem::path dir(dir_template), shim = dir / "verl_default_compute_score.py";
  {
    std::ofstream out(shim);
    if (!sandbox.url) {
      out << "from verl.utils.reward_score import default_compute_score as compute_score\n";
    } else {
      // verl's get_custom_reward_fn: default_compute_score with the sandbox's url, memory limit and
      // a semaphore over the requests in flight (verl's is shared by its processes; here each of
      // the pool's processes takes its share). Read from a JSON file beside the module at import.
      const int64_t per_process = std::max<int64_t>(1, sandbox.max_concurrent / std::max(1, options.processes));
      std::ofstream(dir / "sandbox_fusion.json")
          << json{{"url", *sandbox.url}, {"memory_limit_mb", sandbox.memory_limit_mb}, {"max_concurrent", per_process}}.dump();
      out << "import json, os, threading\n"
             "from verl.utils.reward_score import default_compute_score\n"
             "with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'sandbox_fusion.json')) as f:\n"
             "    _SANDBOX = json.load(f)\n"
             "_SEMAPHORE = threading.Semaphore(_SANDBOX['max_concurrent'])\n"
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
             "    return default_compute_score(data_source, solution_str, ground_truth, extra_info,\n"
             "                                 sandbox_fusion_url=_SANDBOX['url'], concurrent_semaphore=_SEMAPHORE,\n"
             "                                 memory_limit_mb=_SANDBOX['memory_limit_mb'], **kwargs)\n";
    }
  }
  options.path = shim.string();
  options.name = "compute_score";
  options.kwargs = json::object();  // reward_kwargs are the custom function's (verl passes none to its own)
  options.owned_dir = dir.string();
  auto pool = PythonRewardPool::start(options);  // a pool that fails to start removes the directory too
  if (!pool.ok()) {
    return make_error(ErrorCode::unimplemented,
                      "data_source '{}' is scored by verl's Python (sympy, code execution or mathruler), which does not "
                      "load here ({}): install verl for the reward interpreter ($TESSERA_REWARD_PYTHON, else python3) or "
                      "set custom_reward_function.path",
                      data_source, pool.status().message());
  }
  return pool;
}

}  // namespace tessera::driver
