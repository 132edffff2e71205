#!/usr/bin/env bash
# Starts (or stops) one Tessera node agent per host of a hostfile, over ssh.
#
#   deploy/ssh-cluster.sh start HOSTFILE     start agents, print the cluster override
#   deploy/ssh-cluster.sh stop HOSTFILE      stop them (SIGTERM: workers get a grace period)
#
# HOSTFILE: one host per line, optional fields, '#' comments:
#   gpu-node-1 devices=cuda:0-7 port=7100
#   gpu-node-2 devices=cuda:0-7
# Every host needs the same tessera build at $TESSERA_REMOTE_BIN (default: this checkout's
# build/bin/tessera path) and passwordless ssh. A fresh token is generated locally and copied to
# <remote dir>/token (mode 600) on each host; the driver reads the local copy. Each agent's log
# and pid are <remote dir>/agent-HOST-PORT.{log,pid} on its host.
# Environment: TESSERA_REMOTE_BIN, TESSERA_TOKEN_FILE (default ~/.tessera/token), SSH (default ssh),
# TESSERA_REMOTE_DIR (default ~/.tessera on each host), TESSERA_AGENT_READY_S (default 60).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REMOTE_BIN="${TESSERA_REMOTE_BIN:-$ROOT/build/bin/tessera}"
TOKEN="${TESSERA_TOKEN_FILE:-$HOME/.tessera/token}"
SSH="${SSH:-ssh}"
# Expanded by the remote shell: each host's own home unless set.
RDIR="${TESSERA_REMOTE_DIR:-\$HOME/.tessera}"
READY_S="${TESSERA_AGENT_READY_S:-60}"
DEFAULT_PORT=7100

die() { printf 'ssh-cluster.sh: %s\n' "$*" >&2; exit 1; }

# Prints "host devices port" for every host line of the file, with defaults filled in.
parse_hostfile() {
  local file=$1 n=0 host rest devices port field
  [[ -r "$file" ]] || die "cannot read hostfile '$file'"
  while IFS= read -r line || [[ -n "$line" ]]; do
    n=$((n + 1))
    line=${line%%#*}
    read -r host rest <<<"$line" || true
    [[ -z "${host:-}" ]] && continue
    devices=cpu:1; port=$DEFAULT_PORT
    for field in $rest; do
      case $field in
        devices=*) devices=${field#devices=} ;;
        port=*) port=${field#port=} ;;
        *) die "$file:$n: unknown field '$field' (expected devices=... or port=...)" ;;
      esac
    done
    [[ "$port" =~ ^[0-9]+$ ]] || die "$file:$n: port must be a number, got '$port'"
    echo "$host $devices $port"
  done < "$file"
}

start_host() {
  local host=$1 devices=$2 port=$3
  local files="$RDIR/agent-$host-$port"
  $SSH "$host" "umask 077; mkdir -p \"$RDIR\" && cat > \"$RDIR/token\"" < "$TOKEN"
  $SSH "$host" "nohup '$REMOTE_BIN' agent --listen 0.0.0.0:$port --advertise-host '$host' \
    --devices '$devices' --token-file \"$RDIR/token\" > \"$files.log\" 2>&1 < /dev/null & echo \$! > \"$files.pid\""
  local deadline=$((SECONDS + READY_S))
  until $SSH "$host" "grep -q '^tessera agent ready ' \"$files.log\""; do
    (( SECONDS < deadline )) || die "agent on $host not ready after ${READY_S}s: $($SSH "$host" "tail -n1 \"$files.log\"")"
    $SSH "$host" "kill -0 \$(cat \"$files.pid\") 2>/dev/null" \
      || die "agent on $host exited: $($SSH "$host" "tail -n1 \"$files.log\"")"
    sleep 1
  done
  echo "agent on $host:$port ($devices) ready" >&2
}

cmd=${1:-}; file=${2:-}
[[ -n "$cmd" && -n "$file" ]] || { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
mapfile -t hosts < <(parse_hostfile "$file")
[[ ${#hosts[@]} -gt 0 ]] || die "hostfile '$file' lists no hosts"
case $cmd in
  start)
    mkdir -p "$(dirname "$TOKEN")"
    (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$TOKEN")
    addrs=()
    for h in "${hosts[@]}"; do
      read -r host devices port <<<"$h"
      start_host "$host" "$devices" "$port"
      addrs+=("$host:$port")
    done
    echo "cluster.agents=[$(IFS=,; echo "${addrs[*]}")] cluster.token_file=$TOKEN"
    ;;
  stop)
    for h in "${hosts[@]}"; do
      read -r host _ port <<<"$h"
      pid="$RDIR/agent-$host-$port.pid"
      $SSH "$host" "test -f \"$pid\" && kill -TERM \$(cat \"$pid\") && rm -f \"$pid\"" \
        && echo "stopped agent on $host:$port" || echo "no running agent recorded on $host:$port"
    done
    ;;
  *) die "unknown command '$cmd' (start | stop)" ;;
esac
