#!/usr/bin/env bash
# bench/fuzz.sh [EXECS]: a long fuzz run of Tessera's two untrusted-input parsers (docs/fuzzing.md).
#
#   fuzz_proto_decode  proto::decode, the DataProto wire decoder
#   fuzz_call_frame    the call channel's frame parser (runtime/internal/call_frame.hpp)
#
# Builds both libFuzzer targets (needs TESSERA_FUZZ_CLANG set in the build, e.g. clang++-14;
# TESSERA_FUZZ_NO_BUILD=1 uses them as they are), then runs each for EXECS executions in all
# (default 10000000), split over TESSERA_FUZZ_PROCS processes (default 2, one per core) that share
# one corpus, starting from the seeds (valid frames) plus tests/fuzz/regressions/<target>/.
# Prints one row per target: executions, wall time, execs/s (all processes together), coverage
# (libFuzzer's cov: edges and ft: features of the final corpus, replayed once) and crashes
# (any crash, leak, timeout or allocation over 256 MiB; must be 0). Exit status 1 if any.
#
# Environment: TESSERA_BUILD_DIR (default <repo>/build), TESSERA_FUZZ_WORK (default
# <build>/fuzz_bench; each target's corpus, logs and crashing inputs go to <work>/<target>/).
set -uo pipefail
execs=${1:-10000000}
repo="$(cd "$(dirname "$0")/.." && pwd)"
build=${TESSERA_BUILD_DIR:-$repo/build}
work=${TESSERA_FUZZ_WORK:-$build/fuzz_bench}
procs=${TESSERA_FUZZ_PROCS:-2}
targets=(fuzz_proto_decode fuzz_call_frame)

if [[ -z "${TESSERA_FUZZ_NO_BUILD:-}" ]]; then
  lock=()
  command -v flock > /dev/null && lock=(flock /tmp/tessera-build.lock)
  "${lock[@]}" ninja -C "$build" -j"$procs" "${targets[@]}" || { echo "fuzz.sh: build failed" >&2; exit 2; }
fi

export OMP_NUM_THREADS=1
flags=(-max_len=8192 -rss_limit_mb=4096 -malloc_limit_mb=256 -timeout=10 -reload=1
       -print_final_stats=1)
rows=()
failed=0
for target in "${targets[@]}"; do
  bin="$build/bin/$target"
  [[ -x "$bin" ]] || { echo "fuzz.sh: $bin is not built" >&2; exit 2; }
  dir="$work/$target"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  TESSERA_FUZZ_WRITE_SEEDS="$dir/corpus" "$bin" > /dev/null 2>&1
  corpora=("$dir/corpus")
  [[ -d "$repo/tests/fuzz/regressions/$target" ]] && corpora+=("$repo/tests/fuzz/regressions/$target")
  echo "fuzz.sh: $target: $execs executions over $procs processes (logs in $dir)" >&2
  start=$(date +%s.%N)
  pids=()
  for ((p = 0; p < procs; p++)); do
    runs=$((execs / procs + (p < execs % procs ? 1 : 0)))
    "$bin" "${corpora[@]}" -runs="$runs" -seed=$((p + 1)) "${flags[@]}" \
      -artifact_prefix="$dir/artifacts/" > "$dir/fuzz-$p.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  done_execs=$(cat "$dir"/fuzz-*.log | awk '/^stat::number_of_executed_units:/ {s += $2} END {print s + 0}')
  # Coverage of the final corpus: replay it once (no mutation).
  "$bin" "$dir/corpus" -runs=0 "${flags[@]}" > "$dir/coverage.log" 2>&1
  cov=$(grep -o 'INITED cov: [0-9]* ft: [0-9]*' "$dir/coverage.log" | tail -1 | awk '{print $3 " / " $5}')
  corpus_n=$(ls "$dir/corpus" | wc -l)
  crashes=$(find "$dir/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' \
              -o -name 'timeout-*' \) | wc -l)
  if [[ $status -ne 0 && $crashes -eq 0 ]]; then crashes="?"; fi  # a process failed, no input kept
  [[ "$crashes" != 0 ]] && failed=1
  rate=$(echo "$done_execs / $secs" | bc)
  rows+=("$(printf '%-18s %12s %9.0f %9s %13s %7s %8s' "$target" "$done_execs" "$secs" "$rate" \
            "${cov:-?}" "$corpus_n" "$crashes")")
done

printf '%-18s %12s %9s %9s %13s %7s %8s\n' target executions seconds execs/s "cov / ft" corpus crashes
for r in "${rows[@]}"; do echo "$r"; done
if [[ $failed -ne 0 ]]; then
  echo "fuzz.sh: CRASHES FOUND: the inputs are in $work/<target>/artifacts/" >&2
  exit 1
fi
