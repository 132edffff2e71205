#!/usr/bin/env bash
# TLS between a driver and agents on two network-namespace hosts (deploy/netns-hosts.sh), with
# a certificate per host made by the test (CN and subjectAltName = the host's address):
#   * GRPO across the hosts over TLS gives the metrics of the same run in one process;
#   * a driver trusting another CA is refused at connect time, one line naming the agent;
#   * a certificate issued to another host, by the trusted CA, is accepted: CAF 0.17 checks the
#     chain, not the host name (deploy/README.md says so, and what to do instead). If this
#     changes, the README must change with it.
# Skips (exit 77) where namespaces cannot be made or there is no openssl CLI.
set -euo pipefail
DEPLOY=$1
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
command -v openssl >/dev/null || { echo "SKIP: no openssl command-line tool"; exit 77; }

make_inputs
PKI="$DIR/pki"
mkdir -p "$PKI"
(
  cd "$PKI"
  key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
  ca() { key "$1"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1"; }
  leaf() {  # leaf NAME CA SUBJECT-ADDRESS
    key "$1"
    openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3"
    printf 'subjectAltName=IP:%s\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 2 \
      -extfile "$1.ext" 2>/dev/null
  }
  ca cluster_ca; ca other_ca
  leaf host1 cluster_ca 10.213.1.2
  leaf host2 cluster_ca 10.213.2.2
  leaf driver cluster_ca 10.213.0.1
  chmod 600 ./*.key
) > "$DIR/pki.log" 2>&1 || fail "making the test certificates failed"
tls_agent() {  # tls_agent HOST CERT
  start_agent_with "$1" --tls-cert "$PKI/$2.pem" --tls-key "$PKI/$2.key" --tls-cafile "$PKI/cluster_ca.pem"
}
tls_driver() {  # the driver's TLS overrides, trusting CA
  echo cluster.tls_cert="$PKI/driver.pem" cluster.tls_key="$PKI/driver.key" cluster.tls_cafile="$PKI/$1.pem"
}

"$NET" up 2 "$TESSERA_NETNS_PREFIX"
tls_agent 1 host1
tls_agent 2 host2
# shellcheck disable=SC2046  # the overrides are words without spaces
"$BIN" train "${COMMON[@]}" $(inputs_overrides) trainer.n_gpus_per_node=4 trainer.default_local_dir="$DIR/embedded" \
  > "$DIR/embedded.log" 2>&1 || fail "the embedded run failed"
# shellcheck disable=SC2046
timeout 180 "$BIN" train "${COMMON[@]}" $(inputs_overrides) $(hosts_overrides 2) $(tls_driver cluster_ca) \
  trainer.default_local_dir="$DIR/tls" > "$DIR/tls.log" 2>&1 || fail "the 2-host TLS run failed"
[[ $(grep -c 'calls through CAF' "$DIR/tls.log") == 2 ]] \
  || fail "calls did not stay on the TLS connections: $(grep 'connected to agent' "$DIR/tls.log")"
same_metrics "$DIR/embedded/metrics.jsonl" "$DIR/tls/metrics.jsonl" 2 || fail "the TLS run's metrics differ"

# A driver that trusts another CA: refused at connect time, one line naming the agent.
rc=0
# shellcheck disable=SC2046
timeout 60 "$BIN" train "${COMMON[@]}" $(inputs_overrides) $(hosts_overrides 2) $(tls_driver other_ca) \
  trainer.default_local_dir="$DIR/wrong_ca" > "$DIR/wrong_ca.log" 2>&1 || rc=$?
(( rc != 0 && rc != 124 )) || fail "a driver trusting the wrong CA was not refused promptly (rc $rc)"
grep -q "10.213.1.2:7100.*TLS" "$DIR/wrong_ca.log" || fail "the refusal does not name the agent and TLS"

# Host 2's agent presenting host 1's certificate: accepted (no host-name check in CAF 0.17).
kill "${AGENT_PIDS[2]}"; wait "${AGENT_PIDS[2]}" || true
tls_agent 2 host1
# shellcheck disable=SC2046
timeout 180 "$BIN" train "${COMMON[@]}" $(inputs_overrides) $(hosts_overrides 2) $(tls_driver cluster_ca) \
  trainer.total_training_steps=1 trainer.default_local_dir="$DIR/other_name" > "$DIR/other_name.log" 2>&1 \
  || fail "a certificate for another host name was refused: CAF now checks host names; update deploy/README.md"
echo "netns TLS: OK (2 hosts over TLS match; wrong CA refused; host names unchecked, as documented)"
