#!/usr/bin/env bash
# Installs the Debian (bookworm) packages the build, the tests and the demo
# need. Idempotent; run as root or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  liblua5.4-dev lua5.4 lua-cjson-dev libcurl4-openssl-dev libyaml-dev libssl-dev
  lua-busted python3-jsonpatch python3-yaml openssl curl jq ca-certificates
  # hack/fuzz.sh: clang and its libFuzzer runtime (only a Recommends of clang)
  clang libclang-rt-14-dev
  # hack/lint.sh
  lua-check cppcheck clang-format shellcheck
  # bench/run: /usr/bin/time for CPU and peak RSS, valgrind for --callgrind;
  # spec/campaign/valgrind_spec.lua: one e2e run under memcheck (plain build)
  time valgrind
)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# kubectl drives the fake API server in tests and runs inside legacy
# migration scripts. Debian's kubernetes-client is only a fallback: an
# existing kubectl (often newer) is kept.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)

if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
