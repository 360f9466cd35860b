-- Migration 54-redisfailover-adopt on the spec harness (spec/README.md): every
-- RedisFailover gets the operator-group label and redis:6.2.6-alpine where its redis or
-- sentinel image is empty; a set image, and everything else, stays.
local harness = require "spec.helpers"
local differential = harness.differential

local LABEL, IMAGE = "redis-failover.freshworks.com/operator-group", "redis:6.2.6-alpine"

local CRD = differential.crd("databases.spotahome.com", "v1", "redisfailovers", "RedisFailover",
  { short_names = { "rf" }, open = "object" })

local function rf(ns, name, spec, labels)
  return { apiVersion = "databases.spotahome.com/v1", kind = "RedisFailover",
    metadata = { name = name, namespace = ns, labels = labels }, spec = spec }
end

local NAMESPACES = { differential.namespace("cozy-system"), differential.namespace("tenant-a"),
  differential.namespace("tenant-b") }
-- Harbor's: both images empty (sentinel absent); apps/redis's: its data image set, sentinel
-- ""; one labelled for another group; one already adopted.
local HARBOR = rf("tenant-a", "harbor", { redis = { replicas = 1 } }, { app = "harbor" })
local REDIS = rf("tenant-a", "redis-cache", { redis = { image = "redis:7.2.4", replicas = 2 }, sentinel = { image = "", replicas = 3 } })
local OTHER = rf("tenant-b", "other-group", { redis = { image = "redis:6.2.6-alpine" }, sentinel = { image = "redis:6.2.6-alpine" } },
  { [LABEL] = "someone-else" })
local DONE = rf("tenant-b", "adopted", { redis = { image = "redis:6.2.6-alpine" }, sentinel = { image = "redis:6.2.6-alpine" } },
  { [LABEL] = "cozystack" })

