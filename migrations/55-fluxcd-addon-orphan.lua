-- Migration 55: orphan the tenant-cluster FluxCD addon's HelmReleases.
--
-- The platform drops the FluxCD addon of tenant Kubernetes clusters: the two HelmReleases per tenant
-- that deployed it (the Flux operator, then the Flux instance) must go without the `helm uninstall`
-- their finalizer runs on delete, so that the Flux inside the tenant cluster keeps running. Per
-- HelmRelease, in this order: suspend it (helm-controller stops acting on it), remove its finalizers,
-- read it back to see that none came back (else stop: deleting would uninstall), delete it.
-- See docs/migrations/55-fluxcd-addon-orphan.md.
local json = require "cozy.json"
local obj = require "cozy.obj"

local HELMRELEASES = "helm.toolkit.fluxcd.io/v2"
local GONE = { absent = "skip" } -- an object deleted by someone else meanwhile: nil, not a failure

-- The charts of the addon (spec.chartRef.name); any other HelmRelease is never touched.
local ADDON_CHARTS = {
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd"] = true,
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd-operator"] = true,
}

-- The addon's HelmReleases, in list order (namespace, name), lean (a fleet may
-- hold thousands); nil when the HelmRelease API is not served at all.
local function addon_releases(ctx)
  if not ctx.kube:served(HELMRELEASES, "helmreleases") then
    ctx.log:info("HelmRelease API (helm.toolkit.fluxcd.io/v2) not served: no FluxCD addon to orphan")
    return nil
  end
  local found = {}
  for hr in ctx.kube:resource(HELMRELEASES, "helmreleases"):list{ project = { "spec.chartRef.name", "metadata.deletionTimestamp" } } do
    if ADDON_CHARTS[obj.get(hr, "spec.chartRef.name")] then found[#found + 1] = hr end
  end
  return found
end

-- Orphans one HelmRelease: "gone" when deleted by someone else before its finalizers were removed;
-- else "orphaned", gone or not: no finalizer was left to run an uninstall (an object already being
-- deleted goes the moment its finalizers do).
local function orphan(ctx, hrs, hr)
  local ns, name = hr.metadata.namespace, hr.metadata.name
  ctx.log:with{ chart = hr.spec.chartRef.name }:change("{Orphaning|Would orphan} FluxCD addon HelmRelease %s", obj.key(hr))
  if hrs:merge_patch(ns, name, { spec = { suspend = true } }, GONE) == nil then return "gone" end
  local patched = hrs:merge_patch(ns, name, { metadata = { finalizers = json.null } }, GONE)
  if patched == nil then return "gone" end
  -- what helm-controller would see on delete (in a plan, what the patch would have left)
  local current = hrs:read_back(patched)
  if current == nil then return "orphaned" end
  local left = obj.list(current, "metadata.finalizers")
  if #left > 0 then
    error(("HelmRelease %s still has finalizers [%s] after they were removed: something re-added them "
      .. "(helm-controller reconciling it?); deleting it now would run the helm uninstall in the tenant "
      .. "cluster that this migration exists to avoid, so it stops here (the HelmRelease is suspended; "
      .. "find what adds the finalizer, then run again)"):format(obj.key(hr), table.concat(left, ", ")))
  end
  hrs:delete(ns, name, GONE) -- without waiting: with no finalizer the object goes at once
  return "orphaned"
end

return {
  description = "orphan the tenant-cluster FluxCD addon's HelmReleases: suspend, drop finalizers, delete",
  permissions = {
    { verb = "list", group = "helm.toolkit.fluxcd.io", resource = "helmreleases" },
    { verb = "get", group = "helm.toolkit.fluxcd.io", resource = "helmreleases" },
    { verb = "patch", group = "helm.toolkit.fluxcd.io", resource = "helmreleases" },
    { verb = "delete", group = "helm.toolkit.fluxcd.io", resource = "helmreleases" },
  },

  check = function(ctx)
    for _, hr in ipairs(addon_releases(ctx) or {}) do
      local since = obj.get(hr, "metadata.deletionTimestamp")
      ctx:finding("info", "would orphan FluxCD addon HelmRelease " .. obj.key(hr), { name = hr, chart = hr.spec.chartRef.name })
      if since then
        ctx:finding("warn", ("HelmRelease %s is already being deleted (deletionTimestamp %s): helm-controller may be uninstalling "
          .. "the FluxCD addon from the tenant cluster now; run orphans it at once"):format(obj.key(hr), since), { name = hr })
      end
    end
  end,

  run = function(ctx)
    local counts = { orphaned = 0, gone = 0 }
    local hrs = ctx.kube:resource(HELMRELEASES, "helmreleases")
    for _, hr in ipairs(addon_releases(ctx) or {}) do
      local result = orphan(ctx, hrs, hr)
      counts[result] = counts[result] + 1
      if result == "gone" then ctx.log:info(("HelmRelease %s was deleted meanwhile: nothing to orphan"):format(obj.key(hr))) end
    end
    ctx:outcome(counts)
    ctx.log:change("{Orphaned|Would orphan} %d FluxCD addon HelmRelease(s), %d already gone", counts.orphaned, counts.gone)
  end,
}
