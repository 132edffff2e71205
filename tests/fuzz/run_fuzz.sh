#!/usr/bin/env bash
# run_fuzz.sh FUZZER WORKDIR [RUNS] [extra libFuzzer args...]
# Writes the fuzzer's seed corpus (valid frames) into WORKDIR/corpus, then fuzzes for RUNS
# executions (default 20000), also loading tests/fuzz/regressions/<fuzzer name>/ (inputs that once
# crashed it, kept as regression tests) when that folder exists. Exit status is libFuzzer's:
# non-zero on any crash, leak, timeout or out-of-memory (any single allocation over 256 MiB counts:
# the inputs are at most 8 KiB).
set -euo pipefail
fuzzer=$1
work=$2
runs=${3:-20000}
shift $(( $# < 3 ? $# : 3 ))
regressions="$(cd "$(dirname "$0")" && pwd)/regressions/$(basename "$fuzzer")"
corpora=("$work/corpus")
[[ -d "$regressions" ]] && corpora+=("$regressions")
mkdir -p "$work/corpus" "$work/artifacts"
TESSERA_FUZZ_WRITE_SEEDS="$work/corpus" "$fuzzer"
export OMP_NUM_THREADS=1
exec "$fuzzer" "${corpora[@]}" -runs="$runs" -max_len=8192 -rss_limit_mb=4096 -malloc_limit_mb=256 -timeout=10 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@"
