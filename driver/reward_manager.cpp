// NaiveRewardManager (driver/reward.hpp), after verl/workers/reward_manager/naive.py.
#include <cstdio>

#include <torch/torch.h>

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
  const int64_t b = responses.size(0), p = prompts.size(1), r = responses.size(1);
  if (sources.type() != proto::ColumnType::string || reward_model.type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "reward: column '{}' must hold strings and 'reward_model' JSON",
                      options_.reward_fn_key);
  }
  try {
    out.reward_tensor = torch::zeros({b, r}, torch::kFloat32);
    at::Tensor mask_sums_prompt = attention_mask.slice(1, 0, p).sum(-1).to(torch::kInt64);
    at::Tensor mask_sums_resp = attention_mask.slice(1, p).sum(-1).to(torch::kInt64);
    std::map<std::string, int64_t> printed;
    static const nlohmann::json kNull;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t valid_prompt = mask_sums_prompt[i].item<int64_t>();
      const int64_t valid_resp = mask_sums_resp[i].item<int64_t>();
      const std::string& ds = sources.str(i);
      std::string where = fmt::format("reward: row {} (data_source '{}')", i, ds);
      auto response = tokenizer_.decode(row_ids(responses, i, 0, valid_resp), {/*skip_special_tokens=*/true, true});
      if (!response.ok()) return response.status().with_context(where);
      const nlohmann::json& rm = reward_model.json_value(i);
      if (!rm.is_object() || !rm.contains("ground_truth")) {
        return make_error(ErrorCode::invalid_argument, "{}: reward_model has no ground_truth", where);
      }
      const nlohmann::json& info = extra.ok() && extra->type() == proto::ColumnType::json ? extra->json_value(i) : kNull;
      auto scorer = scorers_.find(ds);
      if (!scorer.ok()) return scorer.status().with_context(where);
      auto score = (*scorer)(ScoreInput{ds, *response, rm["ground_truth"], info});
      if (!score.ok()) return score.status().with_context(where);
      if (!score->extra.empty()) {
        out.reward_extra_info["score"].push_back(score->score);
        for (const auto& [k, v] : score->extra.items()) out.reward_extra_info[k].push_back(v);
      }
      // verl writes at valid_response_length - 1; Python's -1 is the last column.
      out.reward_tensor[i][valid_resp > 0 ? valid_resp - 1 : r - 1] = score->score;
      if (printed[ds]++ < options_.num_examine) {
        auto prompt = tokenizer_.decode(row_ids(prompts, i, p - valid_prompt, p), {true, true});
        std::fprintf(stderr, "[prompt] %s\n[response] %s\n[ground_truth] %s\n[score] %g\n",
                     prompt.ok() ? prompt->c_str() : "?", response->c_str(), rm["ground_truth"].dump().c_str(),
                     score->score);
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
