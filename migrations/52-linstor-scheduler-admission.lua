-- Migration 52: delete the old linstor-scheduler admission webhook Deployment.
--
-- A port of the platform's script 52 (docs/migrations/52-linstor-scheduler-admission.md).
-- Upstream's chart 0.3.0 ships the admission webhook under the same Deployment name
-- with another spec.selector, which is immutable: the old Deployment must go before
-- the component reconciles, so that the new one is created. Its webhook's failurePolicy
-- is Ignore, so the gap blocks no Pod. Absent (fresh installs, no linstor): nothing to do.
return require("cozy.rule").delete { "deployments.apps", namespace = "cozy-linstor",
  name = "linstor-scheduler-admission",
  description = "delete the old linstor-scheduler-admission Deployment, whose selector the new"
    .. " chart changes" }
