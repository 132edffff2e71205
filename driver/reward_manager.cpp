// NaiveRewardManager (driver/reward.hpp), after verl/workers/reward_manager/naive.py.
#include <algorithm>
#include <cstdio>
#include <set>

#include <torch/torch.h>

#include "driver/config.hpp"
#include "driver/reward.hpp"

namespace tessera::driver {
namespace {

// The ids of row `i` of a [B, L] int tensor over columns [begin, end).
std::vector<int32_t> row_ids(const at::Tensor& t, int64_t i, int64_t begin, int64_t end) {
  at::Tensor r = t[i].slice(0, begin, end).to(torch::kInt32).contiguous();
  const int32_t* p = r.data_ptr<int32_t>();
  return std::vector<int32_t>(p, p + r.numel());
}

}  // namespace

Result<RewardManagerOptions> reward_manager_options(const nlohmann::json& cfg) {
  RewardManagerOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.reward_fn_key, config_get<std::string>(cfg, "data.reward_fn_key"));
  TESSERA_ASSIGN_OR_RETURN(o.kind, config_get<std::string>(cfg, "reward_model.reward_manager"));
  if (o.kind != "naive" && o.kind != "batch" && o.kind != "prime" && o.kind != "dapo") {
    return make_error(ErrorCode::invalid_argument,
                      "reward_model.reward_manager = '{}' is not one of: naive, batch, prime, dapo", o.kind);
  }
  const nlohmann::json* kwargs = config_find(cfg, "reward_model.reward_kwargs");
  // verl's DAPO recipe: reward_model.overlong_buffer, with max_resp_len = data.max_response_length.
  TESSERA_ASSIGN_OR_RETURN(bool recipe_overlong, config_get_or<bool>(cfg, "reward_model.overlong_buffer.enable", false));
  if (recipe_overlong) {
    const std::string b = "reward_model.overlong_buffer";
    if (o.kind != "dapo") {
      return make_error(ErrorCode::invalid_argument, "{}.enable=true needs reward_model.reward_manager=dapo (it is '{}')",
                        b, o.kind);
    }
    for (const char* key : {"overlong_buffer_cfg", "max_resp_len"}) {
      if (kwargs != nullptr && kwargs->is_object() && kwargs->contains(key)) {
        return make_error(ErrorCode::invalid_argument, "{} (with data.max_response_length) and "
                          "reward_model.reward_kwargs.{} are both set; keep one", b, key);
      }
    }
    o.overlong.enable = true;
    TESSERA_ASSIGN_OR_RETURN(o.overlong.len, config_get<int64_t>(cfg, b + ".len"));
    TESSERA_ASSIGN_OR_RETURN(o.overlong.penalty_factor, config_get<double>(cfg, b + ".penalty_factor"));
    TESSERA_ASSIGN_OR_RETURN(o.overlong.log, config_get<bool>(cfg, b + ".log"));
    TESSERA_ASSIGN_OR_RETURN(o.max_resp_len, config_get<int64_t>(cfg, "data.max_response_length"));
    if (o.overlong.len <= 0 || o.overlong.len > o.max_resp_len) {
      return make_error(ErrorCode::invalid_argument, "{}.len = {} must lie in (0, data.max_response_length = {}]", b,
                        o.overlong.len, o.max_resp_len);
    }
  }
  if (kwargs == nullptr || kwargs->is_null()) return o;
  const std::string k = "reward_model.reward_kwargs";
  for (const auto& [name, value] : kwargs->items()) {
    if (name != "max_resp_len" && name != "overlong_buffer_cfg") {
      return make_error(ErrorCode::invalid_argument, "{}.{}: unknown reward manager argument (known: max_resp_len, "
                        "overlong_buffer_cfg)", k, name);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(auto max_len, config_get_or<std::optional<int64_t>>(cfg, k + ".max_resp_len", std::nullopt));
  o.max_resp_len = max_len.value_or(o.max_resp_len);
  if (kwargs->contains("overlong_buffer_cfg")) {
    if (o.kind != "dapo") {
      return make_error(ErrorCode::invalid_argument, "{}.overlong_buffer_cfg needs reward_model.reward_manager=dapo "
                        "(it is '{}')", k, o.kind);
    }
    const std::string b = k + ".overlong_buffer_cfg";
    TESSERA_ASSIGN_OR_RETURN(o.overlong.enable, config_get_or<bool>(cfg, b + ".enable", false));
    TESSERA_ASSIGN_OR_RETURN(o.overlong.len, config_get_or<int64_t>(cfg, b + ".len", 0));
    TESSERA_ASSIGN_OR_RETURN(o.overlong.penalty_factor, config_get_or<double>(cfg, b + ".penalty_factor", 1.0));
    TESSERA_ASSIGN_OR_RETURN(o.overlong.log, config_get_or<bool>(cfg, b + ".log", false));
    if (o.overlong.enable && (o.max_resp_len <= 0 || o.overlong.len <= 0 || o.overlong.len > o.max_resp_len)) {
      return make_error(ErrorCode::invalid_argument, "{}: the overlong buffer needs {}.max_resp_len > 0 and 0 < len <= "
                        "max_resp_len (got max_resp_len {}, len {})", b, k, o.max_resp_len, o.overlong.len);
    }
  }
  return o;
}

NaiveRewardManager::NaiveRewardManager(tokenizer::Tokenizer tokenizer, ScorerRegistry scorers, RewardManagerOptions options)
    : tokenizer_(std::move(tokenizer)), scorers_(std::move(scorers)), options_(std::move(options)) {}

Result<RewardOutput> NaiveRewardManager::operator()(const proto::DataProto& data) const {
  RewardOutput out;
  if (auto rm = data.tensor("rm_scores"); rm.ok()) {
    out.reward_tensor = *rm;
    return out;
  }
  TESSERA_ASSIGN_OR_RETURN(at::Tensor prompts, data.tensor("prompts"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, data.tensor("responses"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor attention_mask, data.tensor("attention_mask"));
  TESSERA_ASSIGN_OR_RETURN(proto::Column sources, data.column(options_.reward_fn_key));
  TESSERA_ASSIGN_OR_RETURN(proto::Column reward_model, data.column("reward_model"));
  auto extra = data.column("extra_info");
  auto turns = data.column("__num_turns__");
  const int64_t b = responses.size(0), p = prompts.size(1), r = responses.size(1);
  if (sources.type() != proto::ColumnType::string || reward_model.type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "reward: column '{}' must hold strings and 'reward_model' JSON",
                      options_.reward_fn_key);
  }
  const bool dapo = options_.kind == "dapo";
  try {
    out.reward_tensor = torch::zeros({b, r}, torch::kFloat32);
    const at::Tensor prompt_lens = attention_mask.slice(1, 0, p).sum(-1).to(torch::kCPU, torch::kInt64).contiguous();
    const at::Tensor resp_lens = attention_mask.slice(1, p).sum(-1).to(torch::kCPU, torch::kInt64).contiguous();
    static const nlohmann::json kNull;
    // Decode every row, then score: one call for a batch scorer, one per row otherwise.
    std::vector<ScoreRequest> requests;
    std::vector<std::string> where;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t valid_resp = resp_lens.data_ptr<int64_t>()[i];
      const std::string& ds = sources.str(i);
      where.push_back(fmt::format("reward: row {} (data_source '{}')", i, ds));
      auto response = tokenizer_.decode(row_ids(responses, i, 0, valid_resp), {/*skip_special_tokens=*/true, true});
      if (!response.ok()) return response.status().with_context(where.back());
      const nlohmann::json& rm = reward_model.json_value(i);
      if (!rm.is_object() || !rm.contains("ground_truth")) {
        return make_error(ErrorCode::invalid_argument, "{}: reward_model has no ground_truth", where.back());
      }
      nlohmann::json info = extra.ok() && extra->type() == proto::ColumnType::json ? extra->json_value(i) : kNull;
      if (turns.ok() && turns->type() == proto::ColumnType::int64) {  // verl's naive manager adds it
        if (info.is_null()) info = nlohmann::json::object();
        if (info.is_object()) info["num_turns"] = turns->i64(i);
      }
      requests.push_back({ds, std::move(response).value(), rm["ground_truth"], std::move(info)});
    }
    std::vector<ScoreResult> scores;
    if (options_.batch_scorer) {
      TESSERA_ASSIGN_OR_RETURN(scores, options_.batch_scorer(requests));
      if (static_cast<int64_t>(scores.size()) != b) {
        return make_error(ErrorCode::internal, "reward: the batch scorer answered {} scores for {} rows", scores.size(), b);
      }
    } else {
      scores.resize(static_cast<size_t>(b));
      std::vector<size_t> fallback_rows;  // no native scorer: verl's Python scorers, one call
      std::vector<ScoreRequest> fallback;
      for (int64_t i = 0; i < b; ++i) {
        const ScoreRequest& q = requests[static_cast<size_t>(i)];
        auto scorer = scorers_.find(q.data_source);
        if (!scorer.ok() && options_.fallback_scorer) {
          fallback_rows.push_back(static_cast<size_t>(i));
          fallback.push_back(q);
          continue;
        }
        if (!scorer.ok()) return scorer.status().with_context(where[static_cast<size_t>(i)]);
        auto score = (*scorer)(ScoreInput{q.data_source, q.solution_str, q.ground_truth, q.extra_info});
        if (!score.ok()) return score.status().with_context(where[static_cast<size_t>(i)]);
        scores[static_cast<size_t>(i)] = std::move(score).value();
      }
      if (!fallback.empty()) {
        TESSERA_ASSIGN_OR_RETURN(std::vector<ScoreResult> more, options_.fallback_scorer(fallback));
        if (more.size() != fallback.size()) {
          return make_error(ErrorCode::internal, "reward: the Python scorers answered {} scores for {} rows", more.size(),
                            fallback.size());
        }
        for (size_t k = 0; k < more.size(); ++k) scores[fallback_rows[k]] = std::move(more[k]);
      }
    }
    // The extra-info keys the scored rows answered; a row that failed (on_error=zero) gets them too.
    std::set<std::string> extra_keys;
    bool extras = false;
    for (const ScoreResult& r : scores) {
      if (r.failed) continue;
      extras |= r.dict || !r.extra.empty();
      for (const auto& [key, value] : r.extra.items()) extra_keys.insert(key);
    }
    std::map<std::string, int64_t> printed;
    for (int64_t i = 0; i < b; ++i) {
      const ScoreRequest& q = requests[static_cast<size_t>(i)];
      const ScoreResult& score = scores[static_cast<size_t>(i)];
      const int64_t valid_resp = resp_lens.data_ptr<int64_t>()[i];
      if (score.failed && extras) {
        out.reward_extra_info["score"].push_back(score.score);
        for (const std::string& key : extra_keys) out.reward_extra_info[key].push_back(nullptr);
      } else if (score.dict || !score.extra.empty()) {  // verl: every key of a dict answer, "score" included
        out.reward_extra_info["score"].push_back(score.score);
        for (const auto& [k, v] : score.extra.items()) out.reward_extra_info[k].push_back(v);
      } else if (dapo) {
        out.reward_extra_info["acc"].push_back(score.score);
      }
      double reward = score.score;
      if (dapo && options_.overlong.enable) {
        const OverlongBuffer& o = options_.overlong;
        const int64_t exceed = valid_resp - (options_.max_resp_len - o.len);
        const double penalty = std::min(-static_cast<double>(exceed) / static_cast<double>(o.len) * o.penalty_factor, 0.0);
        reward += penalty;
        if (o.log) {
          out.reward_extra_info["overlong_reward"].push_back(penalty);
          out.reward_extra_info["overlong"].push_back(penalty < 0);
        }
      }
      // verl writes at valid_response_length - 1; Python's -1 is the last column.
      out.reward_tensor[i][valid_resp > 0 ? valid_resp - 1 : r - 1] = reward;
      if (printed[q.data_source]++ < options_.num_examine) {
        const int64_t valid_prompt = prompt_lens.data_ptr<int64_t>()[i];
        auto prompt = tokenizer_.decode(row_ids(prompts, i, p - valid_prompt, p), {true, true});
        std::fprintf(stderr, "[prompt] %s\n[response] %s\n[ground_truth] %s\n[score] %g\n",
                     prompt.ok() ? prompt->c_str() : "?", q.solution_str.c_str(), q.ground_truth.dump().c_str(),
                     score.score);
      }
    }
  } catch (const c10::Error& e) {
    return make_error(ErrorCode::invalid_argument, "reward: bad tensor shapes: {}", e.what_without_backtrace());
  }
  for (const auto& [k, v] : out.reward_extra_info) {
    if (static_cast<int64_t>(v.size()) != b) {
      return make_error(ErrorCode::invalid_argument,
                        "reward: reward_extra_info '{}' has {} values for {} rows (scorers disagree on extra keys)", k,
                        v.size(), b);
    }
  }
  return out;
}

}  // namespace tessera::driver
