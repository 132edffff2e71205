#!/usr/bin/env bash
# Everything a GPU machine should check, in one command, from a bundle (deploy/bundle.sh):
# the `gpu` tests side by side, the decode benchmark (gpu_decode: eager and CUDA graphs against the
# card's measured limits), then the GRPO benchmark against HF transformers with the last step
# profiled and its trace summarised per worker method.
#
#   deploy/bundle.sh t.tar.gz tessera worker_test trainer_device_test models_hf_parity_test \
#     models_test rollout_test algos_test fsdp_test collective_nccl_test gpu_decode  # where you build
#   tar xzf t.tar.gz && source tessera-bundle/env.sh          # on the GPU machine, in this repo
#   TESSERA_SHARED_DIR=... bench/gpu_check.sh TOKENIZER_DIR OUT_DIR [STEPS]
#
# TESSERA_SHARED_DIR holds the golden fixtures the tests read. OUT_DIR gets one log per test,
# bench.log, and step_<STEPS>.summary.txt (the trace itself stays in OUT_DIR/bench/run/profile:
# it is about 1 GB for this workload). Exit status: non-zero when a test or the benchmark failed.
# TESSERA_TEST_TIMEOUT_S (default 300) and TESSERA_BENCH_TIMEOUT_S (default 600) bound them;
# TESSERA_PROFILE_7B=1 traces the 7B run's second step (OUT_DIR/7b.summary.txt);
# TESSERA_GPU_VARIANTS adds GRPO runs with overrides (see below) beside the main one.
# TESSERA_GPU_PARTS picks what runs, so that a short lease can split the work over calls:
# any of `tests decode grpo variants 7b moe` (default: all but 7b and moe; `7b` runs
# bench/gpu_7b.sh into OUT_DIR/7b, about 15 GB of model written first; `moe` gpu_decode and the
# GRPO benchmark on four layers of Qwen3-30B-A3B's shape, the latter into OUT_DIR/moe with HF
# beside it).
# A kernel that fails its once-per-process self-check ends the run with one line naming the key
# that turns it off ("set KEY=VALUE"). So that a short lease still brings figures back, a GRPO,
# variant, 7B or decode run that fails that way is run again with those keys (up to three times,
# as each run stops at the first failing check), which the later runs then keep, and the output
# says so; TESSERA_GPU_OVERRIDES="KEY=VALUE ..." passes such keys to
# every run from the start (for a second call after a first one found them).
set -uo pipefail
TOK="${1:?TOKENIZER_DIR}"; OUT="${2:?OUT_DIR}"; STEPS="${3:-3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$(dirname "$(command -v tessera)")"
[[ -x "$BIN/tessera" ]] || { echo "gpu_check: no tessera on PATH (source tessera-bundle/env.sh)" >&2; exit 2; }
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export TESSERA_SOURCE_DIR="$ROOT" TESSERA_PYTHON="${TESSERA_PYTHON:-python3}"

PARTS=" ${TESSERA_GPU_PARTS:-tests decode grpo variants} "
part() { [[ $PARTS == *" $1 "* ]]; }

status=0
pids=()
part tests && for t in collective_nccl_test worker_test trainer_device_test models_hf_parity_test models_test rollout_test algos_test fsdp_test; do
  [[ -x "$BIN/$t" ]] || { echo "gpu_check: $t is not in the bundle; skipped"; continue; }
  filter=()
  [[ $t == worker_test ]] && filter=(--gtest_filter='*OnDevice*:*DevicePlacement*')
  [[ $t == models_test || $t == rollout_test || $t == algos_test || $t == fsdp_test ]] && filter=(--gtest_filter='*OnCuda*')
  ( OMP_NUM_THREADS=1 timeout "${TESSERA_TEST_TIMEOUT_S:-300}" "$BIN/$t" "${filter[@]}" > "$OUT/$t.log" 2>&1 ) &
  pids+=("$!:$t")
