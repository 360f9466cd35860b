-- Migration 48-clickhouse-keeper-pvc-labels on the spec harness, and beside the
-- platform's script 48 (spec/helpers/differential.lua): the same fixtures, run by
-- both, compared object by object. Differences are the shell's, listed in
-- docs/migrations/48-clickhouse-keeper-pvc-labels.md with the case that shows each.
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential

local LABEL = "app.kubernetes.io/instance"

-- The keeper operator's CRD, with an open schema
local CRD = differential.crd("clickhouse-keeper.altinity.com", "v1", "clickhousekeeperinstallations",
  "ClickHouseKeeperInstallation", { short_names = { "chk" } })

local function chk(ns, name)
  return { apiVersion = "clickhouse-keeper.altinity.com/v1", kind = "ClickHouseKeeperInstallation",
    metadata = { name = name, namespace = ns }, spec = { configuration = { clusters = { { name = "cluster1" } } } } }
end

local function pvc(ns, name, release)
  return { apiVersion = "v1", kind = "PersistentVolumeClaim",
    metadata = { name = name, namespace = ns, labels = { [LABEL] = release, ["app"] = "keeper" } },
    spec = { accessModes = { "ReadWriteOnce" }, resources = { requests = { storage = "1Gi" } } } }
end

local function cluster(with_crd, ...)
  return differential.cluster(48, { "cozy-system", "tenant-a", "tenant-b" }, with_crd and { CRD, ... } or { ... })
end

local A0 = "default-chk-clickhouse-a-keeper-cluster1-0-0-0"
-- tenant-a: one keeper PVC unlabelled, one labelled, the data PVC (not the keeper's, left)
local TENANT_A = { chk("tenant-a", "clickhouse-a-keeper"), pvc("tenant-a", A0, nil),
  pvc("tenant-a", "default-chk-clickhouse-a-keeper-cluster1-0-1-0", "clickhouse-a"), pvc("tenant-a", "data-clickhouse-a-0", nil) }
local FLEET = cluster(true, table.unpack(TENANT_A))
-- tenant-b: an installation with a dot in its name, and a PVC of another installation its
-- name matches as an unescaped regex (the dot matching the x)
local DOTTED = cluster(true, chk("tenant-b", "ch.b-keeper"), pvc("tenant-b", "default-chk-ch.b-keeper-cluster1-0-0-0", nil),
  pvc("tenant-b", "default-chk-chxb-keeper-cluster1-0-0-0", nil))

local function label(d, side, key)
  return differential.field(d, side, "PersistentVolumeClaim " .. key, "metadata", "labels", LABEL)
end

describe("migration 48-clickhouse-keeper-pvc-labels", function()
  local h = harness.fake { fixtures = { FLEET } }

  it("its code is at most 1.5x its shell's (blank and comment lines not counted) #platform", function()
    local c = differential.line_counts(48, harness.migration_file(48))
    assert.equal(28, c.shell)
    assert(c.ratio <= 1.5, ("48: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("labels the keeper's unlabelled PVCs with the release, as the shell does #platform", function()
    local d = differential.run(h, 48, FLEET)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.equal("clickhouse-a", label(d, "port", "tenant-a/" .. A0))
    assert.is_nil(label(d, "port", "tenant-a/data-clickhouse-a-0"))
    assert.equal(1, #d.port.writes)
  end)

  it("writes nothing when every keeper PVC is labelled (the target state), as the shell #platform", function()
    local d = differential.run(h, 48, cluster(true, chk("tenant-a", "clickhouse-a-keeper"),
      pvc("tenant-a", "default-chk-clickhouse-a-keeper-cluster1-0-1-0", "clickhouse-a")))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("has nothing to do when the keeper CRD is absent, as the shell #platform", function()
    local d = differential.run(h, 48, cluster(false, pvc("tenant-a", A0, nil)))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.matches("no ClickHouse keeper", d.port.result.log, 1, true)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("an installation whose name has a dot: the shell labels another's PVC (its bug), the port does not #platform", function()
    local d = differential.run(h, 48, DOTTED)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.equal("ch.b", label(d, "port", "tenant-b/default-chk-ch.b-keeper-cluster1-0-0-0"))
    assert.equal("ch.b", label(d, "shell", "tenant-b/default-chk-chxb-keeper-cluster1-0-0-0"))
    assert.is_nil(label(d, "port", "tenant-b/default-chk-chxb-keeper-cluster1-0-0-0"))
    assert.same({ "PersistentVolumeClaim tenant-b/default-chk-chxb-keeper-cluster1-0-0-0" }, differential.differences(d))
  end)

  it("a PVC deleted between the list and its label: the shell fails the upgrade (its bug), the port goes on #platform", function()
    local d = differential.run(h, 48, FLEET,
      { faults = { { method = "PATCH", path = "persistentvolumeclaims/" .. A0 .. "(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.same({}, differential.differences(d))
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
  end)

  it("a label write that keeps failing fails the step, as the shell's #fakeonly #platform", function()
    local d = differential.run(h, 48, FLEET,
      { faults = { { method = "PATCH", path = "persistentvolumeclaims/" .. A0 .. "(\\?|$)", times = -1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.equal("status", d.port.fired[1])
    assert.is_not.equal(0, d.shell.code)
    assert.is_false(d.port.ok)
    assert.equal(500, d.port.err.code)
    assert.same({}, differential.differences(d))
  end)

  it("an installation list that fails once: the port retries and labels; the shell stamps without labelling (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 48, FLEET,
      { faults = { { method = "GET", path = "/clickhousekeeperinstallations\\?", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({ "PersistentVolumeClaim tenant-a/" .. A0 }, differential.differences(d))
  end)

  it("an installation list that keeps failing: logged, nothing labelled, stamped, as the shell (best effort) #fakeonly #platform", function()
    local d = differential.run(h, 48, FLEET,
      { faults = { { method = "GET", path = "/clickhousekeeperinstallations\\?", times = -1, status = 500 } } })
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.matches("ClickHouse keeper installations not listed, no PVC labelled", d.port.result.log, 1, true)
    assert.same({}, differential.differences(d))
  end)

  it("is idempotent", function() assert.migration_idempotent(48) end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(48)
    assert.equal("clickhouse-a", h:object("PersistentVolumeClaim", "tenant-a", A0).metadata.labels[LABEL])
  end)

  it("check lists the label run would write, and sends nothing", function()
    local res = h:migrate(48, { mode = "check" })
    assert.no_writes()
    assert.equal(1, #res.findings)
    assert.same({ "patch", A0 }, { res.findings[1].fields.verb, res.findings[1].fields.name })
  end)
end)
