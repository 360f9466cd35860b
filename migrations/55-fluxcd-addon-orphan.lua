-- Migration 55: orphan the tenant-cluster FluxCD addon's HelmReleases.
--
-- The platform drops the FluxCD addon of tenant Kubernetes clusters: the two HelmReleases
-- per tenant that deployed it (the Flux operator, then the Flux instance) must go without
-- the `helm uninstall` their finalizer runs on delete, so that the Flux inside the tenant
-- cluster keeps running. Per HelmRelease, in this order: suspend it (helm-controller stops
-- acting on it), remove its finalizers, read it back to see that none came back (else
-- stop: deleting would uninstall), delete it. See docs/migrations/55-fluxcd-addon-orphan.md.
local json = require "cozy.json"
local obj = require "cozy.obj"
local rule = require "cozy.rule"

-- The charts of the addon (spec.chartRef.name); any other HelmRelease is never touched.
local ADDON_CHARTS = {
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd"] = true,
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd-operator"] = true,
}

-- Orphans one HelmRelease: "gone" when deleted by someone else before its finalizers were
-- removed; else "orphaned", gone or not: no finalizer was left to run an uninstall (an
-- object already being deleted goes the moment its finalizers do).
local function orphan(ctx, releases, hr)
  ctx.log:with{ chart = hr.spec.chartRef.name }:change("{Orphaning|Would orphan} FluxCD addon"
    .. " HelmRelease %s",
    obj.key(hr))
  if releases:merge_patch(hr, { spec = { suspend = true } }) == nil then return "gone" end
  local patched = releases:merge_patch(hr, { metadata = { finalizers = json.null } })
  if patched == nil then return "gone" end
  -- what helm-controller would see on delete (in a plan, what the patch would have left)
  local current = releases:read_back(patched)
  if current == nil then return "orphaned" end
  local left = obj.list(current, "metadata.finalizers")
  if #left > 0 then
    error(("HelmRelease %s still has finalizers [%s] after they were removed: something re-added"
      .. " them (helm-controller reconciling it?); deleting it now would run the helm uninstall in"
      .. " the tenant cluster that this migration exists to avoid, so it stops here (the"
        .. " HelmRelease"
      .. " is suspended; find what adds the finalizer, then run again)"):format(obj.key(hr),
      table.concat(left, ", ")))
  end
  releases:delete(hr) -- without waiting: with no finalizer the object goes at once
  return "orphaned"
end

-- What check says of one HelmRelease run would orphan.
local function report(ctx, hr)
  local since = obj.get(hr, "metadata.deletionTimestamp")
  ctx:finding("info", "would orphan FluxCD addon HelmRelease " .. obj.key(hr),
    { name = hr, chart = hr.spec.chartRef.name })
  if since then
    ctx:finding("warn", ("HelmRelease %s is already being deleted (deletionTimestamp %s):"
      .. " helm-controller may be uninstalling the FluxCD addon from the tenant cluster now; run"
      .. " orphans it at once"):format(obj.key(hr), since), { name = hr })
  end
end

return rule {
  description = "orphan the tenant-cluster FluxCD addon's HelmReleases: suspend, drop"
    .. " finalizers, delete",
  select = {
    releases = { "helmreleases.helm.toolkit.fluxcd.io", patch = true, delete = true,
      project = { "spec.chartRef.name", "metadata.deletionTimestamp" },
      unserved = "HelmRelease API (helm.toolkit.fluxcd.io/v2) not served:"
        .. " no FluxCD addon to orphan" },
  },
  walk = function(ctx, s)
    local counts = { orphaned = 0, gone = 0 }
    s.releases:each(function(hr)
      if not ADDON_CHARTS[obj.get(hr, "spec.chartRef.name")] then return end
      if ctx.mode == "check" then return report(ctx, hr) end
      local result = orphan(ctx, s.releases, hr)
      counts[result] = counts[result] + 1
      if result == "gone" then ctx.log:info(("HelmRelease %s was deleted meanwhile: nothing to"
        .. " orphan"):format(obj.key(hr))) end
    end)
    if ctx.mode == "check" then return end
    ctx:outcome(counts)
    ctx.log:change("{Orphaned|Would orphan} %d FluxCD addon HelmRelease(s), %d already gone",
      counts.orphaned, counts.gone)
  end,
}
