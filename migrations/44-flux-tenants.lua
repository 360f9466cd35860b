-- Migration 44: remove the leftover flux-tenants Deployment (tenant Flux sharding).
--
-- The hand-rolled flux-tenants helm-controller shard is replaced by the
-- flux-shard-operator's shards, which retire flux-tenants themselves once no
-- HelmRelease carries sharding.fluxcd.io/key=tenants. This removes a leftover
-- Deployment, and only when that guard already holds (`unless`): flux-tenants must
-- keep reconciling any HelmRelease still on the legacy bucket. A port of the
-- platform's script 44; docs/migrations/44-flux-tenants.md lists the differences.
-- An absent HelmRelease API fails the step (unserved = "stop"), as the shell's
-- pipeline fails: Flux without its CRD is not a state to act in.
local TENANTS = "sharding.fluxcd.io/key=tenants"
return require("cozy.rule").delete { "deployments.apps", namespace = "cozy-fluxcd",
  name = "flux-tenants",
  description = "delete the flux-tenants Deployment once no HelmRelease is on the tenants shard",
  unless = { "helmreleases.helm.toolkit.fluxcd.io", label_selector = TENANTS, unserved = "stop" },
  absent = "no flux-tenants Deployment: nothing to remove",
  kept = "HelmReleases still carry " .. TENANTS .. ": flux-tenants stays (the operator retires it)",
  deleting = "{Removing|Would remove} Deployment cozy-fluxcd/flux-tenants: no HelmRelease left"
    .. " on the tenants shard",
}
