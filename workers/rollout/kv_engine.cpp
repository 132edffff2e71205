// kv_engine.cpp: KVCacheEngine: config checks, the generate_sequences wrapper around the
// generation loop (input contract -> loop -> output contract), and weight aliasing.
#include "workers/rollout/kv_engine.hpp"

#include <chrono>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "proto/device.hpp"
#include "workers/rollout/contract.hpp"
#include "workers/rollout/internal/generation_loop.hpp"
#include "workers/rollout/sampling.hpp"

namespace tessera::rollout {
namespace {

Status check_engine_config(const RolloutConfig& config, const StepModel& model) {
  TESSERA_RETURN_IF_ERROR(validate_rollout_config(config));
  if (config.tensor_model_parallel_size != model.tensor_parallel_size()) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref.rollout.tensor_model_parallel_size={} but the engine's model is {} of {} "
                      "tensor-parallel ranks (a TP engine is built by the rollout worker's sharding manager over its "
                      "TP group)",
                      config.tensor_model_parallel_size, model.tensor_parallel_size() == 1 ? "the whole model, not one" : "one",
                      model.tensor_parallel_size());
  }
  TESSERA_ASSIGN_OR_RETURN(auto dtype, rollout_dtype(config));
  if (dtype && *dtype != model.dtype()) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref.rollout.dtype={} but the model's parameters are {}; hand the engine weights in "
                      "its dtype or set dtype=auto",
                      config.dtype, c10::toString(model.dtype()));
  }
  if (!config.enforce_eager && model.device().is_cuda() && model.tensor_parallel_size() > 1) {
    // The TP all-reduce between layers is not captured: a graph would replay without it.
    return make_error(ErrorCode::unimplemented,
                      "actor_rollout_ref.rollout.enforce_eager=false: CUDA graphs need tensor_model_parallel_size=1 "
                      "(got {}); set enforce_eager=true",
                      model.tensor_parallel_size());
  }
  const int major = proto::cuda_compute_major(model.device());
  if (!config.enforce_eager && model.device().is_cuda() && model.cache_config().moe.num_experts > 0 &&
      (model.dtype() != at::kBFloat16 || (major != 9 && major != 10))) {
    // Only LibTorch's CUTLASS grouped GEMM leaves the expert offsets on the device (Note [MoE
    // experts] in workers/models/decoder.cpp); its fallback reads them on the host mid-capture.
    return make_error(ErrorCode::unimplemented,
                      "actor_rollout_ref.rollout.enforce_eager=false: a MoE model's expert GEMMs capture into CUDA "
                      "graphs in bfloat16 on sm90/sm100 only (got {} on sm{}x); set enforce_eager=true",
                      c10::toString(model.dtype()), major);
  }
  if (!config.enforce_eager && !model.device().is_cuda()) {
    static std::once_flag reported;
    std::call_once(reported, [&] {
      spdlog::info("rollout.enforce_eager=false: CUDA graphs need a CUDA device; the engine on {} decodes eagerly",
                   model.device().str());
    });
  }
  const int64_t context = model.cache_config().context_length();
  if (config.prompt_length + config.response_length > context) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref.rollout: prompt_length {} + response_length {} exceeds the model's "
                      "context of {} positions (max_position_embeddings, scaled by rope_scaling)",
                      config.prompt_length, config.response_length, context);
  }
  return Status();
}

// The KV-cache cap of a call (Note [Preemption] in internal/generation_loop.cpp): the tessera
// knob when set; on a GPU the blocks that fit in gpu_memory_utilization of the device's memory
// beside what is allocated now (the weights, FSDP's state); elsewhere none (0). Sets `key` to the
// config key an error should name.
Result<int64_t> kv_block_cap(const RolloutConfig& config, const StepModel& model, std::string& key) {
  if (config.max_kv_blocks > 0) {
    key = "actor_rollout_ref.rollout.engine_kwargs.tessera.max_kv_blocks";
    return config.max_kv_blocks;
  }
#if TESSERA_WITH_CUDA
  const c10::Device device = model.device();
  if (device.is_cuda()) {
    key = "actor_rollout_ref.rollout.gpu_memory_utilization";
    const models::ModelConfig& c = model.cache_config();
    const int64_t block_bytes = 2 * c.num_hidden_layers * config.kv_block_size * c.num_key_value_heads * c.head_dim *
                                static_cast<int64_t>(c10::elementSize(model.dtype()));
    c10::cuda::CUDAGuard guard(device);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      return make_error(ErrorCode::internal, "rollout: cannot read the memory of {}", device.str());
    }
    const auto allocated = static_cast<double>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current);
    const double budget = config.gpu_memory_utilization * static_cast<double>(total_bytes) - allocated;
    return std::max<int64_t>(1, static_cast<int64_t>(budget / static_cast<double>(block_bytes)));
  }
