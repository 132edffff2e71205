// reward.hpp: rule-based scorers chosen by data_source, and verl's NaiveRewardManager.
//
// A scorer maps (data_source, solution_str, ground_truth, extra_info) to a score; it may also
// return extra named values (verl: a dict with "score" plus other keys), which become
// reward_extra_info columns. Built-in scorers (ScorerRegistry::with_builtins):
//   "openai/gsm8k", "gsm8k"   verl's gsm8k.compute_score, method strict (last "#### N" in the
//                             final 300 characters; ',' and '$' removed), format_score 0, score 1
//   "gsm8k_flexible"          the same with method flexible (the last number in the text)
//   "exact_match"             1.0 when the trimmed response equals the trimmed ground truth
//   "numeric"                 1.0 when the last number in the response equals the ground truth
//                             numerically (thousands commas allowed, "3.0" == 3)
//   "tessera/arith"           the built-in demo task: 1.0 when the response's first integer
//                             equals ground_truth, else 0.0; returns {score, acc, pred}
//   "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"
//                             verl's math.compute_score (the last \boxed{} answer, is_equiv)
//   "math_dapo", "aime*"      verl's math_dapo.compute_score ("Answer:" line, minerva
//                             normalisation); returns {score (+1/-1), acc, pred}
//   "searchR1_nq", ...        verl's search_r1_like_qa_em (exact match in <answer> tags) for the
//                             seven searchR1_* sources
// (driver/reward_math.hpp; checked against verl's own Python.) Sources whose verl scorers need
// sympy or code execution (prime_math, prime_code, sandbox) and geo3k (mathruler) have no
// native scorer: score them with custom_reward_function (driver/python_reward.hpp).
// An unknown data_source is an error naming it (never a silent zero).
//
// NaiveRewardManager (verl/workers/reward_manager/naive.py): if the batch holds `rm_scores`
// they are returned; otherwise, per row: decode the valid prompt / response tokens (skipping
// special tokens), score by the row's data_source (column data.reward_fn_key) with
// reward_model.ground_truth and extra_info, and write the score at the last valid response token
// of a float32 [B, response_len] tensor (index -1, i.e. the last column, when the response is
// empty: verl's Python indexing).
//
// Thread-safety: a ScorerRegistry is read-only after setup; scorers must be pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {

/// What a scorer sees for one sample.
struct ScoreInput {
  std::string_view data_source;
  std::string_view solution_str;    ///< The decoded response.
  const nlohmann::json& ground_truth;  ///< reward_model.ground_truth (string or number).
  const nlohmann::json& extra_info;    ///< The row's extra_info (null when absent).
};

/// A scorer's answer: the score, plus extra values (a JSON object; empty for a plain float).
struct ScoreResult {
  double score = 0.0;
  nlohmann::json extra = nlohmann::json::object();  ///< verl's dict keys other than "score".
  /// The scorer answered verl's dict form: "score" is then an extra info too, even alone.
  bool dict = false;
  /// The scorer raised and the row scored 0 (custom_reward_function.on_error=zero): its extra
  /// infos are the other rows' keys, "score" 0 and null for the rest.
  bool failed = false;
};

/// A scoring function. Errors (e.g. a ground truth of the wrong type) name the sample's fields.
using ScoreFn = std::function<Result<ScoreResult>(const ScoreInput&)>;

/// One row for a batch scorer (owning copies of ScoreInput's fields).
struct ScoreRequest {
  std::string data_source;
  std::string solution_str;
  nlohmann::json ground_truth;
  nlohmann::json extra_info;
};

/// Scores a whole batch at once (custom_reward_function's Python pool). Errors name the row.
using BatchScoreFn = std::function<Result<std::vector<ScoreResult>>(const std::vector<ScoreRequest>&)>;

/// data_source -> scorer.
class ScorerRegistry {
 public:
  /// An empty registry.
  ScorerRegistry() = default;
  /// The built-in scorers listed in the header comment.
  static ScorerRegistry with_builtins();

