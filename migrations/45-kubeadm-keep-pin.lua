-- Migration 45: pin Helm-managed KubeadmConfigTemplates and KubeadmConfigs with
-- helm.sh/resource-policy=keep.
--
-- The kubernetes chart upgrade stops rendering some of these Cluster API objects;
-- Helm would prune them, and with them the bootstrap config of live machines.
-- `keep` makes Helm leave them. Every Helm-managed one (label
-- app.kubernetes.io/managed-by=Helm) is annotated; each is tried, then any
-- failure fails the step (the version stays 45 and the upgrade stops before the
-- chart can prune), as the platform's script 45.
-- docs/migrations/45-kubeadm-keep-pin.md lists the differences.
local obj = require "cozy.obj"
local recipe = require "cozy.recipe"

local KINDS = { "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io", "kubeadmconfigs.bootstrap.cluster.x-k8s.io" }

return {
  description = "pin Helm-managed KubeadmConfigTemplates and KubeadmConfigs with helm.sh/resource-policy=keep",
  permissions = recipe.permissions(KINDS, { "list", "get", "patch" }),
  walk = function(ctx)
    local failed = {}
    for _, kind in ipairs(KINDS) do
      local things, why = ctx.kube:lookup(kind)
      if not things then
        ctx.log:info(kind .. " not served (" .. why .. "): nothing to pin")
      else
        local lean = { "metadata.annotations" }
        local _, failures = things:update_each(things:list{ label_selector = "app.kubernetes.io/managed-by=Helm", project = lean },
          function(o) return obj.set_annotation(o, "helm.sh/resource-policy", "keep") or nil end, {
            label = kind, absent = "skip", project = lean, on_error = "continue",
            describe = function(o) return kind .. " " .. obj.key(o) end,
            on_change = function(o) ctx.log:change("%s %s: {annotating|would annotate} helm.sh/resource-policy=keep", kind, obj.key(o)) end,
          })
        for _, f in ipairs(failures) do failed[#failed + 1] = kind .. " " .. f.namespace .. "/" .. f.name end
      end
    end
    ctx:outcome { failed = #failed }
    if #failed > 0 then
      error(("%d annotation(s) failed (%s): an unpinned KubeadmConfigTemplate may be pruned by the kubernetes chart "
        .. "upgrade, so the upgrade stops here; fix the failures above and upgrade again"):format(#failed,
        table.concat(failed, ", ")), 0)
    end
  end,
}
