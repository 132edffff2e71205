#!/usr/bin/env bash
# verl's examples/grpo_trainer/run_qwen2-7b_math.sh, for Tessera. The data are the parquet files
# verl's examples/data_preprocess/gsm8k.py and math_dataset.py write; gsm8k is scored by verl's
# gsm8k rule and MATH by verl's math rule, both native. The only changes from verl's script are
# marked "Tessera:". Extra overrides pass through: bash examples/grpo_gsm8k_math.sh trainer.n_gpus_per_node=4
set -euo pipefail

gsm8k_train_path=$HOME/data/gsm8k/train.parquet
gsm8k_test_path=$HOME/data/gsm8k/test.parquet
math_train_path=$HOME/data/math/train.parquet
math_test_path=$HOME/data/math/test.parquet

train_files="['$gsm8k_train_path', '$math_train_path']"
test_files="['$gsm8k_test_path', '$math_test_path']"

# Tessera: `tessera train` instead of `python3 -m verl.trainer.main_ppo`.
TESSERA="${TESSERA:-$(dirname "$0")/../build/bin/tessera}"
"$TESSERA" train \
    algorithm.adv_estimator=grpo \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path="${MODEL_PATH:-$HOME/models/Qwen2-7B-Instruct}" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name='verl_grpo_example_gsm8k_math' \
    trainer.experiment_name='qwen2_7b_function_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 "$@"
# Tessera: trainer.logger names tensorboard where verl's script has wandb (which works too, with the
# wandb package installed and logged in for $TESSERA_LOGGER_PYTHON, else python3), and
# actor_rollout_ref.model.path is a local HF directory (MODEL_PATH) where verl's names a hub id:
# Tessera does not download one (it reads a hub id from the local HF cache only). rollout.name=vllm
# is listed at start as having no effect on Tessera's own engine; gpu_memory_utilization sizes its
# KV cache.
