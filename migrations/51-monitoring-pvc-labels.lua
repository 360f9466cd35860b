-- Migration 51: backfill apps.cozystack.io/application.name onto the monitoring storage PVCs.
--
-- A port of the platform's script 51 (docs/migrations/51-monitoring-pvc-labels.md).
-- The monitoring module's VMCluster and VLCluster storage templates now carry the label,
-- and a post-delete hook removes the PVCs that have it; but neither vm-operator nor the
-- StatefulSet controller labels a PVC that already exists, so storage made before this
-- release would leak on delete. Each cluster that carries the label in
-- spec.managedMetadata (a cozystack-managed one) gets it on its storage PVCs, named
-- <template>-<component>-<cluster>-<ordinal>. A user's own cluster (no label) is left.
--
-- Best effort, as the shell means it: a PVC that cannot be labelled is logged and the
-- others go on. The worst case is the leak this fixes, so nothing stops the upgrade; but
-- the version is left when anything failed, so that the next upgrade retries it.
local obj = require "cozy.obj"
local match = require "cozy.match"

local KEY = "apps.cozystack.io/application.name"
-- Each CRD, and the names of its storage PVCs (NAME: the cluster's name, its dots escaped).
local STORAGE = {
  { "vmclusters.operator.victoriametrics.com", "(vmstorage|vmselect)-NAME-[0-9]+$" },
  { "vlclusters.operator.victoriametrics.com", "vlstorage-NAME-[0-9]+$" },
}

-- Labels the storage PVCs of one managed cluster; returns how many failed.
local function relabel_storage(pvcs, cr, app, name_regex)
  local regex = name_regex:gsub("NAME", (cr.metadata.name:gsub("%.", "\\.")))
  local counts = pvcs:update_each(pvcs:list{ namespace = cr.metadata.namespace }, function(pvc)
    if match.regex(regex, pvc.metadata.name) then obj.set_label(pvc, KEY, app) end
  end, { label = "PVCs of " .. obj.key(cr), absent = "skip", on_error = "continue" })
  return counts.failed
end

-- Labels the storage PVCs of every managed cluster; returns how many PVCs failed.
local function relabel(ctx)
  local pvcs, failed = assert(ctx.kube:lookup("persistentvolumeclaims")), 0
  for _, storage in ipairs(STORAGE) do
    local crs, why = ctx.kube:lookup(storage[1])
    if crs == nil then
      ctx.log:info(("%s not present, skipping: %s"):format(storage[1], why))
    else
      for cr in crs:list{ project = { "spec.managedMetadata.labels" } } do
        local app = obj.get(cr, { "spec", "managedMetadata", "labels", KEY })
        if app == nil or app == "" then
          ctx.log:info(("%s has no %s, not cozystack's: skipped"):format(obj.key(cr), KEY))
        else
          failed = failed + relabel_storage(pvcs, cr, app, storage[2])
        end
      end
    end
  end
  return failed
end

return {
  description = "label the monitoring module's VictoriaMetrics/VictoriaLogs storage PVCs with their application, best effort",
  permissions = {
    { verb = "list", group = "operator.victoriametrics.com", resource = "vmclusters" },
    { verb = "list", group = "operator.victoriametrics.com", resource = "vlclusters" },
    { verb = "list", group = "", resource = "persistentvolumeclaims" },
    { verb = "get", group = "", resource = "persistentvolumeclaims" },
    { verb = "patch", group = "", resource = "persistentvolumeclaims" },
  },
  walk = function(ctx)
    local ok, failed = pcall(relabel, ctx)
    if not ok and not ctx.kube:is_item_error(failed) then error(failed, 0) end
    if not ok then return ctx:leave_version("a list failed: " .. tostring(failed.message)) end
    ctx:outcome { failed = failed }
    if failed > 0 then return ctx:leave_version(failed .. " PVC(s) not labelled") end
  end,
}
