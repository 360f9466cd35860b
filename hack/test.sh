#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what is needed,
# builds the engine twice (plain, and with ASan+UBSan) and runs every spec
# through ctest against each build; lint runs first, then the C parsers are
# fuzzed for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/install-deps.sh
# Go (test tooling only: the real control plane) is on the go machines at
# /usr/local/go; a login shell may not have it on PATH.
command -v go >/dev/null 2>&1 || export PATH="$PATH:/usr/local/go/bin"

# The platform's own migrations folder (test data beside the repository, at a
# pinned commit; never copied into it): with it the ports' #platform cases run
# beside the platform's scripts (spec/support/platform-spec); without it they
# are listed as skipped, never as passed. An explicit setting wins.
platform_dir="$PWD/../shared/cozystack-migrations/migrations"
if [ -z "${COZY_PLATFORM_MIGRATIONS:-}" ] && [ -d "$platform_dir" ]; then
  export COZY_PLATFORM_MIGRATIONS="$platform_dir"
fi
echo "platform migrations: ${COZY_PLATFORM_MIGRATIONS:-none (the #platform cases skip)}"

jobs=$(nproc 2>/dev/null || echo 2)
status=0
echo "=== lint ==="
hack/lint.sh || status=1
# Fuzzing runs once, bounded, first (so that ctest's summary stays the last
# thing printed): every C parser (JSON, kubeconfig, HTTP response headers)
# under libFuzzer with ASan+UBSan.
echo "=== fuzz (FUZZ_TIME=${FUZZ_TIME:-30}s per target) ==="
FUZZ_TIME=${FUZZ_TIME:-30} hack/fuzz.sh || status=1
# The real control plane (spec/support/kube-apiserver) is built once here,
# from the Go modules go.sum pins, so that no spec waits on the build.
echo "=== real control plane (spec/support/go) ==="
start=$(date +%s)
spec/support/go/build || status=1
echo "built in $(( $(date +%s) - start ))s"
# The real-server specs (label "real") run in the plain build only: they judge
# the engine's dealings with a real API server, not its memory safety.
for variant in build:OFF:ON build-asan:ON:OFF; do
  IFS=: read -r dir sanitize real <<<"$variant"
  echo "=== $dir (SANITIZE=$sanitize, REAL_SERVER=$real) ==="
  cmake -S . -B "$dir" -DSANITIZE="$sanitize" -DREAL_SERVER="$real" >/dev/null
  cmake --build "$dir" -j "$jobs"
  # abort_on_error: a sanitizer report fails the test that triggered it
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" || status=1
done
exit $status
