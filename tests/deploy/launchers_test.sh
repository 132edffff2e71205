#!/usr/bin/env bash
# The launchers that need a real cluster, checked without one:
#  - the systemd unit passes `systemd-analyze verify` (as an instance, tessera-agent@7100), and a
#    broken copy does not (so the check is real);
#  - the Slurm script, run with fake srun/scontrol/tessera on a 2-node "allocation" with 8 GPUs
#    per node, starts one agent per node with the node's devices and a mode-600 token, waits for
#    their ready lines, and starts the driver with both agents, trainer.nnodes=2 and cuda.
set -euo pipefail
DEPLOY=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if command -v systemd-analyze >/dev/null; then
  cp "$DEPLOY/systemd/tessera-agent@.service" "$DIR/tessera-agent@7100.service"
  out=$(systemd-analyze verify "$DIR/tessera-agent@7100.service" 2>&1) || fail "systemd-analyze verify: $out"
  [[ -z "$out" ]] || fail "systemd-analyze verify warns: $out"
  sed 's|^ExecStart=/bin/sh|ExecStart=bin/sh|' "$DIR/tessera-agent@7100.service" > "$DIR/broken@7100.service"
  if systemd-analyze verify "$DIR/broken@7100.service" >/dev/null 2>&1; then fail "a broken unit passed verify"; fi
else
  echo "systemd-analyze not installed: the unit file is not checked"
fi

# Fake Slurm: scontrol names two nodes; srun runs its command once per node with `hostname`
# answering that node's name; the fake tessera logs its arguments and, as an agent, its ready line.
mkdir -p "$DIR/bin" "$DIR/submit"
cat > "$DIR/bin/scontrol" <<'SH'
#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] && printf 'node-a\nnode-b\n'
SH
cat > "$DIR/bin/srun" <<'SH'
#!/usr/bin/env bash
echo "srun $*" >> "$FAKE_LOG"
cmd="${@: -1}"
for node in node-a node-b; do
  mkdir -p "$FAKE_DIR/$node"
  printf '#!/bin/sh\necho %s\n' "$node" > "$FAKE_DIR/$node/hostname"; chmod +x "$FAKE_DIR/$node/hostname"
  PATH="$FAKE_DIR/$node:$PATH" bash -c "$cmd" &
done
wait
SH
cat > "$DIR/bin/tessera" <<'SH'
#!/usr/bin/env bash
echo "tessera $*" >> "$FAKE_LOG"
[[ $1 == agent ]] && echo "tessera agent ready on $(hostname):7100"
exit 0
SH
chmod +x "$DIR/bin/"*
export FAKE_LOG="$DIR/calls.log" FAKE_DIR="$DIR/nodes"
(cd "$DIR/submit" && PATH="$DIR/bin:$PATH" SLURM_SUBMIT_DIR="$DIR/submit" SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 \
   SLURM_JOB_NODELIST="node-[a-b]" SLURM_GPUS_PER_NODE="h100:8" TESSERA_BIN="$DIR/bin/tessera" \
   timeout 60 bash "$DEPLOY/slurm/tessera.sbatch" run.yaml trainer.total_epochs=1) || fail "the sbatch script failed"

job="$DIR/submit/.tessera-42"
[[ $(stat -c %a "$job/token") == 600 ]] || fail "token mode $(stat -c %a "$job/token")"
[[ $(tr -d '\n' < "$job/token" | wc -c) == 64 ]] || fail "token is not 32 random bytes in hex"
grep -q '^srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 ' "$FAKE_LOG" || fail "srun line: $(grep srun "$FAKE_LOG")"
for node in node-a node-b; do
  grep -q "^tessera agent --listen 0.0.0.0:7100 --advertise-host $node --devices cuda:0-7 --token-file $job/token$" \
    "$FAKE_LOG" || fail "no agent launched on $node as expected: $(grep agent "$FAKE_LOG")"
done
want="tessera train run.yaml trainer.total_epochs=1 cluster.agents=[node-a:7100,node-b:7100] cluster.token_file=$job/token trainer.device=cuda trainer.nnodes=2"
grep -qxF "$want" "$FAKE_LOG" || fail "driver line: $(grep 'tessera train' "$FAKE_LOG")"
echo "launchers: OK"
