// sft_worker.hpp: the "sft" worker type: verl's FSDP SFT trainer (verl/trainer/fsdp_sft_trainer.py,
// v0.5.0) split into a worker that owns the FSDP-sharded model and a driver loop
// (driver/sft_trainer.hpp) that feeds it batches.
//
// Init config per rank: {"config": <verl sft_trainer subtree: model, optim, data>,
// "total_training_steps": N, "seed": N}. Read from it:
//   model.partial_pretrain      HF directory to start from (config.json + safetensors + tokenizer).
//   model.fsdp_config           model_dtype, wrap_policy, and the Tessera extensions
//                               mixed_precision / fsdp_size / sharding_strategy (as the actor's);
//                               cpu_offload / offload_params true are unimplemented errors.
//                               Without mixed_precision, CPU ranks compute in fp32 (verl's SFT
//                               trainer hard-codes bf16 for CUDA, which CUDA ranks keep).
//   model.lora_rank > 0: LoRA adapters with lora_alpha on target_modules (models' Note [LoRA
//   adapters]; verl's SFT trainer passes no exclude_modules); checkpoints add lora_adapter/ in
//   PEFT's format and the HF model has them merged. model.external_lib: unimplemented error.
//   enable_gradient_checkpointing: recompute each decoder layer in backward, under every strategy;
//   under FULL_SHARD / HYBRID_SHARD it is also freed after its forward (worker_support.hpp). trust_remote_code, use_liger,
//   use_shm, strategy: accepted, no effect.
//   optim.{lr, betas, weight_decay, warmup_steps_ratio, clip_grad, lr_scheduler (cosine|constant),
//   min_lr_ratio}: AdamW and verl's schedule over total_training_steps.
//   data.micro_batch_size_per_gpu: micro-batch rows (other data.* keys belong to the driver).
//
// Registered methods:
//   init_model       ONE_TO_ALL        loads partial_pretrain and wraps it in FSDP; returns null.
//   train_batch      DP_COMPUTE_PROTO  one optimizer step over the batch (keys input_ids,
//                                      attention_mask, position_ids, loss_mask [B, T], verl's
//                                      SFTDataset layout: loss_mask[t] = 1 where token t+1 is a
//                                      trained response token). Returns a row-less DataProto whose
//                                      meta_info.metrics = {"train/loss", "train/lr",
//                                      "train/grad_norm"} (identical on every rank).
//   validate_batch   DP_COMPUTE_PROTO  the same loss without update: meta_info.metrics {"val/loss"}.
//   save_checkpoint  ONE_TO_ALL        (local_path, hdfs_path=null, global_step, max_ckpt_to_keep):
//                                      the sharded checkpoint plus a complete HF model directory in
//                                      local_path/huggingface (weights, config, tokenizer), so the
//                                      RL phase (actor_rollout_ref.model.path) can start from it.
//   load_checkpoint  ONE_TO_ALL        (local_path, hdfs_path=null, del_local_after_load=false).
//
// Loss: the mean token cross-entropy over every trained token of the GLOBAL batch. Each micro-batch
// contributes sum(CE * mask) / global_tokens * world (FSDP averages gradients over the world), so
// the update does not depend on the data-parallel size or the micro-batch size (verl's
// data.balance_dp_token behaviour, applied across micro-batches too).
//
// Thread contract: one worker actor thread; every rank makes the same calls (collectives).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "runtime/worker.hpp"

namespace tessera::workers {

/// Registers the "sft" worker type (see the header comment).
Status register_sft_worker(runtime::WorkerTypeRegistry& registry);

/// The summed token cross-entropy of a batch and the number of trained tokens.
struct SftLossTerms {
  at::Tensor loss_sum;  ///< 0-dim fp32, differentiable through `logits`.
  at::Tensor tokens;    ///< 0-dim fp32 Σ loss_mask[:, :-1], on the logits' device (no host read).
};

/// Σ_t CE(logits[:, t], input_ids[:, t+1]) · loss_mask[:, t] over t < T-1, and the token count.
/// `logits` are the head's output at rows [0, T-1) ([B, T-1, V], any floating dtype; reduced in
/// fp32). Errors name the tensor whose shape does not fit ([B, T] ids and mask).
Result<SftLossTerms> sft_loss_terms(const at::Tensor& logits, const at::Tensor& input_ids, const at::Tensor& loss_mask);

}  // namespace tessera::workers
