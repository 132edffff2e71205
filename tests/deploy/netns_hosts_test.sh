#!/usr/bin/env bash
# Two hosts made as network namespaces (deploy/netns-hosts.sh), one agent in each with 2 CPU
# ranks: GRPO across them (TCP between hosts: different host names, so no shared memory or Unix
# sockets) gives the metrics of the same run on 4 ranks in one process. Skips (exit 77) where
# namespaces cannot be made (not root, no iproute2).
set -euo pipefail
DEPLOY=$1
BIN=${TESSERA_BIN:?}
PY=${TESSERA_PYTHON:-python3}
NET="$DEPLOY/netns-hosts.sh"
"$NET" check || { echo "SKIP: network namespaces cannot be made here (needs root and iproute2)"; exit 77; }
export TESSERA_NETNS_PREFIX="tsn$$"
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$NET" down "$TESSERA_NETNS_PREFIX" || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$DIR"/agent*.log; do echo "--- $f"; tail -5 "$f"; done >&2; exit 1; }

"$BIN" init-model --arch qwen2 --hidden 32 --layers 2 --heads 4 --kv-heads 2 --intermediate 64 \
  --tokenizer "chars:0123456789+= 
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

"$NET" up 2 "$TESSERA_NETNS_PREFIX"
for i in 1 2; do
  "$NET" run "$i" "$BIN" agent --listen "10.213.$i.2:7100" --advertise-host "10.213.$i.2" --devices cpu:2 \
    --token-file "$DIR/token" > "$DIR/agent$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 1 2; do
  for _ in $(seq 1 300); do grep -qs '^tessera agent ready ' "$DIR/agent$i.log" && break; sleep 0.1; done
  grep -qs '^tessera agent ready ' "$DIR/agent$i.log" || fail "agent $i did not start"
done

common=(data.train_files="$DIR/train.jsonl" data.val_files="$DIR/train.jsonl" data.max_prompt_length=32
  data.max_response_length=4 data.train_batch_size=8 actor_rollout_ref.model.path="$DIR/model"
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.dtype=float32
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32
  ++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32
  algorithm.adv_estimator=grpo trainer.device=cpu trainer.num_threads=1 trainer.total_training_steps=2
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[jsonl]
  trainer.resume_mode=disable)
"$BIN" train "${common[@]}" trainer.n_gpus_per_node=4 trainer.default_local_dir="$DIR/embedded" \
  > "$DIR/embedded.log" 2>&1 || { tail -5 "$DIR/embedded.log"; fail "the embedded run failed"; }
timeout 120 "$BIN" train "${common[@]}" trainer.nnodes=2 trainer.n_gpus_per_node=2 \
  "cluster.agents=[10.213.1.2:7100,10.213.2.2:7100]" cluster.token_file="$DIR/token" \
  trainer.default_local_dir="$DIR/hosts" > "$DIR/hosts.log" 2>&1 || { tail -5 "$DIR/hosts.log"; fail "the 2-host run failed"; }

# The hosts are separate machines to the driver: calls over TCP, not a same-host Unix socket.
[[ $(grep -c 'calls through its call channel over TCP' "$DIR/hosts.log") == 2 ]] \
  || fail "the driver did not reach both agents over TCP: $(grep 'connected to agent' "$DIR/hosts.log")"
"$PY" - "$DIR/embedded/metrics.jsonl" "$DIR/hosts/metrics.jsonl" <<'PY'
import json, math, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(runs[0]) == len(runs[1]) == 2, [len(r) for r in runs]
keys = [k for k in runs[0][0] if k.split("/")[0] in ("critic", "actor", "response_length", "prompt_length")
        and k not in ("actor/lr",)]
assert keys, runs[0][0].keys()
for a, b in zip(*runs):
    for k in keys:
        assert k in b, k
        assert math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6), (a["step"] if "step" in a else "?", k, a[k], b[k])
print(f"{len(keys)} metrics x 2 steps agree")
PY
echo "netns hosts: OK"
