#!/usr/bin/env bash
# The GPU benchmark: one GRPO step of the Qwen2.5-0.5B shape (random init, bf16) on one GPU, by
# Tessera and by HF transformers on the same model directory, in the same run.
#
#   bench/gpu_grpo.sh BIN_DIR TOKENIZER_DIR OUT_DIR [STEPS [KEY=VALUE...]]
#
# BIN_DIR holds the `tessera` binary of a CUDA build; TOKENIZER_DIR a Qwen tokenizer directory
# (tokenizer.json + tokenizer_config.json). The model has Qwen2.5-0.5B's padded 151936-row
# vocabulary whatever the tokenizer's size (an odd row count puts the lm_head on unaligned cuBLAS
# kernels). Workload: 64 prompts x n=8, prompts of ~60 tokens, 256-token responses (ignore_eos),
# GRPO with the KL loss of examples/grpo_gsm8k.yaml, with the speed settings a verl user turns on
# (use_remove_padding=true, rollout.enforce_eager=false: CUDA-graph decode). Writes
# OUT_DIR/{model,data,run}, OUT_DIR/hf.json and prints Tessera's timing_s/* and perf/* of each
# step beside HF's phases (HF runs once per OUT_DIR: a second run there reuses hf.json). Python:
# the interpreter on PATH, with torch and transformers.
set -euo pipefail
BIN="${1:?BIN_DIR}"; TOK="${2:?TOKENIZER_DIR}"; OUT="${3:?OUT_DIR}"; STEPS="${4:-3}"
shift $(( $# < 4 ? $# : 4 ))  # the rest: overrides for tessera train (e.g. trainer.profile_steps=[3])
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT/data"
# TESSERA_BENCH_SHAPE=qwen3-moe: 4 layers of Qwen3-30B-A3B instead (128 experts, 8 per token, 3.1B
# parameters of which 0.9B active: its training state fits one 80 GB card).
if [[ -f "$OUT/model/config.json" ]]; then
  :
elif [[ ${TESSERA_BENCH_SHAPE:-qwen2.5-0.5b} == qwen3-moe ]]; then
  "$BIN/tessera" init-model --arch qwen3_moe --hidden 2048 --layers 4 --heads 32 --kv-heads 4 --head-dim 128 \
    --intermediate 6144 --experts 128 --experts-per-tok 8 --moe-intermediate 768 --norm-topk-prob \
    --vocab-size 151936 --tokenizer "$TOK" --seed 1 --dtype bfloat16 --max-position 4096 --rope-theta 1000000 \
    --out "$OUT/model"
else
  "$BIN/tessera" init-model --arch qwen2 --hidden 896 --layers 24 --heads 14 \
    --kv-heads 2 --intermediate 4864 --vocab-size 151936 --tokenizer "$TOK" --seed 1 --dtype bfloat16 \
    --tie-word-embeddings --max-position 4096 --rope-theta 1000000 --out "$OUT/model"
fi
python3 - "$OUT/data/train.jsonl" <<'PY'
import json, random, sys
random.seed(0)
words = "apples oranges pears friends boxes books pencils trains miles hours coins cards".split()
with open(sys.argv[1], "w") as f:
    for i in range(64 * (int(sys.argv[2]) if len(sys.argv) > 2 else 8)):
        a, b = random.randint(2, 99), random.randint(2, 99)
        text = (f"Natalia sold {a} {random.choice(words)} to her friends in April, and then she sold {b} more "
                f"in May. Each of them cost the same. How many did Natalia sell altogether in April and May? "
                "Let's think step by step and output the final answer after \"####\".")
        f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": text}],
                            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                            "extra_info": {"split": "train", "index": i}}) + "\n")
PY
# HF's figures are made once per OUT_DIR (a variant run reuses its model and hf.json). HF trains
# with gradient checkpointing as Tessera does by default (verl's enable_gradient_checkpointing);
# a run that turns it off compares with HF without it (hf-nockpt.json).
HF_JSON="$OUT/hf.json"; HF_ARGS=()
for o in "$@"; do
  [[ ${o,,} == *model.enable_gradient_checkpointing=false ]] && { HF_JSON="$OUT/hf-nockpt.json"; HF_ARGS=(--no-gradient-checkpointing); }
done
[[ -f "$HF_JSON" ]] || python3 "$ROOT/bench/hf_grpo_baseline.py" "$OUT/model" "${HF_ARGS[@]}" --json "$HF_JSON"
"$BIN/tessera" train "$ROOT/examples/grpo_gsm8k.yaml" \
  data.train_files="$OUT/data/train.jsonl" data.val_files="$OUT/data/train.jsonl" \
  data.train_batch_size=64 data.max_prompt_length=128 data.max_response_length=256 \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
  actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.rollout.enforce_eager=false \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
  trainer.device=cuda trainer.n_gpus_per_node=1 trainer.val_before_train=false trainer.test_freq=-1 \
  trainer.save_freq=-1 trainer.total_training_steps="$STEPS" trainer.logger=[console,jsonl] \
  trainer.default_local_dir="$OUT/run" "$@"
python3 - "$OUT/run/metrics.jsonl" "$HF_JSON" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hf = json.load(open(sys.argv[2]))
keys = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
        "perf/mfu/actor", "perf/max_memory_allocated_gb", "perf/throughput", "rollout/graph_decode_steps",
        "rollout/kv_cache_gb"]
print("| step | " + " | ".join(keys) + " |")
for r in rows:
    print(f"| {r.get('step', '?')} | " + " | ".join(f"{r[k]:.3g}" if k in r else "-" for k in keys) + " |")
print(f"HF ({hf['card']}, transformers {hf['transformers']}, gradient checkpointing "
      f"{'on' if hf.get('gradient_checkpointing', True) else 'off'}): generate {hf['generate_s']:.2f} s "
      f"({hf['generate_tok_s']:.0f} tok/s), log-prob {hf['log_prob_s']:.2f} s, update {hf['update_s']:.2f} s "
      f"(MFU {hf['update_mfu']:.1%}), composed step {hf['composed_step_s']:.2f} s")
last = rows[-1]
print(f"Tessera step / HF composed step: {last['timing_s/step'] / hf['composed_step_s']:.2f}x")
if hf.get("matmul_flops_per_s"):  # the card's floors: each phase's matmul FLOPs at its measured bf16 rate
    rate = hf["matmul_flops_per_s"]
    fwd, upd = hf["forward_flops"] / rate, hf["update_flops"] / rate
    # An on-policy step skips old_log_prob (trainer.skip_on_policy_old_log_prob): the reference's
    # forward is then the log-prob pass to compare.
    phase = "old_log_prob" if "timing_s/old_log_prob" in last else "ref"
    lp = last[f"timing_s/{phase}"]
    print(f"Floors at the measured bf16 matmul rate ({rate / 1e12:.0f} TFLOP/s): log-prob forward {fwd:.2f} s "
          f"(Tessera {phase} {lp:.2f} s, {fwd / lp:.0%} of the rate; "
          f"HF / 3 = {hf['log_prob_s'] / 3:.2f} s), update {upd:.2f} s without recompute "
          f"(Tessera {last['timing_s/update_actor']:.2f} s, {upd / last['timing_s/update_actor']:.0%})")
PY
