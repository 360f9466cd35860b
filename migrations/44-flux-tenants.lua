-- Migration 44: remove the leftover flux-tenants Deployment (tenant Flux sharding).
--
-- The hand-rolled flux-tenants helm-controller shard is replaced by the
-- flux-shard-operator's shards, which retire flux-tenants themselves once no
-- HelmRelease carries sharding.fluxcd.io/key=tenants. This removes a leftover
-- Deployment, and only when that guard already holds: flux-tenants must keep
-- reconciling any HelmRelease still on the legacy bucket. A port of the
-- platform's script 44; docs/migrations/44-flux-tenants.md lists the differences.
-- An absent HelmRelease API fails the step (unserved = "stop"), as the shell's
-- pipeline fails: Flux without its CRD is not a state to act in.
local TENANTS = "sharding.fluxcd.io/key=tenants"
local STAYS = "HelmReleases still carry " .. TENANTS .. ": flux-tenants stays (the operator"
  .. " retires it)"
return require("cozy.rule") {
  description = "delete the flux-tenants Deployment once no HelmRelease is on the tenants shard",
  select = {
    flux = { "deployments.apps", namespace = "cozy-fluxcd", name = "flux-tenants", delete = true },
    tenants = { "helmreleases.helm.toolkit.fluxcd.io", label_selector = TENANTS,
      unserved = "stop" },
  },
  walk = function(ctx, s)
    local flux = s.flux:find()
    if not flux then return ctx.log:info("no flux-tenants Deployment: nothing to remove") end
    if s.tenants:first() then return ctx.log:info(STAYS) end
    ctx.log:change("{Removing|Would remove} Deployment cozy-fluxcd/flux-tenants: no HelmRelease"
      .. " left on the tenants shard")
    s.flux:delete(flux)
  end,
}
