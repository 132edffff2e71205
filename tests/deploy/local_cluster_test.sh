#!/usr/bin/env bash
# local-cluster.sh: N agents start, the printed override names N distinct loopback ports and a
# mode-600 token, the agents are alive, `stop` stops all of them, and a bad device spec fails
# with the agent's one-line error and leaves no agent running.
set -euo pipefail
DEPLOY=$1
DIR=$(mktemp -d)
trap '"$DEPLOY/local-cluster.sh" stop --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$DEPLOY/local-cluster.sh" 2 --dir "$DIR" 2>/dev/null | tail -n1)
[[ "$out" =~ ^cluster\.agents=\[127\.0\.0\.1:([0-9]+),127\.0\.0\.1:([0-9]+)\]\ cluster\.token_file=(.+)$ ]] \
  || fail "unexpected override line: $out"
[[ ${BASH_REMATCH[1]} != "${BASH_REMATCH[2]}" ]] || fail "two agents on one port"
[[ ${BASH_REMATCH[3]} == "$DIR/token" ]] || fail "token file ${BASH_REMATCH[3]}"
[[ $(stat -c %a "$DIR/token") == 600 ]] || fail "token mode $(stat -c %a "$DIR/token")"
mapfile -t pids < "$DIR/pids"
[[ ${#pids[@]} == 2 ]] || fail "expected 2 pids, got ${#pids[@]}"
"$DEPLOY/local-cluster.sh" status --dir "$DIR" >/dev/null || fail "agents not alive after start"

"$DEPLOY/local-cluster.sh" stop --dir "$DIR" >/dev/null
for pid in "${pids[@]}"; do
  timeout 30 tail --pid="$pid" -f /dev/null || fail "agent $pid still running 30 s after stop"
done

if err=$("$DEPLOY/local-cluster.sh" 1 --devices cpu:0 --dir "$DIR" 2>&1); then fail "cpu:0 accepted"; fi
[[ "$err" == *"bad device spec 'cpu:0'"* ]] || fail "error does not name the device spec: $err"
[[ ! -f "$DIR/pids" ]] || fail "failed start left agents recorded"
echo "local-cluster.sh: OK"
