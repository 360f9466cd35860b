-- Migration 48: label pre-existing ClickHouse keeper PVCs with their release
-- (app.kubernetes.io/instance), so that the chart's post-delete hook reclaims them.
--
-- The keeper operator stamps the volumeClaimTemplate's labels only on PVCs it
-- creates after the chart change; older keeper PVCs stay unlabelled and leak on
-- delete. Each ClickHouseKeeperInstallation is named "<release>-keeper"; its PVCs
-- are "default-chk-<installation>-...". Best effort on reads, as the platform's
-- script 48: an installation or PVC list that still fails after retries is logged
-- and skipped (the worst case is the leak this fixes); a label that cannot be
-- written fails the step, as the script's does.
-- docs/migrations/48-clickhouse-keeper-pvc-labels.md lists the differences.
local obj = require "cozy.obj"

local LABEL = "app.kubernetes.io/instance"

return {
  description = "label pre-existing ClickHouse keeper PVCs with app.kubernetes.io/instance=<release>",
  permissions = {
    { verb = "list", group = "clickhouse-keeper.altinity.com", resource = "clickhousekeeperinstallations" },
    { verb = "list", group = "", resource = "persistentvolumeclaims" },
    { verb = "get", group = "", resource = "persistentvolumeclaims" },
    { verb = "patch", group = "", resource = "persistentvolumeclaims" },
  },
  walk = function(ctx)
    local chks, why = ctx.kube:lookup("clickhousekeeperinstallations.clickhouse-keeper.altinity.com")
    if not chks then return ctx.log:info("no ClickHouse keeper (" .. why .. "): no PVC to label") end
    local ok, installations = pcall(function() return chks:list{ project = {} }:collect() end)
    if not ok and not ctx.kube:is_item_error(installations) then error(installations, 0) end
    if not ok then return ctx.log:warn("ClickHouse keeper installations not listed, no PVC labelled: " .. installations.message) end
    local pvcs = ctx.kube:resource("v1", "persistentvolumeclaims")
    for _, chk in ipairs(installations) do
      local ns, prefix, release = chk.metadata.namespace, "default-chk-" .. chk.metadata.name .. "-", chk.metadata.name:gsub("%-keeper$", "")
      local listed, claims = pcall(function() return pvcs:list{ namespace = ns, project = { "metadata.labels" } }:collect() end)
      if not listed and not ctx.kube:is_item_error(claims) then error(claims, 0) end
      if not listed then ctx.log:warn("PVCs of " .. ns .. " not listed, skipped: " .. claims.message) claims = {} end
      pvcs:update_each(claims, function(pvc)
        if pvc.metadata.name:sub(1, #prefix) == prefix then return obj.set_label(pvc, LABEL, release) or nil end
      end, { label = "keeper PVCs of " .. obj.key(chk), absent = "skip", project = { "metadata.labels" },
        on_change = function(pvc) ctx.log:change("PVC %s: {labelling|would label} %s=%s", obj.key(pvc), LABEL, release) end })
    end
  end,
}
