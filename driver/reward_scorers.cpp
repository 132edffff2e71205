// Rule-based scorers and their registry (driver/reward.hpp).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "driver/reward.hpp"
#include "driver/reward_math.hpp"

namespace tessera::driver {
namespace {

constexpr size_t kSolutionClipChars = 300;  // verl gsm8k: only the tail is searched
constexpr const char* kMathDapo = "math_dapo";

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_number_char(char c) { return is_digit(c) || c == '.' || c == ','; }

// The last `n` code points of UTF-8 text (Python's s[-n:]).
std::string_view last_code_points(std::string_view s, size_t n) {
  size_t count = 0, i = s.size();
  while (i > 0) {
    --i;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && ++count == n) return s.substr(i);
  }
  return s;
}

// Python re.findall(r"\-?[0-9\.\,]+", s), optionally anchored after a literal prefix.
std::vector<std::string> find_numbers(std::string_view s, std::string_view prefix) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, prefix.size(), prefix) != 0) {
      ++i;
      continue;
    }
    size_t j = i + prefix.size();
    size_t start = j;
    if (j < s.size() && s[j] == '-' && j + 1 < s.size() && is_number_char(s[j + 1])) ++j;
    size_t k = j;
    while (k < s.size() && is_number_char(s[k])) ++k;
    if (k == j) {
      ++i;
      continue;
    }
    out.emplace_back(s.substr(start, k - start));
    i = k;
  }
  return out;
}

std::string strip(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

Result<std::string> ground_truth_text(const ScoreInput& in) {
  if (in.ground_truth.is_string()) return in.ground_truth.get<std::string>();
  if (in.ground_truth.is_number_integer()) return std::to_string(in.ground_truth.get<int64_t>());
  if (in.ground_truth.is_number()) return in.ground_truth.dump();
  return make_error(ErrorCode::invalid_argument, "data_source '{}': reward_model.ground_truth must be a string or number, got {}",
                    in.data_source, in.ground_truth.dump());
}

ScoreFn gsm8k_scorer(Gsm8kMethod method) {
  return [method](const ScoreInput& in) -> Result<ScoreResult> {
    TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
    return ScoreResult{gsm8k_compute_score(in.solution_str, gt, method), nlohmann::json::object()};
  };
}

Result<ScoreResult> exact_match(const ScoreInput& in) {
  TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
  return ScoreResult{strip(in.solution_str) == strip(gt) ? 1.0 : 0.0, nlohmann::json::object()};
}

Result<ScoreResult> numeric(const ScoreInput& in) {
  TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
  std::optional<double> want = last_number(gt);
  if (!want) {
    return make_error(ErrorCode::invalid_argument, "data_source '{}': ground_truth '{}' is not a number", in.data_source, gt);
  }
  std::optional<double> got = last_number(in.solution_str);
  return ScoreResult{got && *got == *want ? 1.0 : 0.0, nlohmann::json::object()};
}

Result<ScoreResult> arith(const ScoreInput& in) {
  TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
  std::optional<int64_t> want = first_integer(gt);
  if (!want) {
    return make_error(ErrorCode::invalid_argument, "data_source '{}': ground_truth '{}' is not an integer", in.data_source, gt);
  }
  std::optional<int64_t> got = first_integer(in.solution_str);
  double score = got && *got == *want ? 1.0 : 0.0;
  return ScoreResult{score, {{"acc", score == 1.0}, {"pred", got ? std::to_string(*got) : std::string()}}};
}

}  // namespace

std::optional<std::string> gsm8k_extract_solution(std::string_view solution_str, Gsm8kMethod method) {
  std::string_view s = last_code_points(solution_str, kSolutionClipChars);
  if (method == Gsm8kMethod::strict) {
    auto found = find_numbers(s, "#### ");
    if (found.empty()) return std::nullopt;
    std::string answer = found.back();
    answer.erase(std::remove_if(answer.begin(), answer.end(), [](char c) { return c == ',' || c == '$'; }), answer.end());
    return answer;
  }
  auto found = find_numbers(s, "");
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    if (*it != "" && *it != ".") return *it;
  }
  // verl's loop leaves the last candidate (the first element) when all are invalid.
  if (!found.empty()) return found.front();
  return std::nullopt;
}

double gsm8k_compute_score(std::string_view solution_str, std::string_view ground_truth, Gsm8kMethod method,
                           double format_score, double score) {
  std::optional<std::string> answer = gsm8k_extract_solution(solution_str, method);
  if (!answer) return 0.0;
  return *answer == ground_truth ? score : format_score;
}