local function cluster(...)
  local items = { CRD }
  for _, o in ipairs(NAMESPACES) do items[#items + 1] = o end
  for _, o in ipairs { ... } do items[#items + 1] = o end
  return items
end
local CLUSTER = cluster(HARBOR, REDIS, OTHER, DONE)

local function failovers(h) return differential.objects_of(h, "RedisFailover") end

local function patched(h) return differential.patched(h, "/namespaces/([^/]+/redisfailovers/[^/]+)$") end

describe("migration 54-redisfailover-adopt", function()
  local h = harness.fake { fixtures = { CLUSTER } }

  it("labels each RedisFailover and pins its empty images, keeping every set one", function()
    local res = h:migrate(54)
    local after = failovers(h)
    assert.same({ app = "harbor", [LABEL] = "cozystack" }, after["tenant-a/harbor"].metadata.labels)
    assert.same({ redis = { replicas = 1, image = IMAGE }, sentinel = { image = IMAGE } }, after["tenant-a/harbor"].spec)
    assert.same({ redis = { image = "redis:7.2.4", replicas = 2 }, sentinel = { image = IMAGE, replicas = 3 } },
      after["tenant-a/redis-cache"].spec)
    assert.same({ [LABEL] = "cozystack" }, after["tenant-b/other-group"].metadata.labels)
    assert.same(DONE.spec, after["tenant-b/adopted"].spec)
    assert.same({ "tenant-a/redisfailovers/harbor", "tenant-a/redisfailovers/redis-cache",
      "tenant-b/redisfailovers/other-group" }, patched(h))
    assert.same({ adopted = 3, already = 1, gone = 0 }, res.outcome.counts)
  end)

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(54)
    assert.equal(IMAGE, failovers(h)["tenant-a/harbor"].spec.sentinel.image)
  end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(54)
    assert.equal(IMAGE, failovers(h)["tenant-a/harbor"].spec.sentinel.image)
  end)

  it("check lists the RedisFailovers run would patch, and writes nothing", function()
    local res = h:migrate(54, { mode = "check" })
    assert.no_writes()
    local names = differential.finding_names(res, "namespace/name")
    assert.same({ "tenant-a/harbor", "tenant-a/redis-cache", "tenant-b/other-group" }, names)
  end)

  it("has nothing to do when the RedisFailover CRD is absent", function()
    h:reset(NAMESPACES)
    h.srv:delete_crd("redisfailovers.databases.spotahome.com")   -- a real server keeps CRDs across resets
    h:mark()
    local res = h:migrate(54)
    assert.no_writes()
    assert.matches("RedisFailover CRD not present", res.log)
    assert.same({}, h:migrate(54, { mode = "check" }).findings)
  end)

  it("a RedisFailover already adopted is not written", function()
    h:reset(cluster(DONE))
    h:migrate(54)
    assert.no_writes()
  end)

  it("a RedisFailover deleted between the list and its patch is skipped, the others adopted", function()
    h:faults { { method = "PATCH", path = "/redisfailovers/harbor(\\?|$)", delete = true } }
    local res = h:migrate(54)
    assert.same({ "delete" }, h:fired())
    assert.is_nil(failovers(h)["tenant-a/harbor"])
    assert.same({ adopted = 2, already = 1, gone = 1 }, res.outcome.counts)
  end)

  it("a list that fails once is retried, and the work done #fakeonly", function()
    h:faults { { method = "GET", path = "/redisfailovers(\\?|$)", times = 1, status = 500 } }
    local res = h:migrate(54)
    assert.same({ "status" }, h:fired())
    assert.equal(3, res.outcome.counts.adopted)
  end)

  it("a patch that keeps failing fails the step, as the shell's set -e #fakeonly", function()
    h:faults { { method = "PATCH", path = "/redisfailovers/harbor(\\?|$)", times = -1, status = { code = 500, message = "etcd down" } } }
    local err = h:migrate_error(54)
    assert.equal("api", err.kind)
    assert.equal(500, err.code)
    assert.is_true(#h:fired { method = "PATCH" } >= 1)
    assert.is_nil(failovers(h)["tenant-a/harbor"].metadata.labels[LABEL])
  end)
end)

-- Beside the platform's script 54 (spec/helpers/differential.lua): the same fixtures
-- run by both, compared object by object (docs/migrations/54-redisfailover-adopt.md).
describe("migration 54-redisfailover-adopt beside the platform's script #platform", function()
  local h = harness.fake { fixtures = { CLUSTER } }
  local same_as_shell = differential.same_as_shell

  it("its code is at most 1.5x its shell's (blank and comment lines not counted)", function()
    local c = differential.line_counts(54, harness.migration_file(54))
    assert.equal(28, c.shell)
    assert(c.ratio <= 1.5, ("54: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("adopts the same RedisFailovers the same way", function()
    same_as_shell(differential.run(h, 54, CLUSTER))
  end)

  it("a RedisFailover already adopted: both leave it as it is", function()
    same_as_shell(differential.run(h, 54, cluster(DONE)))
  end)

  it("the CRD absent: both have nothing to adopt", function()
    same_as_shell(differential.run(h, 54, NAMESPACES, { before = function(hh)
      hh.srv:delete_crd("redisfailovers.databases.spotahome.com")
    end }))
  end)

  it("a RedisFailover deleted before its patch: the shell fails and adopts none after it (its bug), the port skips it", function()
    local d = differential.run(h, 54, CLUSTER,
      { faults = { { method = "PATCH", path = "/redisfailovers/harbor(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "RedisFailover tenant-a/redis-cache", "RedisFailover tenant-b/other-group" }, differential.differences(d))
  end)

  it("a list that fails once: the shell fails (its bug), the port retries and adopts #fakeonly", function()
    local d = differential.run(h, 54, CLUSTER,
      { faults = { { method = "GET", path = "/redisfailovers(\\?|$)", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "RedisFailover tenant-a/harbor", "RedisFailover tenant-a/redis-cache", "RedisFailover tenant-b/other-group" },
      differential.differences(d))
  end)

  it("a patch that keeps failing: both fail, and leave that RedisFailover as it was #fakeonly", function()
    local d = differential.run(h, 54, CLUSTER,
      { faults = { { method = "PATCH", path = "/redisfailovers/harbor(\\?|$)", times = -1, status = 500 } } })
    assert.equal("status", d.shell.fired[1])
    assert.equal("status", d.port.fired[1])
    assert.is_not.equal(0, d.shell.code)
    assert.is_false(d.port.ok)
    assert.same(d.shell.objects["RedisFailover tenant-a/harbor"], d.port.objects["RedisFailover tenant-a/harbor"])
  end)
end)
