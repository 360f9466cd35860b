-- Migration 48: label pre-existing ClickHouse keeper PVCs with their release
-- (app.kubernetes.io/instance), so that the chart's post-delete hook reclaims them.
--
-- The keeper operator stamps the volumeClaimTemplate's labels only on PVCs it
-- creates after the chart change; older keeper PVCs stay unlabelled and leak on
-- delete. Each ClickHouseKeeperInstallation is named "<release>-keeper"; its PVCs
-- are "default-chk-<installation>-...". Best effort on reads, as the platform's
-- script 48 (reads = "warn"): an installation or PVC list that still fails after
-- retries is logged and skipped (the worst case is the leak this fixes); a label
-- that cannot be written fails the step (writes = "stop"), as the script's does.
-- docs/migrations/48-clickhouse-keeper-pvc-labels.md lists the differences.
local obj = require "cozy.obj"
local rule = require "cozy.rule"

local LABEL = "app.kubernetes.io/instance"

return rule {
  description = "label pre-existing ClickHouse keeper PVCs with"
    .. " app.kubernetes.io/instance=<release>",
  select = {
    keepers = { "clickhousekeeperinstallations.clickhouse-keeper.altinity.com", project = {},
      reads = "warn", unlisted = "ClickHouse keeper installations not listed, no PVC labelled: %s",
      unserved = "no ClickHouse keeper ({why}): no PVC to label" },
    pvcs = { "persistentvolumeclaims", project = { "metadata.labels" }, edit = true, reads = "warn",
      unlisted = "keeper PVCs not listed, skipped: %s",
      say = "{labelling|would label} " .. LABEL .. "=%s" },
  },
  walk = function(_, s)
    s.keepers:each(function(chk)
      local prefix = "default-chk-" .. chk.metadata.name .. "-"
      local release = chk.metadata.name:gsub("%-keeper$", "")
      s.pvcs:each(function(pvc)
        local mine = pvc.metadata.name:sub(1, #prefix) == prefix
        return mine and obj.set_label(pvc, LABEL, release) and release
      end, { namespace = chk.metadata.namespace, label = "keeper PVCs of " .. obj.key(chk) })
    end)
  end,
}