done
for entry in "${pids[@]+"${pids[@]}"}"; do
  pid=${entry%%:*}; t=${entry#*:}
  if wait "$pid"; then echo "$t: passed ($(grep -c '^\[       OK \]' "$OUT/$t.log") ok, $(awk '/^\[  SKIPPED \] [A-Za-z]/ {print $4}' "$OUT/$t.log" | sort -u | wc -l) skipped)"
  else echo "$t: FAILED (see $OUT/$t.log)"; grep -E '^\[  FAILED  \]|Failure' "$OUT/$t.log" | head -5; status=1; fi
done

# The keys a failed kernel self-check names in log $1 ("set KEY=VALUE" with the value that turns the
# kernel off; model.use_liger is the actor's).
fixes_named_in() {
  grep -oE '(actor_rollout_ref\.rollout\.engine_kwargs\.tessera\.[a-z_]+=(false|torch|gather|heads)|model\.use_liger=false)' "$1" \
    | sed 's/^model\.use_liger/actor_rollout_ref.model.use_liger/' | sort -u
}
read -r -a FIXES <<< "${TESSERA_GPU_OVERRIDES-}"
((${#FIXES[@]})) && echo "overrides for every run: ${FIXES[*]}"
# fix_args KIND: the keys in FIXES as arguments of a run of KIND: `keys` (tessera's KEY=VALUE) or
# `decode` (gpu_decode's flags for the rollout's keys).
fix_args() {
  local k
  for k in "${FIXES[@]+"${FIXES[@]}"}"; do
    if [[ $1 == keys ]]; then printf '%s\n' "$k"; continue; fi
    case $k in
      *.tessera.fused_layers=*) printf -- '--fused-layers=%s\n' "${k##*=}" ;;
      *.tessera.sampler=*) printf -- '--sampler=%s\n' "${k##*=}" ;;
      *.tessera.decode_attention=*) printf -- '--attention=%s\n' "${k##*=}" ;;
      *.tessera.split_decode_attention=*) printf -- '--split-decode-attention=%s\n' "${k##*=}" ;;
    esac
  done
}
# run_with_fixes NAME LOG KIND CMD...: runs CMD with FIXES as KIND's arguments, into LOG; when it
# fails naming keys that turn a kernel off, keeps the failed log as LOG.failed-N, adds the keys to
# FIXES and runs again (a run stops at the first kernel whose check fails, so a second failing
# kernel shows only in the rerun): at most three reruns, each with keys no earlier run named.
run_with_fixes() {
  local name=$1 log=$2 kind=$3 extra=() named=() fresh=() k reruns=0
  shift 3
  while :; do
    mapfile -t extra < <(fix_args "$kind")
    timeout "${TESSERA_BENCH_TIMEOUT_S:-600}" "$@" "${extra[@]+"${extra[@]}"}" > "$log" 2>&1 && return 0
    ((reruns < 3)) || return 1
    mapfile -t named < <(fixes_named_in "$log")
    fresh=()
    for k in "${named[@]+"${named[@]}"}"; do [[ " ${FIXES[*]-} " == *" $k "* ]] || fresh+=("$k"); done
    ((${#fresh[@]})) || return 1
    reruns=$((reruns + 1))
    echo "$name: a kernel failed its check ($(grep -m1 -oE '[^:]*(:[0-9]+[^:]*)?(disagree|failed on|drew token)[^;]*' "$log" | head -c 200)); again with ${fresh[*]} (see $log.failed-$reruns)"
    mv "$log" "$log.failed-$reruns"
    FIXES+=("${fresh[@]}")
  done
}

if part decode && [[ -x "$BIN/gpu_decode" ]]; then
  rm -f "$OUT/decode.json"  # written by a run that succeeds; never an earlier call's
  run_with_fixes gpu_decode "$OUT/decode.log" decode "$BIN/gpu_decode" --json "$OUT/decode.json" \
    && cat "$OUT/decode.log" || { echo "gpu_decode: FAILED (see $OUT/decode.log)"; tail -5 "$OUT/decode.log"; status=1; }
fi
if ! part grpo; then
  :
elif run_with_fixes benchmark "$OUT/bench.log" keys bash "$ROOT/bench/gpu_grpo.sh" "$BIN" "$TOK" "$OUT/bench" "$STEPS" \
     "trainer.profile_steps=[$STEPS]"; then
  sed -n '/^| step /,$p' "$OUT/bench.log"
else
  echo "benchmark: FAILED (see $OUT/bench.log)"; tail -5 "$OUT/bench.log"; status=1
fi
if [[ -f "$OUT/decode.json" && -f "$OUT/bench/hf.json" ]]; then  # the issue's decode goal: >= 10x HF
  python3 - "$OUT/decode.json" "$OUT/bench/hf.json" <<'PY'
import json, sys
d, hf = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for name, key in (("heads", "graph"), ("tiled", "tiled_graph")):
    if not d.get(key + "_generate_tok_s"):
        print(f"decode, {name} attention kernel: no figure (see decode.log)")
        continue
    print(f"decode vs HF generate ({hf['card']}), {name} attention kernel: Tessera "
          f"{d[key + '_generate_tok_s']:.0f} tok/s generate ({d[key + '_decode_tok_s']:.0f} decode) against HF "
          f"{hf['generate_tok_s']:.0f}: {d[key + '_generate_tok_s'] / hf['generate_tok_s']:.1f}x")
PY
fi
# Variants of the GRPO benchmark on the same model and HF figures, one line each (step STEPS):
# TESSERA_GPU_VARIANTS="name:key=value,key=value name2:..." (e.g. liger:actor_rollout_ref.model.use_liger=true);
# one with trainer.profile_steps=[STEPS] among its keys (TESSERA_PROFILE_VARIANTS=1 adds it to each)
# also gets its trace summarised.
# Unset: `tuned`, the settings a user after speed would pick on one 80 GB card (no gradient
# checkpointing, the fused layer kernels, token-balanced micro-batches in every phase); HF runs
# without checkpointing beside it.
A="actor_rollout_ref"
TUNED="tuned:$A.model.enable_gradient_checkpointing=false,$A.model.use_liger=true,$A.actor.use_dynamic_bsz=true"
TUNED+=",$A.actor.ppo_max_token_len_per_gpu=16384,$A.rollout.log_prob_use_dynamic_bsz=true"
TUNED+=",$A.rollout.log_prob_max_token_len_per_gpu=32768,$A.ref.log_prob_use_dynamic_bsz=true"
TUNED+=",$A.ref.log_prob_max_token_len_per_gpu=32768"
part variants && for variant in ${TESSERA_GPU_VARIANTS-$TUNED}; do
  name=${variant%%:*}; IFS=',' read -r -a overrides <<< "${variant#*:}"
  [[ ${TESSERA_PROFILE_VARIANTS:-0} == 1 ]] && overrides+=("trainer.profile_steps=[$STEPS]")
  vdir="$OUT/variant_$name"; mkdir -p "$vdir"
  [[ -d "$OUT/bench/model" ]] && ln -sfn "$OUT/bench/model" "$vdir/model"
  for f in "$OUT"/bench/hf*.json; do [[ -f "$f" ]] && cp "$f" "$vdir/"; done
  if run_with_fixes "variant $name" "$OUT/variant_$name.log" keys bash "$ROOT/bench/gpu_grpo.sh" "$BIN" "$TOK" "$vdir" \
       "$STEPS" "${overrides[@]}"; then
    echo "variant $name (${overrides[*]}${FIXES[*]+; then ${FIXES[*]}}):"; grep -E "^\| $STEPS \||step / HF" "$OUT/variant_$name.log"
    # A variant that asks for trainer.profile_steps=[STEPS] gets its trace summarised like the main run's.
    vtrace="$vdir/run/profile/step_$STEPS.pt.trace.json"
    if [[ -f "$vtrace" ]]; then
      python3 "$ROOT/bench/trace_summary.py" "$vtrace" > "$OUT/variant_$name.summary.txt" \
        && head -40 "$OUT/variant_$name.summary.txt"
    fi
  else
    echo "variant $name: FAILED (see $OUT/variant_$name.log)"; tail -3 "$OUT/variant_$name.log"; status=1
  fi
done
if part 7b; then
  # TESSERA_PROFILE_7B=1 profiles the second step and summarises its trace (the step's figures then
  # carry the profiler's overhead; the first step's do not, but include the warm-up).
  profile_7b=()
  [[ ${TESSERA_PROFILE_7B:-0} == 1 ]] && profile_7b=("trainer.profile_steps=[2]")
  if run_with_fixes 7b "$OUT/7b.log" keys bash "$ROOT/bench/gpu_7b.sh" "$BIN" "$TOK" "$OUT/7b" 2 "${profile_7b[@]+"${profile_7b[@]}"}"; then
    grep -h 'peak host memory' "$OUT/7b.log"; sed -n '/^| step /,$p' "$OUT/7b.log"
    trace_7b="$OUT/7b/run/profile/step_2.pt.trace.json"
    if [[ -f "$trace_7b" ]]; then
      python3 "$ROOT/bench/trace_summary.py" "$trace_7b" > "$OUT/7b.summary.txt" && head -60 "$OUT/7b.summary.txt"
    fi
  else
    echo "7b: FAILED (see $OUT/7b.log)"; tail -5 "$OUT/7b.log"; status=1
  fi
fi
if part moe; then
  if [[ -x "$BIN/gpu_decode" ]]; then  # decode of Qwen3-30B-A3B's layers: grouped expert GEMMs in CUDA graphs
    run_with_fixes "gpu_decode (qwen3-moe)" "$OUT/moe_decode.log" decode "$BIN/gpu_decode" --model qwen3-moe \
      --tail-rows 0 --turn-tokens 0 --json "$OUT/moe_decode.json" && cat "$OUT/moe_decode.log" \
      || { echo "gpu_decode (qwen3-moe): FAILED (see $OUT/moe_decode.log)"; tail -5 "$OUT/moe_decode.log"; status=1; }
  fi
  if TESSERA_BENCH_SHAPE=qwen3-moe run_with_fixes moe "$OUT/moe.log" keys bash "$ROOT/bench/gpu_grpo.sh" "$BIN" "$TOK" \
       "$OUT/moe" "$STEPS"; then
    sed -n '/^| step /,$p' "$OUT/moe.log"
  else
    echo "moe: FAILED (see $OUT/moe.log)"; tail -5 "$OUT/moe.log"; status=1
  fi
fi
trace="$OUT/bench/run/profile/step_$STEPS.pt.trace.json"
if part grpo && [[ -f "$trace" ]]; then
  python3 "$ROOT/bench/trace_summary.py" "$trace" > "$OUT/step_$STEPS.summary.txt" && head -40 "$OUT/step_$STEPS.summary.txt"
fi
exit $status
