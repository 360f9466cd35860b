-- Migration 44: remove the leftover flux-tenants Deployment (tenant Flux sharding).
--
-- The hand-rolled flux-tenants helm-controller shard is replaced by the
-- flux-shard-operator's shards, which retire flux-tenants themselves once no
-- HelmRelease carries sharding.fluxcd.io/key=tenants. This removes a leftover
-- Deployment, and only when that guard already holds: flux-tenants must keep
-- reconciling any HelmRelease still on the legacy bucket. A port of the
-- platform's script 44; docs/migrations/44-flux-tenants.md lists the differences.
local NS, NAME = "cozy-fluxcd", "flux-tenants"

return {
  description = "remove the leftover flux-tenants Deployment once no HelmRelease is on the tenants shard",
  permissions = {
    { verb = "get", group = "apps", resource = "deployments", namespace = NS, name = NAME },
    { verb = "delete", group = "apps", resource = "deployments", namespace = NS, name = NAME },
    { verb = "list", group = "helm.toolkit.fluxcd.io", resource = "helmreleases" },
  },
  walk = function(ctx)
    local deployments = assert(ctx.kube:lookup("deployments.apps"))
    if not deployments:find(NS, NAME) then return ctx.log:info("no flux-tenants Deployment: nothing to remove") end
    -- an absent HelmRelease API raises here, as the shell's pipeline fails: Flux without its CRD is not a state to act in
    local hrs = ctx.kube:resource("helm.toolkit.fluxcd.io/v2", "helmreleases")
    if hrs:list{ label_selector = "sharding.fluxcd.io/key=tenants", limit = 1 }() then
      return ctx.log:info("HelmReleases still carry sharding.fluxcd.io/key=tenants: flux-tenants stays (the operator retires it)")
    end
    ctx.log:change("{Removing|Would remove} Deployment %s/%s: no HelmRelease left on the tenants shard", NS, NAME)
    deployments:delete(NS, NAME, { absent = "skip" })
  end,
}
