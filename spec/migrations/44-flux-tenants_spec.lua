-- Migration 44-flux-tenants on the spec harness, and beside the platform's
-- script 44 (spec/helpers/differential.lua): the same fixtures, run by both,
-- compared object by object. Differences are the shell's, listed in
-- docs/migrations/44-flux-tenants.md with the case that shows each.
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential
local json = require "cozy.json"

local HR_CRD = "helmreleases.helm.toolkit.fluxcd.io"
local DEPLOYMENT = "Deployment cozy-fluxcd/flux-tenants"

-- Flux's HelmRelease CRD, as the platform installs it (the real server has its own).
local function hr_crd()
  for _, o in ipairs(json.decode(assert(harness.files.read("spec/fixtures/55-fluxcd-addon-orphan/cluster.json"))).items) do
    if o.kind == "CustomResourceDefinition" then return o end
  end
end

local function helmrelease(ns, name, shard)
  return { apiVersion = "helm.toolkit.fluxcd.io/v2", kind = "HelmRelease",
    metadata = { name = name, namespace = ns, labels = { ["sharding.fluxcd.io/key"] = shard } },
    spec = { interval = "5m", releaseName = name,
      chartRef = { kind = "ExternalArtifact", name = "cozystack-apps-" .. name, namespace = "cozy-system" } } }
end

local FLUX_TENANTS = { apiVersion = "apps/v1", kind = "Deployment",
  metadata = { name = "flux-tenants", namespace = "cozy-fluxcd", labels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
  spec = { replicas = 1, selector = { matchLabels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
    template = { metadata = { labels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
      spec = { containers = { { name = "manager", image = "ghcr.io/fluxcd/helm-controller:v1.3.0" } } } } } }

-- The cluster: flux-tenants, and HelmReleases on the operator's shards; `extra` adds objects.
local function cluster(with_deployment, extra)
  local items = differential.cluster(44, { "cozy-system", "cozy-fluxcd", "tenant-a" },
    { hr_crd(), helmrelease("tenant-a", "postgres-a", "shard1"), helmrelease("tenant-a", "redis-a", "shard2") })
  if with_deployment then items[#items + 1] = FLUX_TENANTS end
  for _, o in ipairs(extra or {}) do items[#items + 1] = o end
  return items
end
local DRAINED = cluster(true)
local ON_SHARD = cluster(true, { helmrelease("tenant-a", "kafka-a", "tenants") })

local function differs(d)
  return differential.differences(d)
end

-- The writes of the port's run, as "METHOD path".
local function writes(h)
  local out = {}
  for _, w in ipairs(h:writes()) do out[#out + 1] = w.method .. " " .. w.path end
  return out
end

describe("migration 44-flux-tenants", function()
  local h = harness.fake { fixtures = { DRAINED } }

  it("its code is at most 1.5x its shell's (blank and comment lines not counted) #platform", function()
    local c = differential.line_counts(44, harness.migration_file(44))
    assert.equal(13, c.shell)
    assert(c.ratio <= 1.5, ("44: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("removes flux-tenants when no HelmRelease is left on the tenants shard, as the shell does #platform", function()
    local d = differential.run(h, 44, DRAINED)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.is_nil(d.port.objects[DEPLOYMENT])
    assert.is_not_nil(d.port.objects["HelmRelease tenant-a/postgres-a"])
    assert.same({}, differs(d))
    assert.same({ "DELETE /apis/apps/v1/namespaces/cozy-fluxcd/deployments/flux-tenants" }, writes(h))
  end)

  it("leaves flux-tenants while a HelmRelease carries sharding.fluxcd.io/key=tenants, as the shell does #platform", function()
    local d = differential.run(h, 44, ON_SHARD)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.is_not_nil(d.port.objects[DEPLOYMENT])
    assert.same({}, differs(d))
    assert.no_writes()
  end)

  it("does nothing when flux-tenants is already gone (the target state), as the shell does #platform", function()
    local d = differential.run(h, 44, cluster(false))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differs(d))
    assert.no_writes()
  end)

  it("goes on when flux-tenants is deleted between the list and the delete, as the shell does #platform", function()
    local d = differential.run(h, 44, DRAINED,
      { faults = { { method = "DELETE", path = "deployments/flux-tenants$", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.is_nil(d.port.objects[DEPLOYMENT])
    assert.same({}, differs(d))
  end)

  it("fails closed when the HelmRelease API is absent, as the shell does: flux-tenants stays #platform", function()
    local d = differential.run(h, 44, cluster(true), { before = function(hh)
      hh.srv:delete_crd(HR_CRD)
    end })
    assert.is_not.equal(0, d.shell.code)
    assert.matches("the server doesn't have a resource type", d.shell.stderr, 1, true)
    assert.is_false(d.port.ok)
    assert.equal("type", d.port.err.absent)
    assert.is_not_nil(d.port.objects[DEPLOYMENT])
    assert.same({}, differs(d))
  end)

  it("fails closed when the delete keeps failing, as the shell does #fakeonly #platform", function()
    local d = differential.run(h, 44, DRAINED,
      { faults = { { method = "DELETE", path = "deployments/flux-tenants$", times = -1, status = 500 } } })
    assert.is_not.equal(0, d.shell.code)
    assert.is_false(d.port.ok)
    assert.equal(500, d.port.err.code)
    assert.same({ "status" }, d.shell.fired)
    assert.equal("status", d.port.fired[1])
    assert.is_not_nil(d.port.objects[DEPLOYMENT])
    assert.same({}, differs(d))
  end)

  it("a HelmRelease list that fails once: the port retries and removes, the shell fails (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 44, DRAINED,
      { faults = { { method = "GET", path = "/helmreleases\\?", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ DEPLOYMENT }, differs(d))
    assert.is_not_nil(d.shell.objects[DEPLOYMENT])
    assert.is_nil(d.port.objects[DEPLOYMENT])
  end)

  it("a Deployment read that fails once: the port retries and removes, the shell stamps without acting (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 44, DRAINED,
      { faults = { { method = "GET", path = "deployments/flux-tenants$", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({ DEPLOYMENT }, differs(d))
  end)

  it("is idempotent", function() assert.migration_idempotent(44) end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(44)
    assert.is_nil(h:object("Deployment", "cozy-fluxcd", "flux-tenants"))
  end)

  it("check lists the delete run would make, and sends nothing", function()
    local res = h:migrate(44, { mode = "check" })
    assert.no_writes()
    assert.equal(1, #res.findings)
    assert.equal("delete", res.findings[1].fields.verb)
    assert.equal("flux-tenants", res.findings[1].fields.name)
  end)
end)
