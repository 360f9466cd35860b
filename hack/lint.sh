#!/usr/bin/env bash
# Lint, as CI runs it (hack/test.sh): luacheck over the Lua runtime, its
# LuaCATS definitions (types/), the migrations and the specs (.luacheckrc); hack/spec-lint.lua over the specs
# (spec/README.md, "What every spec holds to"); cppcheck over core/ with the
# checks below; gofmt and go vet over the Go test tooling (spec/support/go,
# spec/support/tools, bench/clientgo); shellcheck over the shell scripts;
# hack/python-lint.py over the Python (the fake API server's functions at
# most 80 lines);
# clang-format (.clang-format) over core/, fuzz/ and cmake/luac.c, checked,
# not applied.
# Exit 1 on any finding. `hack/lint.sh --fix` applies clang-format instead.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
echo "--- luacheck"
luacheck --no-color -q scripts migrations spec bench deploy types || status=1
echo "--- migration idioms (one way per job: hack/migration-idioms.sh)"
hack/migration-idioms.sh || status=1
echo "--- spec-lint"
lua5.4 hack/spec-lint.lua || status=1

# cppcheck: warning (undefined behaviour, leaks, misuse of the C library),
# portability and performance; style is clang-format's job. The Lua and
# libcurl headers are left out (cppcheck cannot parse luaconf.h's
# configuration checks); their macros are plain calls to it.
echo "--- cppcheck"
cppcheck --quiet --enable=warning,portability,performance --std=c99 --error-exitcode=1 --inline-suppr \
  -I core -DCOZY_MIGRATE_VERSION='"lint"' --suppress=missingIncludeSystem --suppress=missingInclude \
  core/ fuzz/ cmake/ || status=1

# Go test tooling (spec/support/go, and spec/support/tools and bench/clientgo,
# modules of their own): gofmt and go vet
echo "--- gofmt, go vet (spec/support/go, spec/support/tools, bench/clientgo)"
command -v go >/dev/null 2>&1 || export PATH="$PATH:/usr/local/go/bin"
for module in spec/support/go spec/support/tools bench/clientgo; do
  unformatted=$(cd "$module" && gofmt -l .)
  if [ -n "$unformatted" ]; then
    echo "gofmt: not formatted in $module: $unformatted"
    status=1
  fi
  (cd "$module" && go vet ./...) || status=1
done

# Every shell file the project ships goes through shellcheck: the scripts of hack/,
# deploy/, bench/ and .ci/ and spec/support's entry points, found by their
# shebang so that a new one is checked without being listed here.
echo "--- shellcheck"
shell_files=()
while IFS= read -r f; do
  [ -f "$f" ] && head -n1 "$f" | grep -qE '^#!.*[/ ](ba|da)?sh( |$)' && shell_files+=("$f")
done < <(git ls-files hack deploy spec/support bench .ci)
shellcheck "${shell_files[@]}" || status=1

# Python: the fake API server and the other Python tools, found like the shell
# files (by their .py name or a python shebang): hack/python-lint.py compiles
# each, looks for names left undefined, and holds the fake's functions to 80
# lines (spec/support/README.md, "Modules").
echo "--- python"
python_files=()
while IFS= read -r f; do
  [ -f "$f" ] || continue
  case "$f" in
    *.py) python_files+=("$f") ;;
    *) head -n1 "$f" | grep -qE '^#!.*python' && python_files+=("$f") ;;
  esac
done < <(git ls-files hack deploy spec bench .ci)
python3 hack/python-lint.py "${python_files[@]}" || status=1

echo "--- clang-format"
sources=(core/*.c core/*.h fuzz/*.c cmake/*.c)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${sources[@]}"
else
  clang-format --dry-run -Werror "${sources[@]}" || status=1
fi
[ "$status" -eq 0 ] && echo "lint: clean"
exit $status
