-- Migration 45: pin Helm-managed KubeadmConfigTemplates and KubeadmConfigs with
-- helm.sh/resource-policy=keep.
--
-- The kubernetes chart upgrade stops rendering some of these Cluster API objects;
-- Helm would prune them, and with them the bootstrap config of live machines.
-- `keep` makes Helm leave them. Every Helm-managed one (label
-- app.kubernetes.io/managed-by=Helm) is annotated; each is tried, then any
-- failure fails the step (writes = "fail": the version stays 45 and the upgrade
-- stops before the chart can prune), as the platform's script 45.
-- docs/migrations/45-kubeadm-keep-pin.md lists the differences.
local obj = require "cozy.obj"
local rule = require "cozy.rule"

return rule {
  description = "pin Helm-managed KubeadmConfigTemplates and KubeadmConfigs with"
    .. " helm.sh/resource-policy=keep",
  select = {
    configs = { "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io",
      "kubeadmconfigs.bootstrap.cluster.x-k8s.io",
      label_selector = "app.kubernetes.io/managed-by=Helm", project = { "metadata.annotations" },
      edit = true,
      writes = "fail", say = "{annotating|would annotate} helm.sh/resource-policy=keep",
      unserved = "{resource} not served ({why}): nothing to pin", outcome = { failed = "failed" },
      failed = "%d annotation(s) failed (%s): an unpinned KubeadmConfigTemplate may be pruned"
        .. " by the"
        .. " kubernetes chart upgrade, so the upgrade stops here; fix the failures above and"
          .. " upgrade again" },
  },
  walk = function(_, s)
    s.configs:each(function(o) return obj.set_annotation(o, "helm.sh/resource-policy", "keep") end)
  end,
}
