// demo_task.cpp: deterministic generation of the demo's addition datasets (see demo_task.hpp).
#include "driver/demo_task.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <utility>

#include <unistd.h>

namespace tessera::driver {
namespace {

int64_t pow10(int64_t digits) {
  int64_t v = 1;
  for (int64_t i = 0; i < digits; ++i) v *= 10;
  return v;
}

// Uniform in [0, n) by modulo: the bias (< n / 2^64) is irrelevant here, and unlike
// std::uniform_int_distribution the result is the same on every standard library.
int64_t uniform(std::mt19937_64& g, int64_t n) { return static_cast<int64_t>(g() % static_cast<uint64_t>(n)); }

// Uniform in [0, 1) with 53 random bits.
double unit(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0); }

Status write_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error(ErrorCode::io_error, "{}: cannot open for writing", tmp.string());
    out << text;
    out.flush();
    if (!out) return make_error(ErrorCode::io_error, "{}: write failed", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: rename failed: {}", path.string(), ec.message());
  return Status();
}

std::string jsonl(const std::vector<nlohmann::json>& rows) {
  std::string out;
  for (const auto& r : rows) out += r.dump() + "\n";
  return out;
}

// SFT rows; with noise > 0 a fraction of the responses is a random number in [0, 2*10^d - 1).
std::vector<nlohmann::json> sft_rows(const std::vector<ArithProblem>& problems, int64_t digits, double noise,
                                     uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<nlohmann::json> rows;
  rows.reserve(problems.size());
  for (const auto& p : problems) {
    std::string response = p.answer();
    if (noise > 0 && unit(g) < noise) response = std::to_string(uniform(g, 2 * pow10(digits) - 1));
    rows.push_back({{"prompt", p.question()}, {"response", response}});
  }
  return rows;
}

std::vector<nlohmann::json> rl_rows(const std::vector<ArithProblem>& problems, const std::string& split) {
  std::vector<nlohmann::json> rows;
  rows.reserve(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) rows.push_back(rl_row(problems[i], split, static_cast<int64_t>(i)));
  return rows;
}

}  // namespace

std::string ArithProblem::question() const { return std::to_string(a) + "+" + std::to_string(b) + "="; }

std::string ArithProblem::answer() const { return std::to_string(a + b); }

std::vector<ArithProblem> make_problems(int64_t count, int64_t digits, uint64_t seed,
                                        const std::vector<ArithProblem>& exclude, bool distinct) {
  std::set<std::pair<int64_t, int64_t>> skip;
  for (const auto& p : exclude) skip.insert({p.a, p.b});
  std::mt19937_64 g(seed);
  const int64_t hi = pow10(digits);
  std::vector<ArithProblem> out;
  out.reserve(static_cast<size_t>(count));
  while (static_cast<int64_t>(out.size()) < count) {
    ArithProblem p{uniform(g, hi), uniform(g, hi)};
    if (skip.count({p.a, p.b})) continue;
    if (distinct) skip.insert({p.a, p.b});
    out.push_back(p);
  }
  return out;
}

nlohmann::json rl_row(const ArithProblem& p, const std::string& split, int64_t index) {
  return {{"data_source", kDemoDataSource},
          {"prompt", nlohmann::json::array({{{"role", "user"}, {"content", p.question()}}})},
          {"ability", "math"},
          {"reward_model", {{"style", "rule"}, {"ground_truth", p.answer()}}},
          {"extra_info", {{"split", split}, {"index", index}}}};
}

Status validate_demo_task_options(const DemoTaskOptions& o) {
  if (o.digits < 1 || o.digits > 6) return make_error(ErrorCode::invalid_argument, "demo.digits: {} not in [1, 6]", o.digits);
  const std::pair<const char*, int64_t> sizes[] = {{"demo.rl_train_size", o.rl_train_size},
                                                   {"demo.rl_val_size", o.rl_val_size},
                                                   {"demo.sft_train_size", o.sft_train_size},
                                                   {"demo.sft_val_size", o.sft_val_size}};
  for (const auto& [key, v] : sizes) {
    if (v < 1) return make_error(ErrorCode::invalid_argument, "{}: {} must be >= 1", key, v);
  }
  if (!(o.sft_noise >= 0.0 && o.sft_noise < 1.0)) {
    return make_error(ErrorCode::invalid_argument, "demo.sft_noise: {} not in [0, 1)", o.sft_noise);
  }
  const int64_t space = pow10(o.digits) * pow10(o.digits);
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"demo.rl_val_size", o.rl_val_size},
                               std::pair<const char*, int64_t>{"demo.sft_val_size", o.sft_val_size}}) {
    if (v > space) {
      return make_error(ErrorCode::invalid_argument, "{}: {} exceeds the {} distinct problems with {} digit(s)", key, v,
                        space, o.digits);
    }
  }
  return Status();
}

bool holds_out_validation(const DemoTaskOptions& o) {
  return pow10(o.digits) * pow10(o.digits) >= 4 * (o.rl_val_size + o.sft_val_size);
}

Status write_demo_datasets(const DemoTaskOptions& o, const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(validate_demo_task_options(o));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: cannot create directory: {}", dir, ec.message());
  // Validation problems first; when the problem space is large enough the training sets exclude
  // them (generalisation, not recall). make_problems draws with replacement, so duplicates of a
  // validation problem are removed by the exclusion as well.
  std::vector<ArithProblem> rl_val = make_problems(o.rl_val_size, o.digits, o.seed * 4 + 1, {}, /*distinct=*/true);
  std::vector<ArithProblem> sft_val = make_problems(o.sft_val_size, o.digits, o.seed * 4 + 5, {}, /*distinct=*/true);
  std::vector<ArithProblem> val = rl_val;
  val.insert(val.end(), sft_val.begin(), sft_val.end());
  const std::vector<ArithProblem> none;
  const auto& exclude = holds_out_validation(o) ? val : none;
  auto rl_train = make_problems(o.rl_train_size, o.digits, o.seed * 4 + 2, exclude);
  auto sft_train = make_problems(o.sft_train_size, o.digits, o.seed * 4 + 3, exclude);
  const std::filesystem::path d(dir);
  TESSERA_RETURN_IF_ERROR(write_atomic(d / "rl_train.jsonl", jsonl(rl_rows(rl_train, "train"))));
  TESSERA_RETURN_IF_ERROR(write_atomic(d / "rl_val.jsonl", jsonl(rl_rows(rl_val, "test"))));
  TESSERA_RETURN_IF_ERROR(write_atomic(d / "sft_train.jsonl", jsonl(sft_rows(sft_train, o.digits, o.sft_noise, o.seed * 4 + 4))));
  TESSERA_RETURN_IF_ERROR(write_atomic(d / "sft_val.jsonl", jsonl(sft_rows(sft_val, o.digits, 0.0, 0))));
  return Status();
}

}  // namespace tessera::driver
