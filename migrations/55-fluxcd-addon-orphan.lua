-- Migration 55: orphan the tenant-cluster FluxCD addon's HelmReleases.
--
-- The platform drops the FluxCD addon of tenant Kubernetes clusters: the two HelmReleases
-- per tenant that deployed it (the Flux operator, then the Flux instance) must go without
-- the `helm uninstall` their finalizer runs on delete, so that the Flux inside the tenant
-- cluster keeps running. rule.orphan does it per HelmRelease, in this order: suspend it
-- (helm-controller stops acting on it), remove its finalizers, read it back to see that
-- none came back (else stop: deleting would uninstall), delete it; check lists each.
-- See docs/migrations/55-fluxcd-addon-orphan.md.
return require("cozy.rule").orphan { "helmreleases.helm.toolkit.fluxcd.io",
  description = "orphan the tenant-cluster FluxCD addon's HelmReleases: suspend, drop"
    .. " finalizers, delete",
  -- the charts of the addon; any other HelmRelease is never touched
  where = { ["spec.chartRef.name"] = {
    "cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd",
    "cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd-operator" } },
  suspend = { spec = { suspend = true } },
  noun = "FluxCD addon HelmRelease", fields = { chart = "spec.chartRef.name" },
  unserved = "HelmRelease API (helm.toolkit.fluxcd.io/v2) not served: no FluxCD addon to orphan",
  readded = "%s %s still has finalizers [%s] after they were removed: something re-added them"
    .. " (helm-controller reconciling it?); deleting it now would run the helm uninstall in the"
    .. " tenant cluster that this migration exists to avoid, so it stops here (the HelmRelease"
    .. " is suspended; find what adds the finalizer, then run again)",
  deleting = "helm-controller may be uninstalling the FluxCD addon from the tenant cluster now;"
    .. " run orphans it at once",
}
