-- Migration 47-kubernetes-md0-pin on the spec harness, and beside the platform's
-- script 47 (spec/helpers/differential.lua): the same fixtures, run by both,
-- compared object by object. Differences are the shell's, listed in
-- docs/migrations/47-kubernetes-md0-pin.md with the case that shows each.
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential
local json = require "cozy.json"

-- The tenant Kubernetes CRD (the platform serves the kind; a CRD here, with an open schema)
local CRD = differential.crd("apps.cozystack.io", "v1alpha1", "kuberneteses", "Kubernetes")

local function kubernetes(ns, name, node_groups)
  local spec = json.decode('{"version":"v1.32","controlPlane":{"replicas":2}}')
  spec.nodeGroups = node_groups
  return { apiVersion = "apps.cozystack.io/v1alpha1", kind = "Kubernetes", metadata = { name = name, namespace = ns },
    spec = spec }
end

local function cluster(with_crd, ...)
  return differential.cluster(47, { "cozy-system", "tenant-a", "tenant-b" }, with_crd and { CRD, ... } or { ... })
end

local WORKERS = '{"workers":{"minReplicas":1,"maxReplicas":3,"instanceType":"u1.large","roles":[],"gpus":[]}}'
-- alpha: own groups without md0 (pinned); beta: its own md0 (left); gamma: no nodeGroups (left);
-- delta: an empty nodeGroups object (pinned, as the shell's jq test says)
local FLEET = cluster(true, kubernetes("tenant-a", "alpha", json.decode(WORKERS)),
  kubernetes("tenant-a", "beta", json.decode('{"md0":{"minReplicas":2,"maxReplicas":4,"instanceType":"u1.xlarge"}}')),
  kubernetes("tenant-b", "gamma", nil), kubernetes("tenant-b", "delta", json.decode("{}")))

local function groups(d, side, key) return differential.field(d, side, "Kubernetes " .. key, "spec", "nodeGroups") end

describe("migration 47-kubernetes-md0-pin", function()
  local h = harness.fake { fixtures = { FLEET } }

  it("its code is at most 1.5x its shell's (blank and comment lines not counted) #platform", function()
    local c = differential.line_counts(47, harness.migration_file(47))
    assert.equal(77, c.shell)
    assert(c.ratio <= 1.5, ("47: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("pins md0 where nodeGroups lacks it, exactly as the shell does #platform", function()
    local d = differential.run(h, 47, FLEET)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("pinned=2 skipped=2 failures=0", d.shell.stdout, 1, true)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.equal("u1.medium", groups(d, "port", "tenant-a/alpha").md0.instanceType)
    assert.equal("u1.large", groups(d, "port", "tenant-a/alpha").workers.instanceType)
    assert.equal("u1.xlarge", groups(d, "port", "tenant-a/beta").md0.instanceType)
    assert.is_nil(groups(d, "port", "tenant-b/gamma"))
    assert.equal(10, groups(d, "port", "tenant-b/delta").md0.maxReplicas)
    assert.same({ pinned = 2, skipped = 2, failed = 0 }, d.port.result.outcome.counts)
  end)

  it("writes nothing when every cluster is pinned or has no nodeGroups (the target state), as the shell #platform", function()
    local fleet = cluster(true, kubernetes("tenant-a", "beta", json.decode('{"md0":{"minReplicas":1}}')),
      kubernetes("tenant-b", "gamma", nil))
    local d = differential.run(h, 47, fleet)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("has nothing to do when the Kubernetes CRD is absent, as the shell #platform", function()
    local d = differential.run(h, 47, cluster(false))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.matches("kuberneteses.apps.cozystack.io not served", d.port.result.log, 1, true)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("a cluster deleted between the read and its patch: gone on both; the shell fails the upgrade (its bug), the port goes on #platform", function()
    local d = differential.run(h, 47, FLEET,
      { faults = { { method = "PATCH", path = "kuberneteses/alpha(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.same({}, differential.differences(d))
    assert.is_nil(groups(d, "port", "tenant-a/alpha"))
    assert.equal(1, d.shell.code)
    assert.matches("failed to patch tenant-a/alpha", d.shell.stderr, 1, true)
    assert.is_true(d.port.ok)
    assert.same({ pinned = 1, skipped = 3, failed = 0 }, d.port.result.outcome.counts)
  end)

  it("a patch that keeps failing: the others pinned, then the step fails naming it, as the shell #fakeonly #platform", function()
    local d = differential.run(h, 47, FLEET,
      { faults = { { method = "PATCH", path = "kuberneteses/alpha(\\?|$)", times = -1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.equal("status", d.port.fired[1])
    assert.equal(1, d.shell.code)
    assert.is_false(d.port.ok)
    assert.matches("1 cluster(s) could not be pinned (tenant-a/alpha)", d.port.err.message, 1, true)
    assert.same({}, differential.differences(d))
    assert.is_nil(groups(d, "port", "tenant-a/alpha").md0)
    assert.is_not_nil(groups(d, "port", "tenant-b/delta").md0)
  end)

  it("a list that fails once: the port retries and pins; the shell fails the upgrade (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 47, FLEET,
      { faults = { { method = "GET", path = "/kuberneteses\\?", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(1, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "Kubernetes tenant-a/alpha", "Kubernetes tenant-b/delta" }, differential.differences(d))
  end)

  it("a read of one cluster that fails once: the shell fails the upgrade (its bug); the port reads no cluster twice #fakeonly #platform", function()
    local d = differential.run(h, 47, FLEET,
      { faults = { { method = "GET", path = "kuberneteses/alpha$", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({}, d.port.fired)
    assert.equal(1, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "Kubernetes tenant-a/alpha" }, differential.differences(d))
  end)

  it("is idempotent", function() assert.migration_idempotent(47) end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(47)
    assert.is_not_nil(h:object("Kubernetes", "tenant-a", "alpha").spec.nodeGroups.md0)
  end)

  it("check lists the patches run would make, and sends nothing", function()
    local res = h:migrate(47, { mode = "check" })
    assert.no_writes()
    local names = differential.finding_names(res, "verb namespace/name")
    assert.same({ "patch tenant-a/alpha", "patch tenant-b/delta" }, names)
  end)
end)
