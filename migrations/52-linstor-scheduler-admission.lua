-- Migration 52: delete the old linstor-scheduler admission webhook Deployment.
--
-- A port of the platform's script 52 (docs/migrations/52-linstor-scheduler-admission.md).
-- Upstream's chart 0.3.0 ships the admission webhook under the same Deployment name
-- with another spec.selector, which is immutable: the old Deployment must go before
-- the component reconciles, so that the new one is created. Its webhook's failurePolicy
-- is Ignore, so the gap blocks no Pod. Absent (fresh installs, no linstor): nothing to do.
local NAMESPACE, NAME = "cozy-linstor", "linstor-scheduler-admission"

return {
  description = "delete the old linstor-scheduler-admission Deployment, whose selector the new chart changes",
  permissions = {
    { verb = "get", group = "apps", resource = "deployments", namespace = NAMESPACE },
    { verb = "delete", group = "apps", resource = "deployments", namespace = NAMESPACE },
  },
  walk = function(ctx)
    local deploys = assert(ctx.kube:lookup("deployments.apps"))
    -- a read first, so that check reports a delete only when there is something to delete
    if deploys:find(NAMESPACE, NAME) == nil then return ctx.log:info(("Deployment %s/%s absent: nothing to delete"):format(NAMESPACE, NAME)) end
    ctx.log:change("{Deleting|Would delete} Deployment %s/%s", NAMESPACE, NAME)
    deploys:delete(NAMESPACE, NAME, { absent = "skip" })
  end,
}