#endif
  (void)model;
  return int64_t{0};
}

}  // namespace

KVCacheEngine::KVCacheEngine(std::unique_ptr<StepModel> model, RolloutConfig config, const EngineOptions& options)
    : model_(std::move(model)),
      config_(std::move(config)),
      generator_(at::detail::createCPUGenerator(options.seed)),
      agree_min_(options.agree_min) {}

Result<std::unique_ptr<KVCacheEngine>> KVCacheEngine::create(std::unique_ptr<StepModel> model, RolloutConfig config,
                                                             const EngineOptions& options) {
  if (model == nullptr) return make_error(ErrorCode::invalid_argument, "KVCacheEngine: no model");
  TESSERA_RETURN_IF_ERROR(check_engine_config(config, *model));
  model->set_fused_layers(config.fused_layers);
  return std::unique_ptr<KVCacheEngine>(new KVCacheEngine(std::move(model), std::move(config), options));
}

Result<std::unique_ptr<KVCacheEngine>> KVCacheEngine::create(std::shared_ptr<models::CausalLM> model,
                                                             RolloutConfig config, const EngineOptions& options) {
  if (model == nullptr) return make_error(ErrorCode::invalid_argument, "KVCacheEngine: no model");
  return create(std::make_unique<CausalLMStepModel>(std::move(model)), std::move(config), options);
}

Result<std::unique_ptr<KVCacheEngine>> KVCacheEngine::create_from_tensors(models::ModelConfig model_config,
                                                                          const models::TensorMap& tensors,
                                                                          RolloutConfig config,
                                                                          const EngineOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(auto model, models::CausalLM::from_parameters(std::move(model_config), tensors));
  return create(std::move(model), std::move(config), options);
}

Status KVCacheEngine::load_weights_by_reference(const models::TensorMap& tensors) {
  try {
    return model_->load_weights_by_reference(tensors);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "load_weights_by_reference: {}", e.what());
  }
}

Status KVCacheEngine::check_prompts(const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<int64_t>& max_tokens) const {
  const auto& c = model_->cache_config();
  for (size_t row = 0; row < prompts.size(); ++row) {
    if (prompts[row].empty()) {
      return make_error(ErrorCode::invalid_argument, "generate_sequences: row {} has no prompt tokens", row);
    }
    for (int64_t id : prompts[row]) {
      if (id < 0 || id >= c.vocab_size) {
        return make_error(ErrorCode::out_of_range, "generate_sequences: row {} has token id {} outside [0, {})", row, id,
                          c.vocab_size);
      }
    }
    const int64_t budget = max_tokens.empty() ? config_.response_length : max_tokens[row];
    const int64_t end = static_cast<int64_t>(prompts[row].size()) + budget;
    if (end > c.context_length()) {
      return make_error(ErrorCode::out_of_range,
                        "generate_sequences: row {} needs {} positions (prompt {} + {} response tokens), the model has {}",
                        row, end, prompts[row].size(), budget, c.context_length());
    }
  }
  return Status();
}

// A call whose meta_info carries the trainer's `global_steps` is seeded from (engine seed, step,
// validate, and dynamic sampling's `gen_batch` when > 0): a run resumed from a checkpoint then
// draws exactly the samples an uninterrupted run draws at that step, with no generator state in
// the checkpoint, and a step's further generation batches draw afresh. Other calls draw their
// seed from the engine's generator.
uint64_t KVCacheEngine::call_seed(const nlohmann::json& meta) {
  auto* gen = at::check_generator<at::CPUGeneratorImpl>(generator_);
  auto step = meta.find("global_steps");
  if (step == meta.end() || !step->is_number_integer()) return gen->random64();
  auto validate = meta.find("validate");
  const bool is_val = validate != meta.end() && validate->is_boolean() && validate->get<bool>();
  const uint64_t seed = row_seed(row_seed(gen->current_seed(), step->get<int64_t>()), is_val ? 1 : 0);
  auto gen_batch = meta.find("gen_batch");
  if (gen_batch == meta.end() || !gen_batch->is_number_integer() || gen_batch->get<int64_t>() <= 0) return seed;
  return row_seed(seed, 1 + gen_batch->get<int64_t>());
}

