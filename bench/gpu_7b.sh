#!/usr/bin/env bash
# One GRPO step of the Qwen2.5-7B shape (random init, bf16) on one GPU, with parameter and
# optimizer offload and gradient checkpointing: the step time and the peak device and host memory.
#
#   bench/gpu_7b.sh BIN_DIR TOKENIZER_DIR OUT_DIR [STEPS [KEY=VALUE...]]
#
# BIN_DIR holds the `tessera` binary of a CUDA build; TOKENIZER_DIR a Qwen tokenizer directory.
# Workload: 16 prompts x n=4 of ~60 tokens, 256-token responses (ignore_eos), GRPO with the KL
# loss of examples/grpo_gsm8k.yaml. The actor's fp32 shards and AdamW state live on the host
# between phases (param_offload, optimizer_offload: ~90 GB of pinned host memory for 7.6B
# parameters), the reference's bf16 weights too (15 GB). The moments stay on the host through the update as
# well (Note [Streamed optimizer step] in workers/fsdp/fsdp_step.cpp): the device holds the fp32
# shards and gradients (~61 GB) and at most two units' moments (~6 GB), where loading them all (verl) would need
# 122 GB. An 80 GB card is the target; on a tighter one pass smaller micro-batches. Writes OUT_DIR/{model,data,run} (the model is ~15 GB) and prints each step's
# timing_s/* and peak device memory, and the process's peak host memory.
set -euo pipefail
BIN="${1:?BIN_DIR}"; TOK="${2:?TOKENIZER_DIR}"; OUT="${3:?OUT_DIR}"; STEPS="${4:-2}"
shift $(( $# < 4 ? $# : 4 ))
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT/data"
[[ -f "$OUT/model/config.json" ]] || "$BIN/tessera" init-model --arch qwen2 --hidden 3584 --layers 28 --heads 28 \
  --kv-heads 4 --intermediate 18944 --vocab-size 152064 --tokenizer "$TOK" --seed 1 --dtype bfloat16 \
  --max-position 4096 --rope-theta 1000000 --out "$OUT/model"
python3 - "$OUT/data/train.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        a, b = random.randint(2, 99), random.randint(2, 99)
        text = (f"Natalia sold {a} clips to her friends in April, and then she sold {b} more in May. How many "
                "clips did Natalia sell altogether in April and May? Let's think step by step and output the "
                "final answer after \"####\".")
        f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": text}],
                            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                            "extra_info": {"split": "train", "index": i}}) + "\n")
PY
"$BIN/tessera" train "$ROOT/examples/grpo_gsm8k.yaml" \
  data.train_files="$OUT/data/train.jsonl" data.val_files="$OUT/data/train.jsonl" \
  data.train_batch_size=16 data.max_prompt_length=128 data.max_response_length=256 \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.rollout.max_num_seqs=64 \
  actor_rollout_ref.model.enable_gradient_checkpointing=true actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.actor.fsdp_config.param_offload=true actor_rollout_ref.actor.fsdp_config.optimizer_offload=true \
  actor_rollout_ref.ref.fsdp_config.param_offload=true \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  trainer.device=cuda trainer.n_gpus_per_node=1 trainer.val_before_train=false trainer.test_freq=-1 \
  trainer.save_freq=-1 trainer.total_training_steps="$STEPS" trainer.logger=[console,jsonl] \
  trainer.default_local_dir="$OUT/run" "$@" &
# The peak host memory of the run: the process's high-water mark (VmHWM, page-locked buffers
# included), read until it exits (it only grows, so the last reading is the peak to within a second).
pid=$!
# A background command of a script ignores SIGINT: pass an interrupt or a termination on to it.
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM HUP
peak_kb=0
while kill -0 "$pid" 2>/dev/null; do
  kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [[ -n $kb && $kb -gt $peak_kb ]] && peak_kb=$kb
  sleep 1
done
rc=0
wait "$pid" || rc=$?
if (( peak_kb > 0 )); then
  awk -v kb="$peak_kb" 'BEGIN { printf "peak host memory of the tessera process (VmHWM): %.1f GiB\n", kb / 1048576 }'
else
  echo "peak host memory of the tessera process (VmHWM): unknown (no reading)"
fi
(( rc == 0 )) || exit "$rc"
python3 - "$OUT/run/metrics.jsonl" <<'PY'
import json, sys
keys = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
        "perf/mfu/actor", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb"]
print("| step | " + " | ".join(keys) + " |")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"| {r.get('step', '?')} | " + " | ".join(f"{r[k]:.3g}" if k in r else "-" for k in keys) + " |")
PY
