-- Migration 53: hand Cluster/seaweedfs-db over to the <name>-db release for every
-- SeaweedFS instance, whatever its name. Port of the platform's script 53 (its
-- lib/seaweedfs-db-adopt.sh): 43 matched the owner "seaweedfs-system" literally, so a
-- Cluster owned by foo-system kept that owner and no helm.sh/resource-policy=keep, and
-- the post-split foo-system upgrade pruned it with its PVC.
-- docs/migrations/53-seaweedfs-db-adopt.md lists the differences.
-- Fails closed as the shell (writes = "stop", the default): any API error but "CNPG not
-- served" or "Cluster gone" stops the step, so the version stays and the next upgrade
-- re-checks the fleet.
local obj = require "cozy.obj"
local match = require "cozy.match"
local rule = require "cozy.rule"

local OWNER, POLICY = "meta.helm.sh/release-name", "helm.sh/resource-policy"

return rule {
  description = "hand Cluster/seaweedfs-db of every SeaweedFS instance to <name>-db, with"
    .. " resource-policy keep",
  select = {
    clusters = { "clusters.postgresql.cnpg.io", project = { "metadata.annotations" }, edit = true,
      label = "seaweedfs-db Clusters", say = "{handing over|would hand over} %s",
      outcome = { changed = "changed" },
      unserved = "CNPG Cluster is not served ({why}): no SeaweedFS databases to hand over" },
  },
  walk = function(ctx, s)
    s.clusters:each(function(c)
      if c.metadata.name ~= "seaweedfs-db" then return false end
      local owner = obj.annotation(c, OWNER) or ""
      if match.glob("?*-system", owner) then
        obj.set_annotation(c, OWNER, owner:sub(1, -8) .. "-db")
        obj.set_annotation(c, POLICY, "keep")
        return owner .. " -> " .. owner:sub(1, -8) .. "-db (+keep)"
      elseif match.glob("*-db", owner) then
        return obj.set_annotation(c, POLICY, "keep") and "owned by " .. owner .. ", +keep"
      end
      ctx.log:warn(("Cluster/seaweedfs-db in %s: owner %q is not a <name>-system or <name>-db"
        .. " release: "
        .. "leaving it alone; check by hand that its database is not about to be pruned")
        :format(c.metadata.namespace, owner))
      return false
    end)
  end,
}
