// generation_loop.cpp: the per-call scheduler. The loop is
//
//   while prompts are pending or rows are in flight:
//     start a cache if needed (once for continuous batching, once per wave for static)
//     admit pending prompts into free slots (one batched prefill; samples their first token)
//     repack the cache if finished slots can no longer be refilled, or if it is full
//     one batched decode step for all slots; sample for the live ones; free finished slots
//
// Note [Cache capacity]
// A sequence of prompt length l occupies at most l + R - 1 columns (its last token is sampled,
// never fed). A wave's cache therefore needs W + R columns (W = the longest prompt). With
// continuous batching the shared cursor also advances while slots are refilled, so the cache gets
// 50% slack and is defragmented (repacked in place) when the cursor reaches the capacity: after a
// repack the cursor is at most W + R - 1, so each repack buys at least (W + R) / 2 steps.
//
// Note [Shared prompt prefill]
// GRPO asks for n samples of each prompt (the trainer repeats rows, interleaved), so an admission
// usually holds each prompt n times. With rollout.enable_prefix_caching (verl's default, true)
// an admission prefills each distinct prompt once and copies its K/V into the slots of all its
// samples; each sample then decodes on its own, with its own random stream. The result equals
// prefilling every copy (the same rows of the same computation), at 1/n of the prefill FLOPs;
// GenerationStats::shared_prompt_tokens counts the prompt tokens whose prefill was saved. The
// K/V bytes are still copied per slot (the slot cache has no shared blocks).
#include "workers/rollout/internal/generation_loop.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>

#include <time.h>

#include <torch/torch.h>

#include "workers/rollout/internal/slot_cache.hpp"

