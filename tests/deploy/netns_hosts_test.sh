#!/usr/bin/env bash
# Two hosts made as network namespaces (deploy/netns-hosts.sh), one agent in each with 2 CPU
# ranks: GRPO across them (TCP between hosts: different host names, so no shared memory or Unix
# sockets) gives the metrics of the same run on 4 ranks in one process. Skips (exit 77) where
# namespaces cannot be made (not root, no iproute2).
set -euo pipefail
DEPLOY=$1
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"

make_inputs
"$NET" up 2 "$TESSERA_NETNS_PREFIX"
start_agent 1
start_agent 2

# shellcheck disable=SC2046  # the overrides are words without spaces
"$BIN" train "${COMMON[@]}" $(inputs_overrides) trainer.n_gpus_per_node=4 trainer.default_local_dir="$DIR/embedded" \
  > "$DIR/embedded.log" 2>&1 || fail "the embedded run failed"
# shellcheck disable=SC2046
timeout 120 "$BIN" train "${COMMON[@]}" $(inputs_overrides) $(hosts_overrides 2) trainer.default_local_dir="$DIR/hosts" \
  > "$DIR/hosts.log" 2>&1 || fail "the 2-host run failed"

# The hosts are separate machines to the driver: calls over TCP, not a same-host Unix socket.
[[ $(grep -c 'calls through its call channel over TCP' "$DIR/hosts.log") == 2 ]] \
  || fail "the driver did not reach both agents over TCP: $(grep 'connected to agent' "$DIR/hosts.log")"
same_metrics "$DIR/embedded/metrics.jsonl" "$DIR/hosts/metrics.jsonl" 2 || fail "the metrics differ"
echo "netns hosts: OK"
