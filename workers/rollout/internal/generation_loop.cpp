// generation_loop.cpp: the per-call scheduler. The loop is
//
//   while prompts are pending or rows are in flight:
//     admit pending prompts into free slots (one batched prefill; samples their first token)
//     one batched decode step for the live slots; sample; free the blocks of finished rows
//
// The KV cache is paged (Note [Paged KV cache] in paged_kv.hpp) and made once per call: for
// every slot at its longest (the longest prompt + token budget of a row), or fewer blocks when
// LoopOptions::max_kv_blocks caps it (the memory gpu_memory_utilization leaves). A finished row's
// blocks go straight back to the pool, and a decode step computes the live rows only: there are
// no idle slots to carry and no columns to compact.
//
// Note [Preemption]
// Under a cap, prompts are admitted only while the free blocks cover their prompt blocks and
// leave one block per live sequence for its next step. When a decode step's appends would still
// need more blocks than are free, the most recently admitted live sequences are preempted, as
// vLLM does by recomputation: their blocks are freed and they go back to the front of the queue
// with their tokens so far; readmitted, their prompt and generated tokens are prefilled again and
// decoding goes on from there, with the same random stream (a row's sampler is never reseeded).
// The cap holds at least one sequence at its longest, so the oldest live sequence always
// finishes. GenerationStats::preemptions counts them.
//
// Note [Shared prompt prefill]
// GRPO asks for n samples of each prompt (the trainer repeats rows, interleaved), so an admission
// usually holds each prompt n times. With rollout.enable_prefix_caching (verl's default, true)
// an admission prefills each distinct prompt once; its samples share the prompt's full KV blocks
// and each gets a copy of the last, partial one (copy-on-write at the first divergent block).
// Each sample then decodes on its own, with its own random stream. The result equals prefilling
// every copy (the same rows of the same computation) at 1/n of the prefill FLOPs;
// GenerationStats::shared_prompt_tokens counts the prompt tokens whose prefill was saved,
// shared_prefill_flops their FLOPs, and shared_kv_blocks the blocks that were not duplicated.
//
// Note [Lagged token reads]
// A decode step needs its rows' last tokens, and the host needs them to know which rows have
// finished. Reading them back at the end of every step leaves the device idle while the host
// reads, records, and builds and launches the next step, and the host idle while the device
// computes. Instead the sampled tokens stay on the device (slot_tokens_, one per slot, which the
// next step's input table is filled from) and their copy to the host is read one step late:
// step n+1 is launched first, then the host waits for step n's tokens and records them while
// step n+1 runs. What the host cannot know yet it does not need: the rows that reach
// response_length are retired when their last token is sampled (a count, not a token), so only
// a row that sampled an EOS runs one step more than it needs, and that token is dropped when it
// is read. Preemption needs every row's tokens and so reads all pending ones first. Each row's
// tokens, random stream included, are what reading every step gives; the one difference is the
// schedule: a row's slot and blocks come free one step later (LoopOptions::lag_token_reads=false
// restores reading every step, for the tests that compare the two).
#include "workers/rollout/internal/generation_loop.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>

#include <time.h>

#include <torch/torch.h>

#include "workers/models/fused_layers.hpp"
#include "workers/models/param_count.hpp"
#include "workers/rollout/cuda/paged_attention.hpp"
#include "workers/rollout/internal/block_cache.hpp"
#include "workers/rollout/internal/decode_attention.hpp"
#include "workers/rollout/internal/decode_runner.hpp"
#include "proto/host_transfer.hpp"

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

// GenerationStats::prefill_flops of one prompt of `len` tokens.
double prompt_flops(const models::ModelConfig& c, int64_t len) {
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const auto n = static_cast<double>(len), layers = static_cast<double>(c.num_hidden_layers);
  return 2 * models::decoder_matmul_params(c) * n + 4 * n * n * q * layers;
}

