-- Migration 47: pin the implicit default "md0" node group on tenant Kubernetes clusters.
--
-- The kubernetes chart used to ship a default nodeGroups.md0 that Helm merged into
-- every cluster's values; it now applies the default only when nodeGroups is empty.
-- A cluster that defined its own nodeGroups without md0 still runs md0 (it is in
-- its release manifest), and the new chart would prune the live md0
-- MachineDeployment (and its nodes). So md0 is written out where nodeGroups exists
-- without it. Fail closed, as the platform's script 47: every cluster is tried,
-- then any failure fails the step (writes = "fail"), before the chart upgrade can prune.
-- docs/migrations/47-kubernetes-md0-pin.md lists the differences.
local json = require "cozy.json"
local obj = require "cozy.obj"
local rule = require "cozy.rule"

-- the chart's built-in default (kubernetes.nodeGroups), decoded afresh for each cluster
local MD0 = '{"minReplicas":0,"maxReplicas":10,"instanceType":"u1.medium","diskSize":"20Gi",'
  .. '"storageClass":"","roles":["ingress-nginx"],"resources":{},"gpus":[],"kubelet":{}}'

return rule {
  description = "pin the implicit md0 node group on tenant Kubernetes clusters that define"
    .. " nodeGroups without it",
  select = {
    clusters = { "kuberneteses.apps.cozystack.io", project = { "spec.nodeGroups" }, edit = true,
      writes = "fail", say = "{pinning|would pin} node group md0",
      failed = "%d cluster(s) could not be pinned (%s): the kubernetes chart upgrade would"
        .. " prune their"
        .. " live md0 MachineDeployment, so the upgrade stops here; fix the failures above and"
          .. " upgrade again",
      outcome = { pinned = "changed", skipped = "unchanged+absent", failed = "failed" } },
  },
  walk = function(_, s)
    s.clusters:each(function(k)
      local groups = obj.get(k, "spec.nodeGroups")
      if type(groups) ~= "table" or getmetatable(groups) == json.array_mt or groups.md0 ~= nil then
        return false
      end
      groups.md0 = json.decode(MD0)
      return true
    end)
  end,
}