namespace tessera::rollout::internal {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the whole process (every intra-op thread), in seconds.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Repack (shrink) once idle slots that cannot be refilled reach this fraction of the batch.
constexpr int64_t kShrinkDivisor = 8;

class GenerationLoop {
 public:
  GenerationLoop(StepModel& model, const std::vector<std::vector<int64_t>>& prompts, const LoopOptions& options,
                 GenerationStats& stats)
      : model_(model), prompts_(prompts), options_(options), stats_(stats), rows_(prompts.size()),
        rngs_(prompts.size()) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      pending_.push_back(static_cast<int64_t>(i));
      longest_prompt_ = std::max<int64_t>(longest_prompt_, static_cast<int64_t>(prompts[i].size()));
    }
  }

  Status run() {
    while (!pending_.empty() || live_count() > 0) {
      if (needs_new_cache()) TESSERA_RETURN_IF_ERROR(start_cache());
      if (!pending_.empty() && accepting()) {
        // One prefill per step keeps continuous batching within the token budget; a static wave
        // fills all of its slots (in budget-sized prefills) before decoding starts.
        do {
          TESSERA_RETURN_IF_ERROR(admit());
        } while (!continuous() && !pending_.empty() && live_count() < cache_->slots());
      }
      if (live_count() == 0) continue;
      TESSERA_RETURN_IF_ERROR(maybe_repack());
      decode_step();
    }
    return Status();
  }

  std::vector<GeneratedRow> take_rows() { return std::move(rows_); }

 private:
  bool continuous() const { return options_.batching == BatchingMode::continuous; }
  bool can_refill() const { return continuous() && !pending_.empty(); }
  bool accepting() const { return continuous() || live_count() == 0; }
  bool needs_new_cache() const {
    return !pending_.empty() && (!cache_ || (!continuous() && live_count() == 0));
  }

  int64_t live_count() const {
    return static_cast<int64_t>(std::count_if(slot_row_.begin(), slot_row_.end(), [](int64_t r) { return r >= 0; }));
  }

  // Note [Cache capacity].
  Status start_cache() {
    const int64_t need = longest_prompt_ + options_.response_length;
    const int64_t capacity = continuous() ? need + need / 2 : need;
    const int64_t slots = std::min<int64_t>(options_.slots, static_cast<int64_t>(pending_.size()));
    TESSERA_ASSIGN_OR_RETURN(SlotCache cache, SlotCache::create(model_.cache_config(), model_.dtype(), slots, capacity,
                                                                model_.device()));
    cache_.emplace(std::move(cache));
    slot_row_.assign(static_cast<size_t>(slots), -1);
    return Status();
  }

  // One admission: the prompts taken, the distinct prompts among them (what the prefill computes,
  // Note [Shared prompt prefill]) and, per taken prompt, its row in the prefill.
  struct Admission {
    std::vector<int64_t> taken;
    std::vector<int64_t> distinct;
    std::vector<int64_t> source;
    int64_t width = 0;
  };

  // Takes pending prompts for the free slots, within the prefill token budget (at least one);
  // a prompt equal to one already taken costs no budget when prefills are shared.
  Admission take_admissions(size_t free_slots) {
    Admission a;
    std::map<std::vector<int64_t>, int64_t> seen;  // prompt -> its row in the prefill
    while (a.taken.size() < free_slots && !pending_.empty()) {
      const int64_t row = pending_.front();
      const auto& prompt = prompts_[static_cast<size_t>(row)];
      auto same = options_.share_prompt_prefill ? seen.find(prompt) : seen.end();
      if (same == seen.end()) {
        const int64_t w = std::max(a.width, static_cast<int64_t>(prompt.size()));
        const auto rows = static_cast<int64_t>(a.distinct.size() + 1);
        if (!a.taken.empty() && w * rows > options_.prefill_token_budget) break;
        a.width = w;
        if (options_.share_prompt_prefill) seen.emplace(prompt, static_cast<int64_t>(a.distinct.size()));
        a.source.push_back(static_cast<int64_t>(a.distinct.size()));
        a.distinct.push_back(row);
      } else {
        a.source.push_back(same->second);
        stats_.shared_prompt_tokens += static_cast<int64_t>(prompt.size());
      }
      a.taken.push_back(row);
      pending_.pop_front();
    }
    return a;
  }

  // The prompts of `rows`, right-aligned in width W: ids (0 under padding) and mask [k, W].
  std::pair<at::Tensor, at::Tensor> left_padded(const std::vector<int64_t>& rows, int64_t W) {
    const int64_t k = static_cast<int64_t>(rows.size());
    at::Tensor ids = at::zeros({k, W}, at::kLong), mask = at::zeros({k, W}, at::kLong);
    auto id = ids.accessor<int64_t, 2>();
    auto m = mask.accessor<int64_t, 2>();
    for (int64_t i = 0; i < k; ++i) {
      const auto& p = prompts_[static_cast<size_t>(rows[static_cast<size_t>(i)])];
      const int64_t off = W - static_cast<int64_t>(p.size());
      for (size_t t = 0; t < p.size(); ++t) {
        id[i][off + static_cast<int64_t>(t)] = p[t];
        m[i][off + static_cast<int64_t>(t)] = 1;
      }
      stats_.prompt_tokens += static_cast<int64_t>(p.size());
    }
    return {ids, mask};
  }

  // Prefills the admitted prompts (left-padded to their common width) in a cache of their own,
  // moves their K/V into free slots and samples each one's first token.
  Status admit() {
    std::vector<int64_t> free;
    for (size_t s = 0; s < slot_row_.size(); ++s) {
      if (slot_row_[s] < 0) free.push_back(static_cast<int64_t>(s));
    }
    if (free.empty()) return Status();
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    Admission a = take_admissions(free.size());
    const int64_t W = a.width;
    const auto k = static_cast<int64_t>(a.taken.size()), d = static_cast<int64_t>(a.distinct.size());
    auto [host_ids, host_mask] = left_padded(a.distinct, W);
    const c10::Device device = model_.device();
    at::Tensor ids = host_ids.to(device, /*non_blocking=*/true), mask = host_mask.to(device, /*non_blocking=*/true);
    at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
    TESSERA_ASSIGN_OR_RETURN(models::KVCache tmp, models::KVCache::create(model_.cache_config(),
                                                                          {d, W, model_.dtype(), device}));
    at::Tensor hidden = model_.forward_step(ids, pos, tmp, mask);
    at::Tensor logits = model_.logits(hidden.select(1, W - 1));
    std::vector<int64_t> slots(free.begin(), free.begin() + k);
    if (d < k) {  // some slots share a prefilled row: each slot takes its source row's logits
      logits = logits.index_select(0, at::tensor(a.source, at::kLong).to(device, /*non_blocking=*/true));
    }
    cache_->insert(tmp, mask, slots, a.source);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t row = a.taken[static_cast<size_t>(i)];
      slot_row_[static_cast<size_t>(slots[static_cast<size_t>(i)])] = row;
      if (!options_.sampling.greedy) rngs_[static_cast<size_t>(row)].emplace(row_seed(options_.call_seed, row));
    }
    sample_and_record(logits, slots);
    stats_.admissions += 1;
    stats_.prefill_tokens += d * W;
    stats_.prefill_seconds += seconds_since(t0);
    stats_.prefill_cpu_seconds += process_cpu_seconds() - cpu0;
    return Status();
  }

  // Shrinks finished slots away when they cannot be refilled; defragments a full cache.
  Status maybe_repack() {
    const int64_t slots = cache_->slots(), live = live_count();
    std::vector<int64_t> keep;
    const bool shrink = !can_refill() && live < slots && (slots - live) * kShrinkDivisor >= slots;
    if (shrink) {
      for (int64_t s = 0; s < slots; ++s) {
        if (slot_row_[static_cast<size_t>(s)] >= 0) keep.push_back(s);
      }
    } else if (cache_->length() >= cache_->capacity()) {
      for (int64_t s = 0; s < slots; ++s) keep.push_back(s);
    } else {
      return Status();
    }
    TESSERA_ASSIGN_OR_RETURN(SlotCache packed, cache_->repack(keep));
    std::vector<int64_t> rows;
    for (int64_t s : keep) rows.push_back(slot_row_[static_cast<size_t>(s)]);
    cache_.emplace(std::move(packed));
    slot_row_ = std::move(rows);
    (shrink ? stats_.shrinks : stats_.defrags) += 1;
    return Status();
  }

  // Feeds every live row its last token and samples the next one.
  void decode_step() {
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    const int64_t S = cache_->slots();
    at::Tensor ids = at::zeros({S, 1}, at::kLong), pos = at::zeros({S, 1}, at::kLong);
    at::Tensor live = at::zeros({S}, at::kBool);
    auto id = ids.accessor<int64_t, 2>();
    auto ps = pos.accessor<int64_t, 2>();
    auto lv = live.accessor<bool, 1>();
    std::vector<int64_t> live_slots;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t row = slot_row_[static_cast<size_t>(s)];
      if (row < 0) continue;
      const auto& tokens = rows_[static_cast<size_t>(row)].tokens;
      id[s][0] = tokens.back();
      ps[s][0] = static_cast<int64_t>(prompts_[static_cast<size_t>(row)].size() + tokens.size()) - 1;
      lv[s] = true;
      live_slots.push_back(s);
    }
    // The step's inputs are made on the host and copied up in one go each (no device reads).
    const c10::Device device = model_.device();
    cache_->open_column(live.to(device, /*non_blocking=*/true));
    at::Tensor hidden = model_.forward_step(ids.to(device, /*non_blocking=*/true), pos.to(device, /*non_blocking=*/true),
                                            cache_->kv(), cache_->mask()).select(1, 0);
    if (static_cast<int64_t>(live_slots.size()) < S) {
      hidden = hidden.index_select(0, at::tensor(live_slots, at::kLong).to(device, /*non_blocking=*/true));
    }
    sample_and_record(model_.logits(hidden), live_slots);
    stats_.decode_steps += 1;
    stats_.decode_row_steps += S;
    stats_.decode_seconds += seconds_since(t0);
    stats_.decode_cpu_seconds += process_cpu_seconds() - cpu0;
  }

  // logits [n, V] belong to slots[0..n): draws, appends, and frees the slots of finished rows.
  void sample_and_record(const at::Tensor& logits, const std::vector<int64_t>& slots) {
    std::vector<double> uniforms;
    if (!options_.sampling.greedy) {
      for (int64_t s : slots) uniforms.push_back(rngs_[static_cast<size_t>(slot_row_[static_cast<size_t>(s)])]->next_uniform());
    }
    SampledTokens picked = sample_tokens(logits, options_.sampling, uniforms, options_.want_logprobs);
    // The step's one device-to-host copy: the tokens, and the log-probs beside them (a float and
    // a token id below 2^53 are both exact as doubles).
    at::Tensor drawn = picked.tokens.to(at::kDouble);
    if (options_.want_logprobs) drawn = at::cat({drawn, picked.logprobs.to(at::kFloat).to(at::kDouble)});
    drawn = drawn.to(at::kCPU).contiguous();
    const double* values = drawn.data_ptr<double>();
    const size_t n = slots.size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t slot = slots[i];
      GeneratedRow& row = rows_[static_cast<size_t>(slot_row_[static_cast<size_t>(slot)])];
      const auto token = static_cast<int64_t>(values[i]);
      row.tokens.push_back(token);
      if (options_.want_logprobs) row.logprobs.push_back(static_cast<float>(values[n + i]));
      stats_.generated_tokens += 1;
      if (finished(row, token)) {
        slot_row_[static_cast<size_t>(slot)] = -1;
        cache_->clear(slot);
      }
    }
  }

  bool finished(const GeneratedRow& row, int64_t token) const {
    if (static_cast<int64_t>(row.tokens.size()) >= options_.response_length) return true;
    if (options_.ignore_eos) return false;
    const auto& eos = options_.eos_token_ids;
    return std::find(eos.begin(), eos.end(), token) != eos.end();
  }

  StepModel& model_;
  const std::vector<std::vector<int64_t>>& prompts_;
  const LoopOptions& options_;
  GenerationStats& stats_;
  std::vector<GeneratedRow> rows_;
  std::vector<std::optional<RowRng>> rngs_;
  std::deque<int64_t> pending_;
  std::optional<SlotCache> cache_;
  std::vector<int64_t> slot_row_;  ///< Prompt index per slot; -1 when the slot is free.
  int64_t longest_prompt_ = 0;
};

}  // namespace

Result<std::vector<GeneratedRow>> run_generation(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const LoopOptions& options, GenerationStats& stats) {
  at::NoGradGuard no_grad;
  GenerationLoop loop(model, prompts, options, stats);
  TESSERA_RETURN_IF_ERROR(loop.run());
  stats.rows = static_cast<int64_t>(prompts.size());
  return loop.take_rows();
}

}  // namespace tessera::rollout::internal
