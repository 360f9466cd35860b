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
-- the version is left when anything failed, a write or a list (writes, reads = "leave"),
-- so that the next upgrade retries it.
local obj = require "cozy.obj"
local match = require "cozy.match"
local rule = require "cozy.rule"

local KEY = "apps.cozystack.io/application.name"
-- Each kind, and the names of its storage PVCs (NAME: the cluster's name, its dots escaped).
local STORAGE = {
  VMCluster = "(vmstorage|vmselect)-NAME-[0-9]+$",
  VLCluster = "vlstorage-NAME-[0-9]+$",
}

return rule {
  description = "label the monitoring module's VictoriaMetrics/VictoriaLogs storage PVCs with"
    .. " their application, best effort",
  select = {
    clusters = { "vmclusters.operator.victoriametrics.com",
      "vlclusters.operator.victoriametrics.com",
      project = { "spec.managedMetadata.labels" }, reads = "leave", unlisted = "a list failed: %s",
      unserved = "{resource} not present, skipping: {why}" },
    pvcs = { "persistentvolumeclaims", edit = true, writes = "leave", reads = "leave",
      unlisted = "a list failed: %s",
      failed = "%d PVC(s) not labelled", outcome = { failed = "failed" } },
  },
  walk = function(ctx, s)
    s.clusters:each(function(cr)
      local app = obj.get(cr, { "spec", "managedMetadata", "labels", KEY })
      if app == nil or app == "" then
        return ctx.log:info(("%s has no %s, not cozystack's: skipped"):format(obj.key(cr), KEY))
      end
      local regex = STORAGE[cr.kind]:gsub("NAME", (cr.metadata.name:gsub("%.", "\\.")))
      s.pvcs:each(function(pvc)
        return match.regex(regex, pvc.metadata.name) and obj.set_label(pvc, KEY, app)
      end, { namespace = cr.metadata.namespace, label = "PVCs of " .. obj.key(cr) })
    end)
  end,
}
