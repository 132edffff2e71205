#!/usr/bin/env bash
# Starts N Tessera node agents on loopback, for trying multi-process runs on one machine.
#
#   deploy/local-cluster.sh N [--devices cpu:1] [--dir DIR]   start N agents, print the override
#   deploy/local-cluster.sh stop [--dir DIR]                  stop the agents started in DIR
#   deploy/local-cluster.sh status [--dir DIR]                which agents in DIR are alive
#
# A fresh random token (mode 600) is written to DIR/token for every start. The last line printed
# is the override to pass to `tessera train|demo|repl`:
#   cluster.agents=[127.0.0.1:PORT,...] cluster.token_file=DIR/token
# Environment: TESSERA_BIN (default build/bin/tessera), TESSERA_AGENT_READY_S (default 60).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TESSERA_BIN:-$ROOT/build/bin/tessera}"
READY_S="${TESSERA_AGENT_READY_S:-60}"
DIR="${TMPDIR:-/tmp}/tessera-cluster-$(id -un)"
DEVICES="cpu:1"

die() { printf 'local-cluster.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

stop_all() {
  [[ -f "$DIR/pids" ]] || { echo "no agents recorded in $DIR"; return 0; }
  local pid
  while read -r pid; do
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" && echo "stopped agent pid $pid"; fi
  done < "$DIR/pids"
  rm -f "$DIR/pids"
}

status_all() {
  [[ -f "$DIR/pids" ]] || { echo "no agents recorded in $DIR"; return 1; }
  local pid rc=0
  while read -r pid; do
    if kill -0 "$pid" 2>/dev/null; then echo "agent pid $pid: alive"; else echo "agent pid $pid: dead"; rc=1; fi
  done < "$DIR/pids"
  return $rc
}

# Waits until agent i's log holds its "ready" line (or the agent died), then prints HOST:PORT.
wait_ready() {
  local i=$1 pid=$2 log="$DIR/agent-$1.log" deadline=$((SECONDS + READY_S)) line
  while (( SECONDS < deadline )); do
    line=$(grep -m1 '^tessera agent ready ' "$log" 2>/dev/null || true)
    if [[ -n "$line" ]]; then
      sed -E 's/.* listen=([^ ]+) .*/\1/' <<<"$line"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || die "agent $i (pid $pid) exited before it was ready; see $log: $(tail -n1 "$log")"
    sleep 0.1
  done
  die "agent $i (pid $pid) not ready after ${READY_S}s; see $log"
}

start_all() {
  local n=$1
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got '$n'"
  [[ -x "$BIN" ]] || die "no tessera binary at $BIN (build first: deploy/dev.sh build, or set TESSERA_BIN)"
  mkdir -p "$DIR"
  stop_all >/dev/null
  # A previous run's logs hold its "ready" lines; the new agents' redirections truncate them only
  # when the background jobs start, which may be after wait_ready's first look.
  rm -f "$DIR"/agent-*.log
  (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$DIR/token")
  chmod 600 "$DIR/token"
  local i pids=() addrs=()
  for ((i = 0; i < n; i++)); do
    "$BIN" agent --listen 127.0.0.1:0 --devices "$DEVICES" --token-file "$DIR/token" \
      > "$DIR/agent-$i.log" 2>&1 &
    pids+=($!)
    echo "$!" >> "$DIR/pids"
  done
  local addr
  for ((i = 0; i < n; i++)); do
    addr=$(wait_ready "$i" "${pids[$i]}") || { stop_all >/dev/null; exit 1; }
    addrs+=("$addr")
    echo "agent $i: pid ${pids[$i]} listening on ${addrs[$i]} (log $DIR/agent-$i.log)" >&2
  done
  local joined
  joined=$(IFS=,; echo "${addrs[*]}")
  echo "cluster.agents=[$joined] cluster.token_file=$DIR/token"
}

[[ $# -ge 1 ]] || usage 2
cmd=$1; shift
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --devices) DEVICES=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
case $cmd in
  stop) stop_all ;;
  status) status_all ;;
  -h|--help) usage 0 ;;
  *) start_all "$cmd" ;;
esac
