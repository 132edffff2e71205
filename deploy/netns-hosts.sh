#!/usr/bin/env bash
# Test hosts on one machine: N network namespaces, each its own "host" with an address on a
# private subnet and its own host name, reachable from this machine over veth pairs. Agents run
# in them exactly as on separate machines: TCP between hosts, no shared memory, no Unix sockets.
#
#   deploy/netns-hosts.sh up N [PREFIX]     make PREFIX1..PREFIXN (default tsh), 10.213.I.2 each
#   deploy/netns-hosts.sh run I CMD...      run CMD on host I, with its own host name (PREFIXI)
#   deploy/netns-hosts.sh down [PREFIX]     remove them
#   deploy/netns-hosts.sh check             exit 0 if namespaces can be made here (root, iproute2)
#
# Host I is 10.213.I.2; this machine is 10.213.I.1 towards it. Needs root and `ip`; traffic
# stays on the veth pairs. `ip link set tshI-o down` cuts host I's link (the outside end).
set -euo pipefail

PREFIX_DEFAULT=tsh
addr() { echo "10.213.$1.$2"; }

up() {
  local n=${1:?up N} p=${2:-$PREFIX_DEFAULT}
  for i in $(seq 1 "$n"); do
    local ns="$p$i"
    ip netns add "$ns"
    ip link add "$p$i-o" type veth peer name "$p$i-i"
    ip link set "$p$i-i" netns "$ns"
    ip addr add "$(addr "$i" 1)/30" dev "$p$i-o"
    ip link set "$p$i-o" up
    ip -n "$ns" addr add "$(addr "$i" 2)/30" dev "$p$i-i"
    ip -n "$ns" link set "$p$i-i" up
    ip -n "$ns" link set lo up
    # Host I reaches the other hosts through this machine.
    ip -n "$ns" route add 10.213.0.0/16 via "$(addr "$i" 1)"
  done
  sysctl -qw net.ipv4.ip_forward=1
}

down() {
  local p=${1:-$PREFIX_DEFAULT}
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$p[0-9]+$" || true); do
    ip link del "$ns-o" 2>/dev/null || true
    ip netns del "$ns"
  done
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  run)
    shift
    i=${1:?run I CMD...}; shift
    p=${TESSERA_NETNS_PREFIX:-$PREFIX_DEFAULT}
    exec ip netns exec "$p$i" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$p$i" "$@"
    ;;
  check)  # root, iproute2, namespaces, a UTS namespace inside one, and IP forwarding
    [[ $(id -u) == 0 ]] && command -v ip >/dev/null && command -v unshare >/dev/null || exit 1
    [[ -w /proc/sys/net/ipv4/ip_forward ]] || exit 1
    ip netns add tsh-check 2>/dev/null || exit 1
    ok=0
    ip netns exec tsh-check unshare --uts true 2>/dev/null && ok=1
    ip netns del tsh-check
    [[ $ok == 1 ]]
    ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