class GenerationLoop {
 public:
  GenerationLoop(StepModel& model, const std::vector<std::vector<int64_t>>& prompts, const LoopOptions& options,
                 GenerationStats& stats)
      : model_(model), prompts_(prompts), options_(options), stats_(stats), rows_(prompts.size()),
        rngs_(prompts.size()), resumed_(prompts.size()), issued_(prompts.size(), 0), done_(prompts.size(), false) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      pending_.push_back(static_cast<int64_t>(i));
      longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(prompts[i].size()) + limit(i));
    }
  }

  Status run() {
    if (!pending_.empty()) TESSERA_RETURN_IF_ERROR(start_cache());
    while (!pending_.empty() || live_count() > 0 || !in_flight_.empty()) {
      if (!pending_.empty() && accepting()) {
        // One prefill per step keeps continuous batching within the token budget; a static wave
        // fills all of its slots (in budget-sized prefills) before decoding starts.
        do {
          TESSERA_RETURN_IF_ERROR(admit());
        } while (!continuous() && admitted_ > 0 && !pending_.empty() && live_count() < cache_->slots());
      }
      if (live_count() > 0) TESSERA_RETURN_IF_ERROR(decode_step());
      // Note [Lagged token reads]: the step just launched stays in flight while the host reads
      // the one before it; with nothing left to launch, every pending read is taken.
      const size_t keep = live_count() > 0 ? 1 : 0;
      while (in_flight_.size() > keep) TESSERA_RETURN_IF_ERROR(read_tokens());
    }
    return Status();
  }

  std::vector<GeneratedRow> take_rows() { return std::move(rows_); }
  void count_graphs() {
    if (runner_ == nullptr) return;
    stats_.graph_replays = runner_->replayed_steps() - replayed_before_;
    stats_.graphs_captured = runner_->captured_graphs() - captured_before_;
  }

 private:
  bool continuous() const { return options_.batching == BatchingMode::continuous; }
  bool accepting() const { return continuous() || live_count() == 0; }

  int64_t live_count() const {
    return static_cast<int64_t>(std::count_if(slot_row_.begin(), slot_row_.end(), [](int64_t r) { return r >= 0; }));
  }

  // A sequence holds at most its prompt + its budget - 1 tokens (the last one is sampled, never
  // fed); the pools hold every slot at the longest such length, or max_kv_blocks.
  Status start_cache() {
    PrefixSession* session = options_.session;
    // A session's pool serves all its calls: its rows (or this call's, when more), each at the
    // longest sequence a call may hold.
    const auto pending = static_cast<int64_t>(pending_.size());
    const int64_t slots = std::min<int64_t>(options_.slots, session != nullptr ? std::max(session->rows, pending) : pending);
    const int64_t length = session != nullptr ? std::max(longest_, options_.session_length) : longest_;
    const int64_t per_sequence = (length + options_.block_size - 1) / options_.block_size;
    const int64_t wanted = options_.max_kv_blocks > 0 ? std::min(options_.max_kv_blocks, slots * per_sequence)
                                                      : slots * per_sequence;
    const bool reuse = session != nullptr && session->cache != nullptr &&
                       session->cache->block_size() == options_.block_size &&
                       session->cache->kv().num_blocks() - 1 >= std::min(wanted, slots * per_sequence) &&
                       session->cache->kv().num_blocks() - 1 >= per_sequence;
    if (reuse) {
      session->cache->reset_slots(slots);  // the remembered blocks stay (Note [Prefix cache])
      cache_ = session->cache.get();
    } else {
      TESSERA_ASSIGN_OR_RETURN(BlockCache cache,
                               BlockCache::create(model_.cache_config(), model_.dtype(), slots, length,
                                                  options_.block_size, model_.device(), options_.max_kv_blocks,
                                                  options_.max_kv_blocks_key));
      if (session != nullptr) {
        session->clear();  // the old pool, what it remembered, and the graphs over it
        session->cache = std::make_unique<BlockCache>(std::move(cache));
        cache_ = session->cache.get();
      } else {
        own_cache_.emplace(std::move(cache));
        cache_ = &*own_cache_;
      }
    }
    cache_->kv().use_kernel = options_.kernel_attention;
    cache_->kv().tiled = options_.tiled_attention;
    cache_->kv().split = options_.split_attention;
    // A session keeps its runner (and its CUDA graphs) while the pool and the shapes stay.
    if (session != nullptr && reuse && session->runner != nullptr && session->runner_slots == slots &&
        session->runner_length == length) {
      runner_ = session->runner.get();
    } else if (session != nullptr) {
      session->runner = std::make_unique<DecodeRunner>(model_, *cache_, length, options_.decode);
      session->runner_slots = slots;
      session->runner_length = length;
      runner_ = session->runner.get();
    } else {
      own_runner_ = std::make_unique<DecodeRunner>(model_, *cache_, longest_, options_.decode);
      runner_ = own_runner_.get();
    }
    replayed_before_ = runner_->replayed_steps();
    captured_before_ = runner_->captured_graphs();
    slot_row_.assign(static_cast<size_t>(slots), -1);
    slot_tokens_ = at::zeros({slots}, at::TensorOptions(at::kLong).device(model_.device()));
    admitted_at_.assign(static_cast<size_t>(slots), 0);
    stats_.kv_blocks = cache_->kv().num_blocks();
    stats_.kv_cache_bytes = cache_->kv().bytes();
    return Status();
  }

  // One admission: the prompts taken, the distinct prompts among them (what the prefill computes,
  // Note [Shared prompt prefill]) and, per taken prompt, its row in the prefill.
  struct Admission {
    std::vector<int64_t> taken;
    std::vector<int64_t> distinct;
    std::vector<int64_t> source;
    std::vector<std::vector<int64_t>> prefixes;  ///< Per distinct row: remembered blocks it starts with.
    int64_t width = 0;
  };

  // What `row` prefills: its prompt, and for a preempted row the tokens it generated too.
  const std::vector<int64_t>& sequence(int64_t row) const {
    const auto& resumed = resumed_[static_cast<size_t>(row)];
    return resumed.empty() ? prompts_[static_cast<size_t>(row)] : resumed;
  }

  // Takes pending prompts for the free slots, within the prefill token budget (at least one) and
  // the free KV blocks (Note [Preemption]); a prompt equal to one already taken costs no budget
  // and only its partial block when prefills are shared.
  Admission take_admissions(size_t free_slots) {
    Admission a;
    std::map<std::vector<int64_t>, int64_t> seen;  // prompt -> its row in the prefill
    int64_t reserved = 0;  // blocks the rows taken so far will allocate
    while (a.taken.size() < free_slots && !pending_.empty()) {
      const int64_t row = pending_.front();
      const auto& prompt = sequence(row);
      const auto len = static_cast<int64_t>(prompt.size());
      auto same = options_.share_prompt_prefill ? seen.find(prompt) : seen.end();
      // Note [Prefix cache]: the remembered blocks that start the prompt (one token at least is
      // left to prefill, for its logits).
      std::vector<int64_t> prefix;
      if (options_.session != nullptr && same == seen.end()) {
        prefix = cache_->take_prefix(prompt, (len - 1) / cache_->block_size());
      }
      const int64_t need = same == seen.end() ? cache_->blocks_for(len) - static_cast<int64_t>(prefix.size())
                                              : (len % cache_->block_size() != 0 ? 1 : 0);
      const bool first = a.taken.empty() && live_count() == 0;  // always fits: the cap holds one sequence
      // One block of headroom per live sequence; the remembered blocks count as free (evictable).
      const bool fits = need <= cache_->free_blocks() - live_count() - reserved;
      const int64_t w = same == seen.end() ? std::max(a.width, len) : a.width;
      const bool over_budget = same == seen.end() && !a.taken.empty() &&
                               w * static_cast<int64_t>(a.distinct.size() + 1) > options_.prefill_token_budget;
      if ((!fits && !first) || over_budget) {
        for (int64_t b : prefix) cache_->unref(b);
        break;
      }
      if (same == seen.end()) {
        a.width = w;
        if (options_.share_prompt_prefill) seen.emplace(prompt, static_cast<int64_t>(a.distinct.size()));
        a.source.push_back(static_cast<int64_t>(a.distinct.size()));
        a.distinct.push_back(row);
        a.prefixes.push_back(std::move(prefix));
      } else {
        a.source.push_back(same->second);
        stats_.shared_prompt_tokens += len;
        stats_.shared_prefill_flops += prompt_flops(model_.cache_config(), len);
      }
      reserved += need;
      a.taken.push_back(row);
      pending_.pop_front();
    }
    return a;
  }

  // The sequences of `rows`, right-aligned in width W: ids (0 under padding) and mask [k, W].
  // Host tensors in staging memory (pinned on CUDA), so that their upload does not block (Note
  // [Host transfers]).
  std::pair<at::Tensor, at::Tensor> left_padded(const std::vector<int64_t>& rows, int64_t W) {
    const int64_t k = static_cast<int64_t>(rows.size());
    at::Tensor ids = proto::staging_tensor({k, W}, at::kLong, model_.device()).zero_();
    at::Tensor mask = proto::staging_tensor({k, W}, at::kLong, model_.device()).zero_();
    auto id = ids.accessor<int64_t, 2>();
    auto m = mask.accessor<int64_t, 2>();
    for (int64_t i = 0; i < k; ++i) {
      const int64_t row = rows[static_cast<size_t>(i)];
      const auto& p = sequence(row);
      const int64_t off = W - static_cast<int64_t>(p.size());
      for (size_t t = 0; t < p.size(); ++t) {
        id[i][off + static_cast<int64_t>(t)] = p[t];
        m[i][off + static_cast<int64_t>(t)] = 1;
      }
      (resumed_[static_cast<size_t>(row)].empty() ? stats_.prompt_tokens : stats_.recomputed_tokens) +=
          static_cast<int64_t>(p.size());
      stats_.prefill_flops += prompt_flops(model_.cache_config(), static_cast<int64_t>(p.size()));
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
    admitted_ = 0;
    if (free.empty()) return Status();
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    Admission a = take_admissions(free.size());
    if (a.taken.empty()) return Status();  // no blocks to spare until a live row finishes
    admitted_ = static_cast<int64_t>(a.taken.size());
    const int64_t W = a.width;
    const auto k = static_cast<int64_t>(a.taken.size()), d = static_cast<int64_t>(a.distinct.size());
    auto [host_ids, host_mask] = left_padded(a.distinct, W);
    const c10::Device device = model_.device();
    at::Tensor ids = host_ids.to(device, /*non_blocking=*/true), mask = host_mask.to(device, /*non_blocking=*/true);
    at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
    TESSERA_ASSIGN_OR_RETURN(models::KVCache tmp, models::KVCache::create(model_.cache_config(),
                                                                          {d, W, model_.dtype(), device}));
    // Note [Prefix cache]: the remembered blocks' keys and values go into `tmp` where the prefill
    // would have computed them, and the prefill starts at the first column some row still needs.
    int64_t start = 0;
    if (options_.session != nullptr) {
      std::vector<int64_t> lengths;
      int64_t suffix = 1;
      for (size_t i = 0; i < a.distinct.size(); ++i) {
        const auto len = static_cast<int64_t>(sequence(a.distinct[i]).size());
        const int64_t cached = static_cast<int64_t>(a.prefixes[i].size()) * cache_->block_size();
        lengths.push_back(len);
        suffix = std::max(suffix, len - cached);
        stats_.cached_prompt_tokens += cached;
        const double saved = prompt_flops(model_.cache_config(), cached);
        stats_.cached_prefill_flops += saved;
        stats_.prefill_flops -= saved;
      }
      cache_->gather(tmp, lengths, a.prefixes);
      start = W - suffix;
      tmp.advance(start);
    }
    // Chunked prefill: at most prefill_token_budget padded tokens per forward, each chunk
    // attending to the columns before it in `tmp` (a single prompt longer than the budget too).
    const int64_t chunk = options_.chunked_prefill ? std::max<int64_t>(1, options_.prefill_token_budget / d) : W;
    at::Tensor last;
    for (int64_t c0 = start; c0 < W; c0 += chunk) {
      const int64_t c = std::min(chunk, W - c0);
      last = model_.forward_step(ids.narrow(1, c0, c), pos.narrow(1, c0, c), tmp, mask).select(1, c - 1);
      stats_.prefill_forwards += 1;
    }
    at::Tensor logits = model_.logits(last);
    std::vector<int64_t> slots(free.begin(), free.begin() + k);
    if (d < k) {  // some slots share a prefilled row: each slot takes its source row's logits
      logits = logits.index_select(0, proto::upload(a.source, device));
    }
    std::vector<int64_t> lengths;
    for (int64_t row : a.distinct) lengths.push_back(static_cast<int64_t>(sequence(row).size()));
    stats_.shared_kv_blocks += cache_->admit(tmp, lengths, slots, a.source, a.prefixes);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t row = a.taken[static_cast<size_t>(i)];
      slot_row_[static_cast<size_t>(slots[static_cast<size_t>(i)])] = row;
      admitted_at_[static_cast<size_t>(slots[static_cast<size_t>(i)])] = ++admissions_;
      // A preempted row keeps its random stream where it stopped.
      auto& rng = rngs_[static_cast<size_t>(row)];
      if (!options_.sampling.greedy && !rng) {
        const int64_t stream = options_.streams.empty() ? row : options_.streams[static_cast<size_t>(row)];
        rng.emplace(row_seed(options_.call_seed, stream));
      }
      resumed_[static_cast<size_t>(row)].clear();
    }
    TESSERA_RETURN_IF_ERROR(launch_sampling(logits, slots, /*prefill=*/true));
    stats_.admissions += 1;
    stats_.prefill_tokens += d * (W - start);
    stats_.prefill_seconds += seconds_since(t0);
    stats_.prefill_cpu_seconds += process_cpu_seconds() - cpu0;
    return Status();
  }

  // Note [Preemption]: frees the blocks of the most recently admitted live rows until this
  // step's appends fit, and queues those rows again (first) with their tokens so far.
  void preempt_for_appends() {
    for (;;) {
      std::vector<int64_t> live;
      for (size_t s = 0; s < slot_row_.size(); ++s) {
        if (slot_row_[s] >= 0) live.push_back(static_cast<int64_t>(s));
      }
      if (live.size() <= 1 || cache_->blocks_to_append(live) <= cache_->free_blocks()) return;
      const int64_t victim = *std::max_element(live.begin(), live.end(), [&](int64_t x, int64_t y) {
        return admitted_at_[static_cast<size_t>(x)] < admitted_at_[static_cast<size_t>(y)];
      });
      const int64_t row = slot_row_[static_cast<size_t>(victim)];
      std::vector<int64_t>& resumed = resumed_[static_cast<size_t>(row)];
      resumed = prompts_[static_cast<size_t>(row)];
      const auto& generated = rows_[static_cast<size_t>(row)].tokens;
      resumed.insert(resumed.end(), generated.begin(), generated.end());
      // In a session its blocks are remembered (every token is read by now): readmitted before
      // they are evicted, it prefills only its last block again (Note [Prefix cache]).
      if (options_.session != nullptr) cache_->remember(victim, resumed);
      cache_->release(victim);
      slot_row_[static_cast<size_t>(victim)] = -1;
      pending_.push_front(row);
      stats_.preemptions += 1;
    }
  }

  // Feeds every live row its last token and samples the next one.
  Status decode_step() {
    const auto t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    if (cache_->blocks_to_append(live_slots()) > cache_->free_blocks()) {
      // Note [Lagged token reads]: preemption needs every row's tokens
      TESSERA_RETURN_IF_ERROR(read_all_tokens());
      preempt_for_appends();
    }
    std::vector<int64_t> live = live_slots(), positions;
    if (live.empty()) return Status();  // the reads just taken finished them all
    for (int64_t s : live) {
      const auto row = static_cast<size_t>(slot_row_[static_cast<size_t>(s)]);
      positions.push_back(static_cast<int64_t>(prompts_[row].size()) + issued_[row] - 1);
    }
    at::Tensor hidden = runner_->step(live, positions, slot_tokens_);
    Status st = launch_sampling(model_.logits(hidden), live, /*prefill=*/false);
    stats_.decode_steps += 1;
    stats_.decode_row_steps += runner_->last_rows();
    stats_.decode_seconds += seconds_since(t0);
    stats_.decode_cpu_seconds += process_cpu_seconds() - cpu0;
    return st;
  }

  std::vector<int64_t> live_slots() const {
    std::vector<int64_t> live;
    for (size_t s = 0; s < slot_row_.size(); ++s) {
      if (slot_row_[s] >= 0) live.push_back(static_cast<int64_t>(s));
    }
    return live;
  }

  // Frees `slot`, whose row needs no more steps.
  void retire(int64_t slot) {
    const int64_t row = slot_row_[static_cast<size_t>(slot)];
    slot_row_[static_cast<size_t>(slot)] = -1;
    if (options_.session != nullptr) {  // Note [Prefix cache]: its blocks whose tokens are known
      std::vector<int64_t> tokens = prompts_[static_cast<size_t>(row)];
      const auto& generated = rows_[static_cast<size_t>(row)].tokens;
      tokens.insert(tokens.end(), generated.begin(), generated.end());
      cache_->remember(slot, tokens);
    }
    cache_->release(slot);
  }

  // The tokens one launch sampled, on their way to the host (Note [Lagged token reads]).
  struct InFlight {
    std::vector<int64_t> slots, rows;  ///< Per sampled row: its slot and its prompt index.
    proto::HostReadback values;               ///< Tokens, then log-probs when asked for, as doubles.
    bool prefill = false;
  };

  // logits [n, V] belong to slots[0..n): draws each row's next token on the device, keeps it
  // there for the next step, starts its copy to the host, and retires the rows that have sampled
  // their last token.
  Status launch_sampling(const at::Tensor& logits, const std::vector<int64_t>& slots, bool prefill) {
    InFlight f;
    f.slots = slots;
    f.prefill = prefill;
    std::vector<double> uniforms;
    for (int64_t s : slots) {
      const int64_t row = slot_row_[static_cast<size_t>(s)];
      f.rows.push_back(row);
      if (!options_.sampling.greedy) uniforms.push_back(rngs_[static_cast<size_t>(row)]->next_uniform());
    }
    SampledTokens picked = sample_tokens(logits, options_.sampling, uniforms, options_.want_logprobs);
    // An unsampleable row's -1 (Note [Unsampleable rows]) is read below and ends the call; until
    // then the step launched before that read embeds token 0 in its place.
    slot_tokens_.index_copy_(0, proto::upload(slots, slot_tokens_.device()), picked.tokens.clamp_min(0));
    // One copy to the host per launch: the tokens, and the log-probs beside them (a float and a
    // token id below 2^53 are both exact as doubles).
    at::Tensor drawn = picked.tokens.to(at::kDouble);
    if (options_.want_logprobs) drawn = at::cat({drawn, picked.logprobs.to(at::kFloat).to(at::kDouble)});
    f.values = proto::HostReadback(drawn);
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto row = static_cast<size_t>(f.rows[i]);
      if (++issued_[row] >= limit(row)) retire(slots[i]);
    }
    in_flight_.push_back(std::move(f));
    return options_.lag_token_reads ? Status() : read_all_tokens();
  }

  // Waits for the oldest launch's tokens and records them: appends, and retires the rows that
  // sampled an EOS. Tokens of rows already finished (sampled by the step after their EOS) are dropped.
  // A row that had nothing to sample from (Note [Unsampleable rows]) ends the call; the row is named
  // by its index in this call's prompts (under rollout TP, the TP group's gathered batch).
  Status read_tokens() {
    const auto t0 = Clock::now();
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    const double* values = f.values.wait().data_ptr<double>();
    (f.prefill ? stats_.prefill_seconds : stats_.decode_seconds) += seconds_since(t0);
    const size_t n = f.slots.size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t slot = f.slots[i], r = f.rows[i];
      if (done_[static_cast<size_t>(r)]) continue;
      GeneratedRow& row = rows_[static_cast<size_t>(r)];
      const auto token = static_cast<int64_t>(values[i]);
      if (token < 0) {
        return make_error(ErrorCode::invalid_argument,
                          "rollout: the logits of batch row {} at response token {} are NaN or infinite, so no token "
                          "can be sampled: the policy has diverged (non-finite weights or activations; see the "
                          "previous steps' actor/grad_norm and actor/pg_loss)",
                          r, row.tokens.size());
      }
      row.tokens.push_back(token);
      if (options_.want_logprobs) row.logprobs.push_back(static_cast<float>(values[n + i]));
      stats_.generated_tokens += 1;
      if (finished(static_cast<size_t>(r), token)) {
        done_[static_cast<size_t>(r)] = true;
        if (slot_row_[static_cast<size_t>(slot)] == r) retire(slot);  // at response_length: retired at launch
      }
    }
    return Status();
  }

  Status read_all_tokens() {
    while (!in_flight_.empty()) TESSERA_RETURN_IF_ERROR(read_tokens());
    return Status();
  }

  int64_t limit(size_t row) const { return options_.max_tokens.empty() ? options_.response_length : options_.max_tokens[row]; }

  bool finished(size_t row, int64_t token) const {
    if (static_cast<int64_t>(rows_[row].tokens.size()) >= limit(row)) return true;
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
  std::optional<BlockCache> own_cache_;   ///< The call's cache, without a session.
  BlockCache* cache_ = nullptr;            ///< own_cache_, or the session's.
  std::unique_ptr<DecodeRunner> own_runner_;  ///< Over own_cache_ (declared after it: destroyed first).
  DecodeRunner* runner_ = nullptr;         ///< own_runner_, or the session's.
  int64_t replayed_before_ = 0, captured_before_ = 0;  ///< The runner's counts when the call began.
  std::vector<int64_t> slot_row_;  ///< Prompt index per slot; -1 when the slot is free.
  std::vector<int64_t> admitted_at_;  ///< Per slot: when its row was admitted (a counter).
  int64_t admissions_ = 0;
  int64_t admitted_ = 0;  ///< Rows the last admit() took.
  std::vector<std::vector<int64_t>> resumed_;  ///< Per row: prompt + tokens, while it is preempted.
  std::vector<int64_t> issued_;  ///< Per row: tokens sampled, read or not.
  std::vector<bool> done_;       ///< Per row: finished (known once its last token is read).
  at::Tensor slot_tokens_;       ///< [slots] int64 on the device: each slot's last sampled token.
  std::deque<InFlight> in_flight_;  ///< Launches whose tokens the host has not read, oldest first.
  int64_t longest_ = 0;  ///< The longest prompt + budget over the rows.
};

}  // namespace

