-- Migration 46: bump tenant Kubernetes clusters from v1.30 to v1.31, best effort.
--
-- This release drops v1.30 from the Talos/Kubernetes support matrix, and the
-- kubernetes chart refuses to render version "v1.30": a tenant still on it when
-- the platform upgrade lands would have its HelmRelease fail and its Talos worker
-- rollover never start. v1.30 -> v1.31 is kubeadm's standard minor upgrade.
-- Best effort, as the platform's script 46: a cluster that cannot be patched is
-- named and the others go on; the version is then left at 46 so that the next
-- upgrade retries (writes = "leave"). docs/migrations/46-kubernetes-v1-31.md.
local rule = require "cozy.rule"

local OLD, NEW = "v1.30", "v1.31"

return rule {
  description = "bump tenant Kubernetes clusters from v1.30 to v1.31 (best effort: failures"
    .. " leave the version)",
  select = {
    clusters = { "kuberneteses.apps.cozystack.io", project = { "spec.version" }, edit = true,
      writes = "leave", failed = "%d patch(es) failed, still on " .. OLD .. ": %s",
      retry = { attempts = 3, time = 10 }, -- a best-effort item is not worth the engine's minute
      say = "{bumping|would bump} spec.version " .. OLD .. " -> " .. NEW,
      outcome = { patched = "changed", skipped = "unchanged+absent", failed = "failed" } },
  },
  walk = function(_, s)
    s.clusters:each(function(k)
      if k.spec == nil or k.spec.version ~= OLD then return false end
      k.spec.version = NEW
      return true
    end)
  end,
}
