-- Migration 49: backfill the tenant.cozystack.io/<ancestor> labels on tenant namespaces.
--
-- A port of the platform's script 49 (docs/migrations/49-tenant-ancestor-labels.md).
-- Tenant charts before this release labelled a namespace with its parent only, so a
-- tenant at depth 2 or more lacked tenant.cozystack.io/tenant-root, and the root's
-- egress network policy could not reach it. Each tenant namespace but tenant-root gets
-- one empty-valued label per ancestor, derived from its name: tenant-a-b gets
-- tenant-root, tenant-a and tenant-a-b. Other labels stay.
--
-- Best effort, as the shell (writes = "warn"): a namespace that cannot be labelled is
-- logged and the others go on, and the version is stamped (a skipped namespace is the
-- bug this fixes, no worse). A list that still fails after the engine's retries leaves
-- the version instead (reads = "leave"), so that the next upgrade does the work the
-- shell would have skipped.
local obj = require "cozy.obj"
local rule = require "cozy.rule"

-- The labels of a tenant namespace, as the shell splits its name at each "-" (an
-- empty part included): tenant-root and every dash-prefix but the bare "tenant".
local function ancestor_labels(name)
  local labels, acc = { ["tenant.cozystack.io/tenant-root"] = "" }, nil
  for part in (name .. "-"):gmatch("([^-]*)-") do
    acc = acc and (acc .. "-" .. part) or part
    if acc ~= "tenant" then labels["tenant.cozystack.io/" .. acc] = "" end
  end
  return labels
end

return rule {
  description = "backfill the tenant.cozystack.io/<ancestor> labels on tenant namespaces, best"
    .. " effort",
  select = {
    namespaces = { "namespaces", field_selector = "metadata.name!=tenant-root",
      where = { ["metadata.name"] = "tenant-*" }, edit = true, writes = "warn", reads = "leave",
      label = "tenant namespaces", outcome = { labelled = "changed", failed = "failed" },
      -- the shell's one `kubectl label` for all of them is refused whole: no label at all
      refused = "namespace %s not labelled: %s" },
  },
  walk = function(_, s)
    s.namespaces:each(function(ns) return obj.set_labels(ns, ancestor_labels(ns.metadata.name)) end)
  end,
}
