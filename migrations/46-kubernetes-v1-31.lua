-- Migration 46: bump tenant Kubernetes clusters from v1.30 to v1.31, best effort.
--
-- This release drops v1.30 from the Talos/Kubernetes support matrix, and the
-- kubernetes chart refuses to render version "v1.30": a tenant still on it when
-- the platform upgrade lands would have its HelmRelease fail and its Talos worker
-- rollover never start. v1.30 -> v1.31 is kubeadm's standard minor upgrade.
-- Best effort, as the platform's script 46: a cluster that cannot be patched is
-- named and the others go on; the version is then left at 46 so that the next
-- upgrade retries. docs/migrations/46-kubernetes-v1-31.md lists the differences.
local obj = require "cozy.obj"
local recipe = require "cozy.recipe"

local OLD, NEW = "v1.30", "v1.31"

return {
  description = "bump tenant Kubernetes clusters from v1.30 to v1.31 (best effort: failures leave the version)",
  permissions = recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "get", "patch" }),
  walk = function(ctx)
    local counts, failures = ctx.kube:update_all("kuberneteses.apps.cozystack.io", function(k)
      if obj.get(k, "spec.version") ~= OLD then return end
      k.spec.version = NEW
      return true
    end, {
      label = "Kubernetes clusters", absent = "skip", project = { "spec.version" }, on_error = "continue",
      retry = { attempts = 3, time = 10 },   -- a best-effort item is not worth the engine's minute of retries
      describe = function(k) return "kubernetes " .. obj.key(k) end,
      on_change = function(k) ctx.log:change("kubernetes %s: {bumping|would bump} spec.version %s -> %s", obj.key(k), OLD, NEW) end,
    })
    if counts == nil then return end -- the API is not served: nothing to change
    ctx:outcome { patched = counts.changed, skipped = counts.unchanged + counts.absent, failed = counts.failed }
    if counts.failed > 0 then
      local names = {}
      for _, f in ipairs(failures) do names[#names + 1] = f.namespace .. "/" .. f.name end
      return ctx:leave_version(("%d patch(es) failed, still on %s: %s"):format(counts.failed, OLD, table.concat(names, ",")))
    end
  end,
}
