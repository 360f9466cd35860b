-- Migration 46-kubernetes-v1-31 on the spec harness, and beside the platform's
-- script 46 (spec/helpers/differential.lua): the same fixtures, run by both,
-- compared object by object. Differences are the shell's, listed in
-- docs/migrations/46-kubernetes-v1-31.md with the case that shows each.
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential

-- The tenant Kubernetes CRD (the platform serves the kind; a CRD here, with an open schema)
local CRD = differential.crd("apps.cozystack.io", "v1alpha1", "kuberneteses", "Kubernetes")

local function kubernetes(ns, name, version)
  return { apiVersion = "apps.cozystack.io/v1alpha1", kind = "Kubernetes", metadata = { name = name, namespace = ns },
    spec = { version = version, controlPlane = { replicas = 2 }, nodeGroups = { md0 = { minReplicas = 0, maxReplicas = 10 } } } }
end

local function cluster(with_crd, ...)
  return differential.cluster(46, { "cozy-system", "tenant-a", "tenant-b" }, with_crd and { CRD, ... } or { ... })
end

-- two clusters on v1.30, one on v1.31 (the target), one on v1.32, one whose version is "v1.30.1" (a near miss)
local FLEET = cluster(true, kubernetes("tenant-a", "alpha", "v1.30"), kubernetes("tenant-a", "beta", "v1.31"),
  kubernetes("tenant-b", "gamma", "v1.30"), kubernetes("tenant-b", "delta", "v1.32"), kubernetes("tenant-b", "eps", "v1.30.1"))

local function version(d, side, key) return differential.field(d, side, "Kubernetes " .. key, "spec", "version") end

describe("migration 46-kubernetes-v1-31", function()
  local h = harness.fake { fixtures = { FLEET } }

  it("its code is at most 1.5x its shell's (blank and comment lines not counted) #platform", function()
    local c = differential.line_counts(46, harness.migration_file(46))
    assert.equal(68, c.shell)
    assert(c.ratio <= 1.5, ("46: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("bumps exactly the clusters on v1.30, as the shell does, and stamps #platform", function()
    local d = differential.run(h, 46, FLEET)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("patched=2 skipped=3 failures=0", d.shell.stdout, 1, true)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.same({ "v1.31", "v1.31", "v1.31", "v1.32", "v1.30.1" }, { version(d, "port", "tenant-a/alpha"),
      version(d, "port", "tenant-a/beta"), version(d, "port", "tenant-b/gamma"), version(d, "port", "tenant-b/delta"),
      version(d, "port", "tenant-b/eps") })
    assert.same({ patched = 2, skipped = 3, failed = 0 }, d.port.result.outcome.counts)
    assert.is_nil(d.port.result.outcome.leave)
    assert.equal(2, #d.port.writes)
  end)

  it("writes nothing when every cluster is past v1.30 (the target state), as the shell #platform", function()
    local fleet = cluster(true, kubernetes("tenant-a", "beta", "v1.31"), kubernetes("tenant-b", "delta", "v1.32"))
    local d = differential.run(h, 46, fleet)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("has nothing to do when the Kubernetes CRD is absent, as the shell #platform", function()
    local d = differential.run(h, 46, cluster(false))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("CRD not present; nothing to migrate", d.shell.stdout, 1, true)
    assert.is_true(d.port.ok)
    assert.matches("kuberneteses.apps.cozystack.io not served", d.port.result.log, 1, true)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("a cluster deleted between the list and its patch: gone on both; the shell leaves the version, the port stamps #platform", function()
    local d = differential.run(h, 46, FLEET,
      { faults = { { method = "PATCH", path = "kuberneteses/alpha(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.same({}, differential.differences(d))
    assert.is_nil(version(d, "port", "tenant-a/alpha"))
    assert.equal("v1.31", version(d, "port", "tenant-b/gamma"))
    -- the shell counts the vanished cluster as a failed patch (its bug: retried on the next upgrade for nothing)
    assert.matches("patched=1 skipped=3 failures=1", d.shell.stdout, 1, true)
    assert.is_true(d.port.ok)
    assert.same({ patched = 1, skipped = 4, failed = 0 }, d.port.result.outcome.counts)
    assert.is_nil(d.port.result.outcome.leave)
  end)

  it("a patch that keeps failing: the others bumped, the failure named, the version left, as the shell #fakeonly #platform", function()
    local d = differential.run(h, 46, FLEET,
      { faults = { { method = "PATCH", path = "kuberneteses/alpha(\\?|$)", times = -1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.equal("status", d.port.fired[1])
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("failed tenants: tenant-a/alpha", d.shell.stderr, 1, true)
    assert.is_true(d.port.ok)
    assert.equal("1 patch(es) failed, still on v1.30: tenant-a/alpha", d.port.result.outcome.leave)
    assert.same({ patched = 1, skipped = 3, failed = 1 }, d.port.result.outcome.counts)
    assert.same({}, differential.differences(d))
    assert.equal("v1.30", version(d, "port", "tenant-a/alpha"))
    assert.equal("v1.31", version(d, "port", "tenant-b/gamma"))
  end)

  it("a list that fails once: the port retries and bumps; the shell fails the upgrade (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 46, FLEET,
      { faults = { { method = "GET", path = "/kuberneteses\\?", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(1, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "Kubernetes tenant-a/alpha", "Kubernetes tenant-b/gamma" }, differential.differences(d))
    assert.equal("v1.30", version(d, "shell", "tenant-a/alpha"))
    assert.equal("v1.31", version(d, "port", "tenant-a/alpha"))
  end)

  it("a read of one cluster that fails once: the shell skips it and stamps (its bug); the port reads no cluster twice #fakeonly #platform", function()
    local d = differential.run(h, 46, FLEET,
      { faults = { { method = "GET", path = "kuberneteses/alpha$", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({}, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("patched=1 skipped=4 failures=0", d.shell.stdout, 1, true)
    assert.same({ "Kubernetes tenant-a/alpha" }, differential.differences(d))
    assert.equal("v1.30", version(d, "shell", "tenant-a/alpha"))
    assert.equal("v1.31", version(d, "port", "tenant-a/alpha"))
  end)

  it("is idempotent", function() assert.migration_idempotent(46) end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(46)
    assert.equal("v1.31", h:object("Kubernetes", "tenant-a", "alpha").spec.version)
  end)

  it("check lists the patches run would make, and sends nothing", function()
    local res = h:migrate(46, { mode = "check" })
    assert.no_writes()
    local names = differential.finding_names(res, "verb namespace/name")
    assert.same({ "patch tenant-a/alpha", "patch tenant-b/gamma" }, names)
  end)
end)
