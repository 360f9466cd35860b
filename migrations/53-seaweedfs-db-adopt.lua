-- Migration 53: hand Cluster/seaweedfs-db over to the <name>-db release for every
-- SeaweedFS instance, whatever its name. Port of the platform's script 53 (its
-- lib/seaweedfs-db-adopt.sh): 43 matched the owner "seaweedfs-system" literally, so a
-- Cluster owned by foo-system kept that owner and no helm.sh/resource-policy=keep, and
-- the post-split foo-system upgrade pruned it with its PVC. docs/migrations/53-seaweedfs-db-adopt.md.
-- Fails closed as the shell: any API error but "CNPG not served" or "Cluster gone" stops
-- the step, so the version stays and the next upgrade re-checks the fleet.
local obj = require "cozy.obj"
local match = require "cozy.match"
local recipe = require "cozy.recipe"

local OWNER, POLICY = "meta.helm.sh/release-name", "helm.sh/resource-policy"

return {
  description = "hand Cluster/seaweedfs-db of every SeaweedFS instance to <name>-db, with resource-policy keep",

  permissions = recipe.permissions("clusters.postgresql.cnpg.io", { "list", "get", "patch" }), -- get: the re-read after a conflict

  walk = function(ctx)
    local clusters, why = ctx.kube:lookup("clusters.postgresql.cnpg.io")
    if clusters == nil then
      return ctx.log:info("CNPG Cluster is not served (" .. why .. "): no SeaweedFS databases to hand over")
    end
    local counts = clusters:update_each(clusters:list{ project = { "metadata.annotations" } }, function(c)
      if c.metadata.name ~= "seaweedfs-db" then return end
      local owner, ns = obj.annotation(c, OWNER) or "", c.metadata.namespace
      if match.glob("?*-system", owner) then
        obj.set_annotation(c, OWNER, owner:sub(1, -8) .. "-db")
        obj.set_annotation(c, POLICY, "keep")
        return owner .. " -> " .. owner:sub(1, -8) .. "-db (+keep)"
      elseif match.glob("*-db", owner) then
        if obj.set_annotation(c, POLICY, "keep") then return "owned by " .. owner .. ", +keep" end
      else
        ctx.log:warn(("Cluster/seaweedfs-db in %s: owner %q is not a <name>-system or <name>-db release: "
          .. "leaving it alone; check by hand that its database is not about to be pruned"):format(ns, owner))
      end
    end, {
      label = "seaweedfs-db Clusters", absent = "skip", project = { "metadata.annotations" },
      on_change = function(c, what) ctx.log:change("Cluster %s: {handing over|would hand over} %s", obj.key(c), what) end,
    })
    ctx:outcome { changed = counts.changed }
  end,
}
