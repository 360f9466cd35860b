#!/usr/bin/env bash
# One idiom per job in migrations/ (docs/authoring.md): every migration is a
# rule (cozy.rule: `rule { select = ..., walk = ... }` or a canned rule such as
# rule.delete), selects its objects by declared selection, iterates and edits
# them with a selection's :each, and leaves permissions and failure policy to
# the engine. The older ways of doing each job are refused here:
#   entry        run/check functions, cozy.recipe
#   iteration    update_each, update_all, lookup, resource(), list, ctx.kube
#   permissions  a hand-written `permissions` list; a tool declared without
#                its access lines (tools = { "name" })
#   policy       pcall, is_item_error, leave_version (the selection's
#                writes/reads policy says it)
#   orphaning    a finalizer list written by hand (rule.orphan)
#   labels       keys checked by hand with obj.key_error (obj.set_labels, the
#                selection's `refused`)
# hack/migration-idioms.sh [DIR]  (default migrations/); exit 1 on a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-migrations}
status=0
refuse() { # file, pattern (ERE), what to use instead [, an ERE of hits that are not it]
  local hits
  if hits=$(grep -nE "$2" "$1" | grep -vE "${4:-^$}"); then
    while IFS= read -r hit; do
      echo "$1:${hit%%:*}: $3"
    done <<<"$hits"
    status=1
  fi
}
for f in "$dir"/*.lua; do
  [ -e "$f" ] || continue
  if ! grep -qE 'require[ (]*"cozy\.rule"' "$f"; then
    echo "$f: not a rule: return rule { description =, select =, walk = } (require \"cozy.rule\")"
    status=1
  fi
  refuse "$f" '^[[:space:]]*(run|check)[[:space:]]*=' "run/check: the rule's walk is its one entry"
  refuse "$f" 'cozy\.recipe' "cozy.recipe: a canned rule of cozy.rule (rule.delete)"
  refuse "$f" 'update_each|update_all' "a batch by hand: the selection's :each(edit)"
  refuse "$f" ':lookup\(|:resource\(|:list[({]|ctx\.kube' "a resource by hand: declare it in select" \
    'ctx\.files:list\('
  # a tool says what it does on the cluster: name -> its access lines, not a bare name
  refuse "$f" '(^|[^_])tools[[:space:]]*=[[:space:]]*\{[[:space:]]*"' \
    "a tool without its access: tools = { [\"name\"] = { \"VERBS RESOURCE\" } }"
  refuse "$f" '(^|[^_])permissions[[:space:]]*=' "hand-written permissions: derived from select"
  refuse "$f" 'pcall\(|is_item_error|leave_version' "a failure policy by hand: the selection's writes/reads"
  refuse "$f" 'finalizers[[:space:]]*=' "finalizers by hand: rule.orphan"
  refuse "$f" 'key_error' "label keys checked by hand: obj.set_labels and the selection's refused"
done
exit $status
