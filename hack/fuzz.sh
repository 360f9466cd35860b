#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan + libFuzzer)
# and runs each for a bounded time, starting from its seed corpus in
# fuzz/corpus/<target>/ (copied: the repository's corpus is not changed).
# Fails on any crash, leak, sanitizer report, timeout or out-of-memory; the
# input that caused it is kept in $FUZZ_OUT/artifacts. Prints the executions
# per target.
#
#   hack/fuzz.sh                 every target, 60 s each
#   FUZZ_TIME=10 hack/fuzz.sh    10 s each
#   hack/fuzz.sh kubeconfig      one target
#
# Environment: FUZZ_TIME (seconds per target, default 60), FUZZ_BUILD (build
# directory, default build-fuzz), FUZZ_OUT (work directory, default
# $FUZZ_BUILD/fuzz-run), CC (default clang).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
time_per_target=${FUZZ_TIME:-60}
build=${FUZZ_BUILD:-build-fuzz}
out=${FUZZ_OUT:-$build/fuzz-run}
all_targets=(json_decode kubeconfig http_response)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all_targets[@]}"); fi

case "$time_per_target" in
  ''|*[!0-9]*) echo "fuzz.sh: FUZZ_TIME must be a whole number of seconds" >&2; exit 2 ;;
esac
for t in "${targets[@]}"; do
  if [ ! -d "fuzz/corpus/$t" ]; then echo "fuzz.sh: unknown target $t (${all_targets[*]})" >&2; exit 2; fi
done

cmake -S . -B "$build" -DFUZZ=ON -DCMAKE_C_COMPILER="${CC:-clang}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

rm -rf "$out"
mkdir -p "$out/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=0
report=()
for t in "${targets[@]}"; do
  corpus="$out/corpus/$t"
  mkdir -p "$corpus"
  cp "fuzz/corpus/$t"/* "$corpus"/
  log="$out/$t.log"
  echo "fuzz: $t for ${time_per_target}s" >&2
  # stdin from /dev/null: a fuzzed kubeconfig may name /dev/stdin as a file
  set +e
  "$build/fuzz/fuzz_$t" -max_total_time="$time_per_target" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
    "$corpus" </dev/null >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  secs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -1)
  status=ok
  # any sanitizer report fails the run, even one libFuzzer would not stop on
  if [ "$rc" -ne 0 ] || [ -z "$runs" ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY: ' "$log"; then
    status="FAILED (exit $rc; see $log)"
    failed=1
    grep -E 'ERROR:|runtime error:|SUMMARY:|Test unit written' "$log" | head -20 >&2 || true
  fi
  report+=("$(printf '%-16s %12s %6s %10s  %s' "$t" "${runs:-?}" "${secs:-?}" \
    "$([ -n "$runs" ] && [ "${secs:-0}" -gt 0 ] && echo $((runs / secs)) || echo '?')" "$status")")
done

printf '%-16s %12s %6s %10s  %s\n' target executions secs exec/s result
printf '%s\n' "${report[@]}"
exit "$failed"
