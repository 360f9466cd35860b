-- Migration 55: orphan the tenant-cluster FluxCD addon's HelmReleases.
--
-- The platform drops the FluxCD addon of tenant Kubernetes clusters. For each
-- tenant that had it, two HelmReleases in the management cluster deployed it
-- into the tenant cluster (the Flux operator, then the Flux instance). They
-- must go without an uninstall: the Flux running inside the tenant cluster
-- keeps running and keeps reconciling what the tenant gave it. Deleting a
-- HelmRelease normally makes helm-controller (through its finalizer) run
-- `helm uninstall` in the tenant cluster; so, per HelmRelease and in this
-- order: suspend it (helm-controller stops acting on it), remove its
-- finalizers, read it back to see that none came back, and only then delete
-- it. A finalizer that is back after its removal stops the run: deleting then
-- would run the very uninstall this migration exists to avoid.
--
-- See docs/migrations/55-fluxcd-addon-orphan.md.
local json = require "cozy.json"

local HELMRELEASES = "helm.toolkit.fluxcd.io/v2"

-- The charts of the addon (spec.chartRef.name); any other HelmRelease is never touched.
local ADDON_CHARTS = {
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd"] = true,
  ["cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd-operator"] = true,
}

local function chart_of(hr)
  local ref = type(hr.spec) == "table" and hr.spec.chartRef
  return type(ref) == "table" and ref.name or nil
end

local function finalizers_of(hr)
  local f = type(hr) == "table" and type(hr.metadata) == "table" and hr.metadata.finalizers
  return type(f) == "table" and f or {}
end

-- The addon's HelmReleases, in list order (namespace, name), as
-- { namespace, name, chart, deleting } (a few fields: a fleet may hold
-- thousands); nil when the HelmRelease API is not served at all.
local function addon_releases(ctx)
  if not ctx.kube:served(HELMRELEASES, "helmreleases") then return nil end
  local found = {}
  for hr in ctx.kube:resource(HELMRELEASES, "helmreleases"):list{} do
    local chart = chart_of(hr)
    if ADDON_CHARTS[chart] then
      found[#found + 1] = { namespace = hr.metadata.namespace, name = hr.metadata.name, chart = chart,
        deleting = hr.metadata.deletionTimestamp }
    end
  end
  return found
end

-- a call that may meet the object already deleted: returns the result, or
-- nil, "gone"; any other failure propagates (the run stops: fail closed)
local function unless_gone(fn, ...)
  local ok, res = pcall(fn, ...)
  if ok then return res end
  if type(res) == "table" and res.absent == "object" then return nil, "gone" end
  error(res, 0)
end

-- Orphans one HelmRelease; returns "orphaned", or "gone" when it was deleted
-- by someone else before its finalizers were removed (nothing left to
-- orphan). Once the finalizer patch has landed, an object that is gone is
-- orphaned: no finalizer was left to run an uninstall (an object already
-- being deleted goes the moment its finalizers do).
local function orphan(ctx, hrs, r)
  local key = r.namespace .. "/" .. r.name
  ctx.log:info((ctx.mode == "run" and "Orphaning" or "Would orphan") .. " FluxCD addon HelmRelease " .. key,
    { chart = r.chart })
  local _, gone = unless_gone(hrs.merge_patch, hrs, r.namespace, r.name, { spec = { suspend = true } })
  if gone then return "gone" end
  local patched
  patched, gone = unless_gone(hrs.merge_patch, hrs, r.namespace, r.name,
    { metadata = { finalizers = json.null } })
  if gone then return "gone" end
  -- the fresh read: what helm-controller would see on delete. In a plan no
  -- write reached the server, so the patch's (computed) answer stands in.
  local current = patched
  if ctx.mode == "run" then
    current = hrs:find(r.namespace, r.name)   -- nil: already gone; a read error raises
    if current == nil then return "orphaned" end
  end
  local left = finalizers_of(current)
  if #left > 0 then
    error(("HelmRelease %s still has finalizers [%s] after they were removed: something re-added them "
      .. "(helm-controller reconciling it?); deleting it now would run the helm uninstall in the tenant "
      .. "cluster that this migration exists to avoid, so it stops here (the HelmRelease is suspended; "
      .. "find what adds the finalizer, then run again)"):format(key, table.concat(left, ", ")))
  end
  -- without waiting: with no finalizer the object goes at once
  unless_gone(hrs.delete, hrs, r.namespace, r.name)
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
    local found = addon_releases(ctx)
    if found == nil then
      ctx.log:info("HelmRelease API (helm.toolkit.fluxcd.io/v2) not served: no FluxCD addon to orphan")
      return
    end
    for _, r in ipairs(found) do
      local key = r.namespace .. "/" .. r.name
      ctx.finding("info", "would orphan FluxCD addon HelmRelease " .. key,
        { namespace = r.namespace, name = r.name, chart = r.chart })
      if r.deleting then
        ctx.finding("warn", ("HelmRelease %s is already being deleted (deletionTimestamp %s): helm-controller "
          .. "may be uninstalling the FluxCD addon from the tenant cluster now; run orphans it at once")
          :format(key, tostring(r.deleting)), { namespace = r.namespace, name = r.name })
      end
    end
    ctx.outcome { found = #found }
  end,

  run = function(ctx)
    local found = addon_releases(ctx)
    if found == nil then
      ctx.log:info("HelmRelease API (helm.toolkit.fluxcd.io/v2) not served: no FluxCD addon to orphan")
      ctx.outcome { orphaned = 0, gone = 0 }
      return
    end
    local hrs = ctx.kube:resource(HELMRELEASES, "helmreleases")
    local counts = { orphaned = 0, gone = 0 }
    local progress = ctx.progress("orphaning FluxCD addon HelmReleases", #found)
    for i, r in ipairs(found) do
      local result = orphan(ctx, hrs, r)
      counts[result] = counts[result] + 1
      if result == "gone" then
        ctx.log:info(("HelmRelease %s/%s was deleted meanwhile: nothing to orphan"):format(r.namespace, r.name))
      end
      progress:step(i)
    end
    progress:done()
    ctx.outcome(counts)
    ctx.log:info(("%s %d FluxCD addon HelmRelease(s), %d already gone")
      :format(ctx.mode == "run" and "Orphaned" or "Would orphan", counts.orphaned, counts.gone))
  end,
}