  /// Registers `fn` for `data_source`; already_exists if the name is taken.
  Status add(const std::string& data_source, ScoreFn fn);
  /// The scorer for `data_source`; not_found names it and the known names.
  Result<ScoreFn> find(std::string_view data_source) const;
  /// Registered names, sorted.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, ScoreFn, std::less<>> scorers_;
};

/// verl's gsm8k extraction methods.
enum class Gsm8kMethod { strict, flexible };

/// verl's gsm8k.extract_solution (None -> nullopt).
std::optional<std::string> gsm8k_extract_solution(std::string_view solution_str, Gsm8kMethod method);

/// verl's gsm8k.compute_score: 0 if nothing is extracted, `score` if the extracted answer equals
/// `ground_truth` (as strings), else `format_score`.
double gsm8k_compute_score(std::string_view solution_str, std::string_view ground_truth,
                           Gsm8kMethod method = Gsm8kMethod::strict, double format_score = 0.0, double score = 1.0);

/// The last number in `text` ("-1,234.5" -> -1234.5), or nullopt.
std::optional<double> last_number(std::string_view text);
/// The first integer in `text` ("-12" -> -12), or nullopt.
std::optional<int64_t> first_integer(std::string_view text);

/// What NaiveRewardManager returns (verl: reward_tensor + reward_extra_info with return_dict).
struct RewardOutput {
  at::Tensor reward_tensor;  ///< float32 [B, response_len]
  /// Per extra key, one value per row (verl's defaultdict(list)); includes "score" when the
  /// scorer returned extra values.
  std::map<std::string, std::vector<nlohmann::json>> reward_extra_info;
};

/// DAPO's overlong buffer (reward_model.reward_kwargs.overlong_buffer_cfg): responses longer
/// than max_resp_len - len lose up to penalty_factor, linearly over the last `len` tokens.
struct OverlongBuffer {
  bool enable = false;
  int64_t len = 0;
  double penalty_factor = 1.0;
  bool log = false;  ///< Adds reward extra infos overlong_reward and overlong.
};

/// Options of the reward manager (reward_model.reward_manager and reward_kwargs).
struct RewardManagerOptions {
  int64_t num_examine = 0;                   ///< Rows printed per data source (stderr).
  std::string reward_fn_key = "data_source";  ///< data.reward_fn_key.
  /// naive | batch | prime (the same scores for Tessera's scorers: verl's batch and prime
  /// managers differ only in how they call a Python compute_score), or dapo: a plain-float score
  /// is also reported as extra info "acc", and the overlong buffer applies.
  std::string kind = "naive";
  OverlongBuffer overlong;
  int64_t max_resp_len = 0;  ///< reward_kwargs.max_resp_len (required by the overlong buffer).
  /// When set (custom_reward_function), it scores every row, one call per batch, instead of the
  /// data_source scorers.
  BatchScoreFn batch_scorer;
  /// When set, the rows whose data_source has no native scorer go to it, one call per batch
  /// (verl's Python default_compute_score: python_reward.hpp).
  BatchScoreFn fallback_scorer;
};

/// The options from a loaded PPO config: reward_model.reward_manager, reward_model.reward_kwargs
/// (max_resp_len, overlong_buffer_cfg) and data.reward_fn_key. Errors name the key.
Result<RewardManagerOptions> reward_manager_options(const nlohmann::json& cfg);

/// verl's NaiveRewardManager (and its batch, prime and dapo siblings: RewardManagerOptions::kind).
class NaiveRewardManager {
 public:
  NaiveRewardManager(tokenizer::Tokenizer tokenizer, ScorerRegistry scorers, RewardManagerOptions options = {});

  /// Scores `data`, which needs tensors prompts [B,P], responses [B,R], attention_mask [B,P+R]
  /// and columns <reward_fn_key> (strings) and reward_model (JSON with ground_truth); extra_info
  /// is optional. Errors name the missing key, the row and its data_source.
  Result<RewardOutput> operator()(const proto::DataProto& data) const;

 private:
  tokenizer::Tokenizer tokenizer_;
  ScorerRegistry scorers_;
  RewardManagerOptions options_;
};

}  // namespace tessera::driver
