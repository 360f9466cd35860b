-- Migration 47: pin the implicit default "md0" node group on tenant Kubernetes clusters.
--
-- The kubernetes chart used to ship a default nodeGroups.md0 that Helm merged into
-- every cluster's values; it now applies the default only when nodeGroups is empty.
-- A cluster that defined its own nodeGroups without md0 still runs md0 (it is in
-- its release manifest), and the new chart would prune the live md0
-- MachineDeployment (and its nodes). So md0 is written out where nodeGroups exists
-- without it. Fail closed, as the platform's script 47: every cluster is tried,
-- then any failure fails the step, before the chart upgrade can prune.
-- docs/migrations/47-kubernetes-md0-pin.md lists the differences.
local json = require "cozy.json"
local obj = require "cozy.obj"
local recipe = require "cozy.recipe"

-- the chart's built-in default (kubernetes.nodeGroups), decoded afresh for each cluster
local MD0 = '{"minReplicas":0,"maxReplicas":10,"instanceType":"u1.medium","diskSize":"20Gi","storageClass":"",'
  .. '"roles":["ingress-nginx"],"resources":{},"gpus":[],"kubelet":{}}'

return {
  description = "pin the implicit md0 node group on tenant Kubernetes clusters that define nodeGroups without it",
  permissions = recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "get", "patch" }),
  walk = function(ctx)
    local counts, failures = ctx.kube:update_all("kuberneteses.apps.cozystack.io", function(k)
      local groups = obj.get(k, "spec.nodeGroups")
      if type(groups) ~= "table" or getmetatable(groups) == json.array_mt or groups.md0 ~= nil then return end
      groups.md0 = json.decode(MD0)
      return true
    end, {
      label = "Kubernetes clusters", absent = "skip", project = { "spec.nodeGroups" }, on_error = "continue",
      describe = function(k) return "kubernetes " .. obj.key(k) end,
      on_change = function(k) ctx.log:change("kubernetes %s: {pinning|would pin} node group md0", obj.key(k)) end,
    })
    if counts == nil then return end -- the API is not served: nothing to change
    ctx:outcome { pinned = counts.changed, skipped = counts.unchanged + counts.absent, failed = counts.failed }
    if counts.failed > 0 then
      local names = {}
      for _, f in ipairs(failures) do names[#names + 1] = f.namespace .. "/" .. f.name end
      error(("%d cluster(s) could not be pinned (%s): the kubernetes chart upgrade would prune their live md0 "
        .. "MachineDeployment, so the upgrade stops here; fix the failures above and upgrade again"):format(
        counts.failed, table.concat(names, ", ")), 0)
    end
  end,
}
