#!/usr/bin/env bash
# run_fuzz_proto.sh FUZZER WORKDIR [RUNS] [extra libFuzzer args...]
# Writes the seed corpus (valid frames) into WORKDIR/corpus, then fuzzes proto::decode for RUNS
# executions (default 20000). Exit status is libFuzzer's: non-zero on any crash or leak.
set -euo pipefail
fuzzer=$1
work=$2
runs=${3:-20000}
shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$work/corpus" "$work/artifacts"
TESSERA_FUZZ_WRITE_SEEDS="$work/corpus" "$fuzzer"
export OMP_NUM_THREADS=1
exec "$fuzzer" "$work/corpus" -runs="$runs" -max_len=8192 -rss_limit_mb=4096 -timeout=10 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@"