PrefixSession::PrefixSession() = default;
PrefixSession::~PrefixSession() = default;

void PrefixSession::clear() {
  runner.reset();
  cache.reset();
}

Result<std::vector<GeneratedRow>> run_generation(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const LoopOptions& asked, GenerationStats& stats) {
  LoopOptions options = asked;
  at::NoGradGuard no_grad;
  for (const auto* per_row : {&options.max_tokens, &options.streams}) {
    if (!per_row->empty() && per_row->size() != prompts.size()) {
      return make_error(ErrorCode::invalid_argument, "rollout: {} per-row values for {} prompts", per_row->size(),
                        prompts.size());
    }
  }
  for (int64_t m : options.max_tokens) {
    if (m < 1 || m > options.response_length) {
      return make_error(ErrorCode::invalid_argument, "rollout: a row's token budget {} is outside [1, {}]", m,
                        options.response_length);
    }
  }
  const models::ModelConfig& heads = model.cache_config();
  const at::Tensor pool =
      at::empty({1, 1, 1, heads.head_dim}, at::TensorOptions(model.dtype()).device(model.device()));
  const bool tiled_runs =
      paged_decode_attention_cuda_supported(pool) &&
      tiled_decode_attention_supported(heads.num_attention_heads, heads.num_key_value_heads, heads.head_dim);
  // decode_attention=kernel takes the tiled kernel where it runs and a KV group has more query
  // heads than a block of the heads kernel serves (which then reads the group's keys and values
  // once per block): there it decoded 3-5% faster on an H200 than the heads kernel did before its
  // pipelined walk (gpu_decode at 512 rows, groups of 7 and 8: Qwen2.5-0.5B's and Qwen3-30B-A3B's
  // shapes; Note [Decode loads in flight]); gpu_decode's heads and tiled columns say whether that
  // still holds. Smaller groups keep the heads kernel, which reads them once too.
  if (options.prefer_tiled_attention && tiled_runs &&
      heads.num_attention_heads > cuda::kMaxHeadsPerBlock * heads.num_key_value_heads) {
    options.tiled_attention = true;
  }
  if (options.tiled_attention && !tiled_runs) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref.rollout.engine_kwargs.tessera.decode_attention=tiled: the tiled kernel runs on "
                      "CUDA devices in fp32, fp16 or bf16, for KV groups of up to 128 / ceil_pow2(head_dim / 8) query "
                      "heads; this rollout has {} query heads over {} KV heads of size {} in {} on {} (use kernel or heads)",
                      heads.num_attention_heads, heads.num_key_value_heads, heads.head_dim,
                      c10::toString(model.dtype()), model.device().str());
  }
  if (options.kernel_attention && paged_decode_attention_cuda_supported(pool)) {  // Note [Kernel self-check]
    TESSERA_RETURN_IF_ERROR(check_paged_decode_attention_cuda(model.device(), model.dtype(), options.tiled_attention,
                                                              options.split_attention));
  }
  if (options.sampling.fused && !options.sampling.greedy && model.device().is_cuda()) {
    TESSERA_RETURN_IF_ERROR(check_fused_sampling_cuda(model.device(), model.dtype()));  // Note [Kernel self-check]
  }
  if (options.fused_layers && model.device().is_cuda()) {  // Note [Kernel self-check]
    TESSERA_RETURN_IF_ERROR(models::check_fused_layers(model.device(), model.dtype()));
    if (!heads.gemma_norms()) {  // Gemma2's layers keep their own norm order (step_model.cpp's run_layers)
      TESSERA_RETURN_IF_ERROR(models::check_fused_residual_norm(model.device(), model.dtype()));
    }
  }
  GenerationLoop loop(model, prompts, options, stats);
  TESSERA_RETURN_IF_ERROR(loop.run());
  loop.count_graphs();
  stats.rows = static_cast<int64_t>(prompts.size());
  return loop.take_rows();
}

}  // namespace tessera::rollout::internal
