#!/usr/bin/env bash
# deploy/ssh-cluster.sh against real sshds: one Debian openssh-server per network-namespace host
# (deploy/netns-hosts.sh), started by the test with its own host key and a key-only login. The
# script starts an agent on each host over ssh and prints the cluster override; GRPO with that
# override gives the metrics of the same run in one process; `stop` ends both agents.
# Skips (exit 77) without netns or without sshd.
set -euo pipefail
DEPLOY=$1
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
SSHD=/usr/sbin/sshd
[[ -x $SSHD ]] || { echo "SKIP: no $SSHD (Debian's openssh-server)"; exit 77; }

make_inputs
K="$DIR/ssh"
mkdir -p "$K" "$DIR/remote" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$K/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$K/id"
cp "$K/id.pub" "$K/authorized_keys"
chmod 600 "$K/authorized_keys"
"$NET" up 2 "$TESSERA_NETNS_PREFIX"
for i in 1 2; do
  cat > "$K/sshd$i.conf" <<CONF
ListenAddress 10.213.$i.2
HostKey $K/host_key
AuthorizedKeysFile $K/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $K/sshd$i.pid
CONF
  "$NET" run "$i" "$SSHD" -D -e -f "$K/sshd$i.conf" > "$DIR/sshd$i.log" 2>&1 &
  EXTRA_PIDS+=($!)
  disown $!  # killed at cleanup without a job notice
done
export SSH="ssh -i $K/id -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5"
for i in 1 2; do
  for _ in $(seq 1 100); do $SSH "10.213.$i.2" true 2>/dev/null && break; sleep 0.1; done
  [[ $($SSH "10.213.$i.2" hostname) == "${TESSERA_NETNS_PREFIX}$i" ]] || fail "sshd on host $i is not serving"
done

printf '# the namespace hosts\n10.213.1.2 devices=cpu:2 port=7100\n10.213.2.2 devices=cpu:2\n' > "$DIR/hostfile"
export TESSERA_REMOTE_BIN="$BIN" TESSERA_TOKEN_FILE="$DIR/token" TESSERA_REMOTE_DIR="$DIR/remote"
"$DEPLOY/ssh-cluster.sh" start "$DIR/hostfile" > "$DIR/override" 2> "$DIR/start.log" || fail "ssh-cluster.sh start failed"
# shellcheck disable=SC2207  # cluster.agents=[...] cluster.token_file=...: words without spaces
OVERRIDE=($(cat "$DIR/override"))
[[ "${OVERRIDE[0]}" == "cluster.agents=[10.213.1.2:7100,10.213.2.2:7100]" ]] || fail "unexpected override: ${OVERRIDE[*]}"
# Each agent runs inside its own host (network namespace), under that host's sshd.
for i in 1 2; do
  pid=$(cat "$DIR/remote/agent-10.213.$i.2-7100.pid")
  ip netns pids "${TESSERA_NETNS_PREFIX}$i" | grep -qx "$pid" || fail "agent $pid is not in host $i's namespace"
  AGENTS+=("$pid")
done

# shellcheck disable=SC2046  # the overrides are words without spaces
"$BIN" train "${COMMON[@]}" $(inputs_overrides) trainer.n_gpus_per_node=4 trainer.default_local_dir="$DIR/embedded" \
  > "$DIR/embedded.log" 2>&1 || fail "the embedded run failed"
# shellcheck disable=SC2046
timeout 180 "$BIN" train "${COMMON[@]}" $(inputs_overrides) trainer.nnodes=2 trainer.n_gpus_per_node=2 \
  "${OVERRIDE[@]}" trainer.default_local_dir="$DIR/ssh_run" > "$DIR/ssh_run.log" 2>&1 || fail "the run on ssh-started agents failed"
same_metrics "$DIR/embedded/metrics.jsonl" "$DIR/ssh_run/metrics.jsonl" 2 || fail "the metrics differ"

"$DEPLOY/ssh-cluster.sh" stop "$DIR/hostfile" > "$DIR/stop.log" 2>&1 || fail "ssh-cluster.sh stop failed"
[[ $(grep -c '^stopped agent on ' "$DIR/stop.log") == 2 ]] || fail "stop did not stop both agents: $(cat "$DIR/stop.log")"
for pid in "${AGENTS[@]}"; do
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  ! kill -0 "$pid" 2>/dev/null || fail "agent $pid still runs after stop"
done
echo "netns ssh: OK (ssh-cluster.sh started and stopped agents on 2 sshd hosts; metrics match)"
