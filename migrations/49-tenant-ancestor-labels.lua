-- Migration 49: backfill the tenant.cozystack.io/<ancestor> labels on tenant namespaces.
--
-- A port of the platform's script 49 (docs/migrations/49-tenant-ancestor-labels.md).
-- Tenant charts before this release labelled a namespace with its parent only, so a
-- tenant at depth 2 or more lacked tenant.cozystack.io/tenant-root, and the root's
-- egress network policy could not reach it. Each tenant namespace but tenant-root gets
-- one empty-valued label per ancestor, derived from its name: tenant-a-b gets
-- tenant-root, tenant-a and tenant-a-b. Other labels stay.
--
-- Best effort, as the shell: a namespace that cannot be labelled is logged and the
-- others go on, and the version is stamped (a skipped namespace is the bug this fixes,
-- no worse). A list that still fails after the engine's retries leaves the version
-- instead, so that the next upgrade does the work the shell would have skipped.
local obj = require "cozy.obj"
local match = require "cozy.match"

-- The label keys of a tenant namespace, as the shell splits its name at each "-"
-- (an empty part included): every dash-prefix but the bare "tenant".
local function ancestor_keys(name)
  local keys, acc = { "tenant.cozystack.io/tenant-root" }, nil
  for part in (name .. "-"):gmatch("([^-]*)-") do
    acc = acc and (acc .. "-" .. part) or part
    if acc ~= "tenant" then keys[#keys + 1] = "tenant.cozystack.io/" .. acc end
  end
  return keys
end

return {
  description = "backfill the tenant.cozystack.io/<ancestor> labels on tenant namespaces, best effort",
  permissions = {
    { verb = "list", group = "", resource = "namespaces" },
    { verb = "get", group = "", resource = "namespaces" },
    { verb = "patch", group = "", resource = "namespaces" },
  },
  walk = function(ctx)
    local namespaces = assert(ctx.kube:lookup("namespaces"))
    local ok, counts = pcall(namespaces.update_each, namespaces, namespaces:list{}, function(ns)
      local name = ns.metadata.name
      if not match.glob("tenant-*", name) or name == "tenant-root" then return end
      local keys = ancestor_keys(name)
      for _, key in ipairs(keys) do
        -- the shell's one `kubectl label` for all of them is refused whole: no label at all
        if obj.key_error(key) then return ctx.log:warn(("namespace %s not labelled: %s"):format(name, obj.key_error(key))) end
      end
      for _, key in ipairs(keys) do obj.set_label(ns, key, "") end
    end, { label = "tenant namespaces", absent = "skip", on_error = "continue" })
    if not ok and not ctx.kube:is_item_error(counts) then error(counts, 0) end
    if not ok then return ctx:leave_version("namespaces not listed: " .. tostring(counts.message)) end
    ctx:outcome { labelled = counts.changed, failed = counts.failed }
  end,
}
