#!/usr/bin/env bash
# Code lines of migration ports and of the platform's shell scripts, counted
# the same way as spec/helpers/differential.lua's code_lines: non-blank lines
# whose first non-blank characters are not a comment (Lua `--`, shell `#`).
#   hack/code-lines.sh FILE...                 one count per file
#   hack/code-lines.sh --ports SHELL_DIR       each migrations/<N>-*.lua against SHELL_DIR/<N>
# A file ending in .lua is counted as Lua, anything else as shell.
set -euo pipefail
cd "$(dirname "$0")/.."

count() {
  local marker='#'
  case "$1" in *.lua) marker='--' ;; esac
  awk -v m="$marker" '{ sub(/^[ \t]+/, ""); sub(/[ \t\r]+$/, "") }
    $0 != "" && substr($0, 1, length(m)) != m { n++ } END { print n + 0 }' "$1"
}

if [ "${1:-}" = "--ports" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --ports SHELL_DIR" >&2; exit 2; }
  printf '%-40s %6s %6s\n' port lua shell
  for port in migrations/*.lua; do
    n=$(basename "$port"); n=${n%%-*}
    shell="$2/$n"
    if [ -f "$shell" ]; then s=$(count "$shell"); else s=-; fi
    printf '%-40s %6s %6s\n' "$(basename "$port")" "$(count "$port")" "$s"
  done
  exit 0
fi
[ $# -gt 0 ] || { echo "usage: $0 FILE... | --ports SHELL_DIR" >&2; exit 2; }
for f in "$@"; do printf '%s %s\n' "$(count "$f")" "$f"; done