Result<std::vector<GeneratedRow>> KVCacheEngine::run(const TokenRequests& requests,
                                                     std::chrono::steady_clock::time_point start) {
  if (!requests.max_tokens.empty() && requests.max_tokens.size() != requests.prompts.size()) {
    return make_error(ErrorCode::invalid_argument, "generate_tokens: {} budgets for {} prompts",
                      requests.max_tokens.size(), requests.prompts.size());
  }
  TESSERA_RETURN_IF_ERROR(check_prompts(requests.prompts, requests.max_tokens));
  internal::LoopOptions options;
  options.slots = config_.max_num_seqs;
  options.prefill_token_budget = config_.max_num_batched_tokens;
  options.chunked_prefill = config_.enable_chunked_prefill;
  options.response_length = config_.response_length;
  options.block_size = config_.kv_block_size;
  options.kernel_attention = config_.decode_attention != "gather";
  options.tiled_attention = config_.decode_attention == "tiled";
  options.prefer_tiled_attention = config_.decode_attention == "kernel";
  options.split_attention = config_.split_decode_attention;
  options.fused_layers = config_.fused_layers;
  TESSERA_ASSIGN_OR_RETURN(options.max_kv_blocks, kv_block_cap(config_, *model_, options.max_kv_blocks_key));
  if (agree_min_) {  // the TP peers' smallest
    try {
      options.max_kv_blocks = agree_min_(options.max_kv_blocks);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::unavailable, "rollout TP: agreeing on the KV cache's size: {}", e.what());
    }
  }
  options.decode.cuda_graphs = !config_.enforce_eager && model_->device().is_cuda();
  if (config_.cudagraph_capture_sizes) options.decode.buckets = *config_.cudagraph_capture_sizes;
  options.batching = config_.batching;
  options.share_prompt_prefill = config_.enable_prefix_caching;
  options.ignore_eos = config_.ignore_eos;
  options.want_logprobs = config_.calculate_log_probs;
  options.eos_token_ids = requests.eos_token_ids;
  options.sampling = requests.sampling ? *requests.sampling : resolve_sampling(config_, requests.do_sample, requests.validate);
  options.sampling.fused = config_.sampler == "fused";
  options.call_seed = requests.seed;
  options.max_tokens = requests.max_tokens;
  options.streams = requests.streams;
  options.session = session_.get();
  options.session_length = config_.max_model_len.value_or(config_.prompt_length + config_.response_length);
  GenerationStats stats;
  std::vector<GeneratedRow> rows;
  // A call that fails leaves its sequences in the session's cache: the session starts it afresh.
  struct DropOnError {
    internal::PrefixSession* session;
    bool ok = false;
    ~DropOnError() {
      if (!ok && session != nullptr) session->clear();
    }
  } drop{session_.get()};
  try {
    TESSERA_ASSIGN_OR_RETURN(rows, internal::run_generation(*model_, requests.prompts, options, stats));
  } catch (const c10::OutOfMemoryError& e) {
    return make_error(ErrorCode::resource_exhausted,
                      "generate_sequences ran out of device memory ({}); lower actor_rollout_ref.rollout."
                      "max_num_seqs, max_num_batched_tokens or gpu_memory_utilization",
                      proto::out_of_memory_summary(e));
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    what = what.substr(0, what.find('\n'));
    return make_error(ErrorCode::internal, "generate_sequences: the model failed: {}", what);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "generate_sequences: the model failed: {}", e.what());
  }
  drop.ok = true;
  stats.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_ = stats;
  return rows;
}

KVCacheEngine::~KVCacheEngine() = default;

void KVCacheEngine::begin_session(int64_t rows) {
  if (!config_.enable_prefix_caching) return;
  session_ = std::make_unique<internal::PrefixSession>();
  session_->rows = rows;
}

void KVCacheEngine::end_session() { session_.reset(); }

Result<std::vector<GeneratedRow>> KVCacheEngine::generate_tokens(const TokenRequests& requests) {
  if (requests.eos_token_ids.empty()) {
    return make_error(ErrorCode::invalid_argument, "generate_tokens: no eos_token_id");
  }
  return run(requests, std::chrono::steady_clock::now());
}

Result<proto::DataProto> KVCacheEngine::generate_sequences(const proto::DataProto& prompts) {
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(GenerationInputs in, read_generation_inputs(prompts, config_.do_sample));
  TokenRequests requests;
  requests.prompts = std::move(in.prompts);
  requests.eos_token_ids = in.eos_token_ids;
  requests.do_sample = in.do_sample;
  requests.validate = in.validate;
  requests.seed = call_seed(prompts.meta_info());
  TESSERA_ASSIGN_OR_RETURN(std::vector<GeneratedRow> rows, run(requests, t0));
  in.prompts = std::move(requests.prompts);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, build_generation_output(prompts, in, rows, config_.response_length,
                                                                         config_.calculate_log_probs));
  stats_.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::rollout
