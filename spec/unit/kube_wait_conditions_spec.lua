-- The ready-made conditions of cozy.kube.wait (ctx.kube.conditions), judged
-- on objects shaped as the API server and the controllers leave them: a
-- CRD Established, a Deployment rolled out by `kubectl rollout status`'s
-- rule, a cert-manager Secret re-issued with the expected alt-names.
local wait = require "cozy.kube.wait"

local c = wait.conditions()

local function deployment(generation, observed, spec_replicas, st, conditions)
  st = st or {}
  st.observedGeneration = observed
  st.conditions = conditions
  return { metadata = { name = "d", generation = generation }, spec = { replicas = spec_replicas }, status = st }
end

describe("ready-made wait conditions", function()
  it("established: the CRD's Established condition is True", function()
    assert.is_true((c.established { status = { conditions = { { type = "Established", status = "True" } } } }))
    local met, why = c.established { status = { conditions = { { type = "Established", status = "False",
      message = "installing" } } } }
    assert.is_false(met)
    assert.equal("condition Established is False: installing", why)
    met, why = c.established { metadata = {} }
    assert.is_false(met)
    assert.equal("no condition Established yet", why)
  end)

  it("rolled_out: kubectl rollout status's rule, step by step", function()
    local met, why = c.rolled_out(deployment(3, 2, 2, { updatedReplicas = 2, replicas = 2, availableReplicas = 2 }))
    assert.is_false(met)
    assert.equal("waiting for the controller to observe the latest spec", why)
    met, why = c.rolled_out(deployment(3, 3, 2, { updatedReplicas = 1, replicas = 2, availableReplicas = 2 }))
    assert.same({ false, "1 of 2 updated replicas" }, { met, why })
    met, why = c.rolled_out(deployment(3, 3, 2, { updatedReplicas = 2, replicas = 3, availableReplicas = 2 }))
    assert.same({ false, "1 old replicas pending termination" }, { met, why })
    met, why = c.rolled_out(deployment(3, 3, 2, { updatedReplicas = 2, replicas = 2, availableReplicas = 1 }))
    assert.same({ false, "1 of 2 updated replicas available" }, { met, why })
    assert.is_true((c.rolled_out(deployment(3, 3, 2, { updatedReplicas = 2, replicas = 2, availableReplicas = 2 }))))
    -- scaled to 0 (what 50 does to the operator): rolled out once nothing is left
    assert.is_true((c.rolled_out(deployment(4, 4, 0, {}))))
    -- spec.replicas absent: the API server's default, 1
    met = c.rolled_out(deployment(1, 1, nil, { updatedReplicas = 0 }))
    assert.is_false(met)
  end)

  it("rolled_out: a progress deadline exceeded ends the wait at once (fatal)", function()
    local met, why, fatal = c.rolled_out(deployment(2, 2, 1, { updatedReplicas = 0 },
      { { type = "Progressing", status = "False", reason = "ProgressDeadlineExceeded" } }))
    assert.same({ false, "exceeded its progress deadline", true }, { met, why, fatal })
  end)

  it("alt_names: every expected name in the Secret's cert-manager.io/alt-names, exactly", function()
    local want = c.alt_names { "etcd-0.etcd.ns.svc", "*.etcd-headless.ns.svc" }
    local function secret(ann)
      return { metadata = { name = "s", annotations = ann and { ["cert-manager.io/alt-names"] = ann } or nil } }
    end
    assert.is_true((want(secret("etcd-0.etcd.ns.svc,*.etcd-headless.ns.svc,localhost"))))
    local met, why = want(secret("etcd-0.etcd.ns.svc"))
    assert.same({ false, "alt-names lack *.etcd-headless.ns.svc" }, { met, why })
    -- a longer name holding the wanted one is not it
    met = want(secret("etcd-0.etcd.ns.svc.cluster.local,*.etcd-headless.ns.svc.cluster.local"))
    assert.is_false(met)
    met, why = want(secret(nil))
    assert.same({ false, "no cert-manager.io/alt-names annotation" }, { met, why })
    assert.has_error(function() c.alt_names {} end, "alt_names(names): names must be a non-empty array")
  end)

  it("condition(type, status): any condition type and status", function()
    local ready = c.condition("Ready", "False")
    assert.is_true((ready { status = { conditions = { { type = "Ready", status = "False" } } } }))
    assert.is_false((ready { status = { conditions = { { type = "Ready", status = "True" } } } }))
  end)
end)