std::optional<double> last_number(std::string_view text) {
  std::optional<double> last;
  size_t i = 0;
  while (i < text.size()) {
    if (!is_digit(text[i])) {
      ++i;
      continue;
    }
    size_t start = i;
    bool negative = start > 0 && text[start - 1] == '-';
    std::string digits;
    while (i < text.size() && (is_digit(text[i]) || (text[i] == ',' && i + 1 < text.size() && is_digit(text[i + 1])))) {
      if (text[i] != ',') digits += text[i];
      ++i;
    }
    if (i + 1 < text.size() && text[i] == '.' && is_digit(text[i + 1])) {
      digits += '.';
      ++i;
      while (i < text.size() && is_digit(text[i])) digits += text[i++];
    }
    double v = std::strtod(digits.c_str(), nullptr);
    last = negative ? -v : v;
  }
  return last;
}

std::optional<int64_t> first_integer(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!is_digit(text[i])) continue;
    size_t j = i;
    while (j < text.size() && is_digit(text[j])) ++j;
    std::string digits(text.substr(i, std::min<size_t>(j - i, 18)));  // stay inside int64
    int64_t v = std::strtoll(digits.c_str(), nullptr, 10);
    return i > 0 && text[i - 1] == '-' ? -v : v;
  }
  return std::nullopt;
}

ScorerRegistry ScorerRegistry::with_builtins() {
  ScorerRegistry r;
  r.scorers_["openai/gsm8k"] = gsm8k_scorer(Gsm8kMethod::strict);
  r.scorers_["gsm8k"] = gsm8k_scorer(Gsm8kMethod::strict);
  r.scorers_["gsm8k_flexible"] = gsm8k_scorer(Gsm8kMethod::flexible);
  r.scorers_["exact_match"] = exact_match;
  r.scorers_["numeric"] = numeric;
  r.scorers_["tessera/arith"] = arith;
  // verl's default_compute_score sources with a rule scorer (driver/reward_math.hpp).
  ScoreFn math = [](const ScoreInput& in) -> Result<ScoreResult> {
    TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
    return ScoreResult{math_compute_score(in.solution_str, gt), nlohmann::json::object()};
  };
  for (const char* name : {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"}) {
    r.scorers_[name] = math;
  }
  r.scorers_[kMathDapo] = [](const ScoreInput& in) -> Result<ScoreResult> {
    TESSERA_ASSIGN_OR_RETURN(std::string gt, ground_truth_text(in));
    nlohmann::json res = math_dapo_compute_score(in.solution_str, gt);
    return ScoreResult{res["score"].get<double>(), {{"acc", res["acc"]}, {"pred", res["pred"]}}};
  };
  ScoreFn search_r1 = [](const ScoreInput& in) -> Result<ScoreResult> {
    std::optional<double> score = search_r1_compute_score(in.solution_str, in.ground_truth);
    if (!score) {
      return make_error(ErrorCode::invalid_argument,
                        "data_source '{}': reward_model.ground_truth must be an object whose \"target\" is a string or "
                        "a list of strings, got {}", in.data_source, in.ground_truth.dump());
    }
    return ScoreResult{*score, nlohmann::json::object()};
  };
  for (const char* name : {"searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                           "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"}) {
    r.scorers_[name] = search_r1;
  }
  return r;
}

Status ScorerRegistry::add(const std::string& data_source, ScoreFn fn) {
  if (!fn) return make_error(ErrorCode::invalid_argument, "scorer for '{}' is empty", data_source);
  if (!scorers_.emplace(data_source, std::move(fn)).second) {
    return make_error(ErrorCode::already_exists, "a scorer for data_source '{}' is already registered", data_source);
  }
  return Status();
}

Result<ScoreFn> ScorerRegistry::find(std::string_view data_source) const {
  auto it = scorers_.find(data_source);
  // verl scores every data_source starting with "aime" as math_dapo.
  if (it == scorers_.end() && data_source.substr(0, 4) == "aime") it = scorers_.find(std::string_view(kMathDapo));
  if (it == scorers_.end()) {
    return make_error(ErrorCode::not_found, "no reward scorer for data_source '{}' (known: {})", data_source,
                      fmt::join(names(), ", "));
  }
  return it->second;
}

std::vector<std::string> ScorerRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : scorers_) out.push_back(k);
  return out;
}

}  // namespace tessera::driver
