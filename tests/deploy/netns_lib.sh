# Shared by the tests that run agents on network-namespace hosts (deploy/netns-hosts.sh): a tiny
# model and arithmetic dataset, agents started per host, the GRPO overrides they all use, and
# the comparison of two runs' metrics. Sourced after `set -euo pipefail`, with DEPLOY set (the
# deploy/ folder) and TESSERA_BIN in the environment.
#
# Skips the sourcing test (exit 77) where namespaces cannot be made (not root, no iproute2).

BIN=${TESSERA_BIN:?}
PY=${TESSERA_PYTHON:-python3}
NET="$DEPLOY/netns-hosts.sh"
"$NET" check || { echo "SKIP: network namespaces cannot be made here (needs root and iproute2)"; exit 77; }
export TESSERA_NETNS_PREFIX="tsn$$"
DIR=$(mktemp -d)
AGENT_PIDS=()   # by host index
AGENT_ENV=()    # environment assignments for the next start_agent_with
EXTRA_PIDS=()    # other processes the test started (sshds)
AGENTS=()        # agents started by other means (ssh-cluster.sh)

netns_cleanup() {
  for pid in "${AGENT_PIDS[@]}" "${EXTRA_PIDS[@]}" "${AGENTS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for f in "$DIR"/remote/*.pid; do [[ -f $f ]] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$NET" down "$TESSERA_NETNS_PREFIX" || true
  rm -rf "$DIR"
}
trap netns_cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$DIR"/*.log; do echo "--- $f"; tail -8 "$f"; done >&2
  exit 1
}

# make_inputs: $DIR/model (a tiny qwen2 of MODEL_SIZE), $DIR/train.jsonl and the agents' token.
MODEL_SIZE=(--hidden 32 --layers 2 --heads 4 --kv-heads 2 --intermediate 64)
make_inputs() {
  "$BIN" init-model --arch qwen2 "${MODEL_SIZE[@]}" --tokenizer "chars:0123456789+= 
abcdefghijklmnopqrstuvwxyz" --seed 7 --max-position 64 --out "$DIR/model" >/dev/null
  "$PY" - "$DIR/train.jsonl" <<'PY'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(32):
        a, b = random.randint(0, 9), random.randint(0, 9)
        f.write(json.dumps({"data_source": "tessera/arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                            "extra_info": {"split": "train", "index": i}}) + "\n")
PY
  (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$DIR/token")
}

# start_agent I [env assignments...]: agent on host I (10.213.I.2:7100, 2 CPU ranks), log in
# $DIR/agentI.log (appended), ready when this returns. start_agent_with I [agent flags...]: the
# same with more flags.
start_agent() {
  local i=$1; shift
  AGENT_ENV=("$@")
  start_agent_with "$i"
  AGENT_ENV=()
}
start_agent_with() {
  local i=$1; shift
  local log="$DIR/agent$i.log" before
  before=$(grep -cs '^tessera agent ready ' "$log" || true)
  env "${AGENT_ENV[@]}" "$NET" run "$i" "$BIN" agent --listen "10.213.$i.2:7100" --advertise-host "10.213.$i.2" \
    --devices cpu:2 --token-file "$DIR/token" "$@" >> "$log" 2>&1 &
  AGENT_PIDS[$i]=$!
  for _ in $(seq 1 300); do
    (( $(grep -cs '^tessera agent ready ' "$log" || true) > ${before:-0} )) && return 0
    kill -0 "${AGENT_PIDS[$i]}" 2>/dev/null || fail "agent $i exited"
    sleep 0.1
  done
  fail "agent $i did not start"
}

# The GRPO run every netns test makes (2 steps unless overridden later on the command line).
COMMON=(data.max_prompt_length=32 data.max_response_length=4 data.train_batch_size=8
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.dtype=float32
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32
  ++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32
  algorithm.adv_estimator=grpo trainer.device=cpu trainer.num_threads=1 trainer.total_training_steps=2
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[jsonl]
  trainer.resume_mode=disable)
inputs_overrides() {
  echo data.train_files="$DIR/train.jsonl" data.val_files="$DIR/train.jsonl" actor_rollout_ref.model.path="$DIR/model"
}
# The overrides that put a run on the agents of hosts 1..N.
hosts_overrides() {
  local n=$1 addrs=() i
  for i in $(seq 1 "$n"); do addrs+=("10.213.$i.2:7100"); done
  echo trainer.nnodes="$n" trainer.n_gpus_per_node=2 "cluster.agents=[$(IFS=,; echo "${addrs[*]}")]" \
    cluster.token_file="$DIR/token"
}

# same_metrics A.jsonl B.jsonl STEPS: every actor/critic/length metric of every step agrees.
same_metrics() {
  "$PY" - "$@" <<'PY'
import json, math, sys
a_path, b_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [[json.loads(l) for l in open(p)] for p in (a_path, b_path)]
assert len(runs[0]) == len(runs[1]) == steps, [len(r) for r in runs]
keys = [k for k in runs[0][0] if k.split("/")[0] in ("critic", "actor", "response_length", "prompt_length")
        and k not in ("actor/lr",)]
assert keys, runs[0][0].keys()
for a, b in zip(*runs):
    assert a["step"] == b["step"], (a["step"], b["step"])
    for k in keys:
        assert k in b, k
        assert math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6), (a["step"], k, a[k], b[k])
print(f"{len(keys)} metrics x {steps} steps agree")
PY
}
