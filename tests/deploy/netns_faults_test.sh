#!/usr/bin/env bash
# Faults between hosts made as network namespaces (deploy/netns-hosts.sh), one agent with 2 CPU
# ranks in each, GRPO across them with a checkpoint every step:
#   * host 2's link cut mid-step (`ip link set ... down`, no RST: only the heartbeats notice);
#   * host 2's agent killed with SIGKILL while its ranks are in update_actor.
# Each time the driver fails within the connection timeout with one line naming rank, host and
# method, and `trainer.resume_mode=auto` (link back up; agent restarted) resumes from the last
# checkpoint and ends with the metrics of an uninterrupted run. Skips (exit 77) without netns.
set -euo pipefail
DEPLOY=$1
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"

# A model big enough that update_actor lasts long enough to be killed in (~1 s a step).
MODEL_SIZE=(--hidden 128 --layers 4 --heads 4 --kv-heads 2 --intermediate 256)
make_inputs
STEPS=3
# shellcheck disable=SC2207  # the overrides are words without spaces
RUN=("${COMMON[@]}" $(inputs_overrides) trainer.total_training_steps=$STEPS trainer.save_freq=1
  actor_rollout_ref.actor.ppo_epochs=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1)
"$BIN" train "${RUN[@]}" trainer.n_gpus_per_node=4 trainer.default_local_dir="$DIR/reference" \
  > "$DIR/reference.log" 2>&1 || fail "the uninterrupted run failed"

"$NET" up 2 "$TESSERA_NETNS_PREFIX"
start_agent 1
start_agent 2 SPDLOG_LEVEL=debug  # logs each method a worker begins (Note in worker_actor.cpp)
# shellcheck disable=SC2207
HOSTS=($(hosts_overrides 2))

updates_begun() { grep -c "update_actor' begins" "$DIR/agent2.log" || true; }

# Starts the 2-host run into $DIR/$1 in the background (DRIVER), returns once its step 2 is in
# update_actor on host 2: step 1's checkpoint is complete and host 2 began another update.
start_run_and_wait_for_update() {
  local out="$DIR/$1" before
  timeout 300 "$BIN" train "${RUN[@]}" "${HOSTS[@]}" trainer.resume_mode=auto trainer.default_local_dir="$out" \
    > "$DIR/$1.first.log" 2>&1 &
  DRIVER=$!
  for _ in $(seq 1 3000); do
    [[ -s "$out/latest_checkpointed_iteration.txt" ]] && break
    kill -0 "$DRIVER" 2>/dev/null || fail "$1: the run ended before its first checkpoint"
    sleep 0.02
  done
  before=$(updates_begun)
  for _ in $(seq 1 3000); do
    (( $(updates_begun) > before )) && return 0
    kill -0 "$DRIVER" 2>/dev/null || fail "$1: the run ended before step 2's update"
    sleep 0.01
  done
  fail "$1: host 2 never began step 2's update_actor"
}

# Waits for the interrupted driver: it must fail (not time out) within LIMIT seconds of the fault
# with one error line naming a rank, a host and a method.
expect_prompt_failure() {
  local name=$1 t0=$2 limit=$3 rc=0
  wait "$DRIVER" || rc=$?
  local took=$((SECONDS - t0))
  (( rc != 0 )) || fail "$name: the driver succeeded despite the fault"
  (( rc != 124 )) || fail "$name: the driver hung until the test's timeout"
  (( took <= limit )) || fail "$name: the driver took ${took}s to fail (limit ${limit}s)"
  local err
  err=$(grep -m1 '^tessera train: ' "$DIR/$name.first.log" || true)
  [[ -n "$err" ]] || fail "$name: no 'tessera train: ...' error line"
  for part in "rank " "10.213." "update_actor"; do
    [[ "$err" == *"$part"* ]] || fail "$name: the error does not name '$part': $err"
  done
  echo "$name: driver failed in ${took}s: $err"
}

# Resumes the run in $DIR/$1 and checks it against the uninterrupted one.
resume_and_compare() {
  timeout 300 "$BIN" train "${RUN[@]}" "${HOSTS[@]}" trainer.resume_mode=auto \
    trainer.default_local_dir="$DIR/$1" > "$DIR/$1.resumed.log" 2>&1 || fail "$1: the resumed run failed"
  grep -qi 'resum' "$DIR/$1.resumed.log" || fail "$1: the second run did not resume from a checkpoint"
  same_metrics "$DIR/reference/metrics.jsonl" "$DIR/$1/metrics.jsonl" "$STEPS" || fail "$1: metrics differ"
}

# 1. Host 2's link goes down mid-step (the connection timeout is 4 s).
start_run_and_wait_for_update cut
ip link set "${TESSERA_NETNS_PREFIX}2-o" down
expect_prompt_failure cut "$SECONDS" 20
ip link set "${TESSERA_NETNS_PREFIX}2-o" up
resume_and_compare cut

# 2. Host 2's agent is killed while its ranks are in update_actor.
start_run_and_wait_for_update kill
kill -9 "${AGENT_PIDS[2]}"
expect_prompt_failure kill "$SECONDS" 20
start_agent 2 SPDLOG_LEVEL=debug
resume_and_compare kill
echo "netns faults: OK (link cut, kill -9: both failed promptly and resumed to the same metrics)"
