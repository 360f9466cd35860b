-- Spec for migration 53-seaweedfs-db-adopt (a port of the platform's script 53 and its
-- lib/seaweedfs-db-adopt.sh), on the spec harness (spec/README.md).
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential
local files = require("spec.helpers").files

local MIGRATION = "migrations/53-seaweedfs-db-adopt.lua"
local CLUSTER = "spec/fixtures/53-seaweedfs-db-adopt/cluster.json"
local OWNER, POLICY = "meta.helm.sh/release-name", "helm.sh/resource-policy"


-- the fixture without the CNPG CRD and its Clusters: a cluster without CNPG
local function without_cnpg()
  local items = {}
  for _, o in ipairs(require("cozy.json").decode(files.read(CLUSTER)).items) do
    if o.kind == "Namespace" then items[#items + 1] = o end
  end
  return items
end

describe("migration 53-seaweedfs-db-adopt", function()
  local h = harness.fake { fixtures = { CLUSTER } }
  local function annotations(ns, name) return h:object("Cluster", ns, name).metadata.annotations end

  it("hands every <name>-system Cluster/seaweedfs-db to <name>-db with keep, protects the -db ones, leaves the rest", function()
    local before = h:objects()
    local res = h:migrate(MIGRATION)
    assert.same({ [OWNER] = "seaweedfs-db", [POLICY] = "keep", ["meta.helm.sh/release-namespace"] = "tenant-root" },
      annotations("tenant-root", "seaweedfs-db"))
    assert.same({ [OWNER] = "foo-db", [POLICY] = "keep", ["meta.helm.sh/release-namespace"] = "tenant-foo" },
      annotations("tenant-foo", "seaweedfs-db"))
    assert.same({ [OWNER] = "seaweedfs-db", [POLICY] = "keep", ["meta.helm.sh/release-namespace"] = "tenant-fresh" },
      annotations("tenant-fresh", "seaweedfs-db"))
    assert.same({ changed = 3 }, res.outcome.counts)
    -- left alone: near-miss names, already done, not Helm-managed, unrelated or nameless owner
    local after = {}
    for _, o in ipairs(h:objects()) do after[o.kind .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name] = o end
    for _, o in ipairs(before) do
      local k = o.kind .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name
      if not ({ ["Cluster tenant-root/seaweedfs-db"] = 1, ["Cluster tenant-foo/seaweedfs-db"] = 1,
                ["Cluster tenant-fresh/seaweedfs-db"] = 1 })[k] then
        assert.same(o, after[k], k .. " was changed")
      end
    end
    assert.equal(3, #h:writes { method = "PATCH" })
    local warned = {}
    for _, l in ipairs(res.lines) do
      if l.level == "warn" then warned[#warned + 1] = l.message:match("in (tenant%-%a+):") end
    end
    table.sort(warned)
    assert.same({ "tenant-bare", "tenant-dash", "tenant-other" }, warned)
  end)

  it("is idempotent: a second run sends no write (an object already in the target state is left alone)", function()
    assert.migration_idempotent(MIGRATION)
  end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(MIGRATION)
  end)

  it("check reports each write run would make, and writes nothing", function()
    local res = h:migrate(MIGRATION, { mode = "check" })
    assert.no_writes()
    local where = {}
    for _, f in ipairs(res.findings) do where[#where + 1] = f.fields.namespace end
    table.sort(where)
    assert.same({ "tenant-foo", "tenant-fresh", "tenant-root" }, where)
  end)

  it("plan writes nothing", function()
    local res = h:migrate(MIGRATION, { mode = "plan" })
    assert.no_writes()
    assert.equal(3, #res.writes)
  end)

  it("an absent CRD: nothing to do, logged, no write", function()
    h:reset(without_cnpg())
    local res = h:migrate(MIGRATION)
    assert.no_writes()
    assert.truthy(res.log:find("CNPG Cluster is not served", 1, true))
  end)

  it("an object deleted between list and write is skipped, the others done", function()
    h:faults { { method = "PATCH", path = "namespaces/tenant-foo/clusters/seaweedfs-db(\\?|$)", delete = true } }
    local res = h:migrate(MIGRATION)
    assert.same({ "delete" }, h:fired())
    assert.is_nil(h:object("Cluster", "tenant-foo", "seaweedfs-db"))
    assert.equal("keep", annotations("tenant-root", "seaweedfs-db")[POLICY])
    assert.same({ changed = 2 }, res.outcome.counts)
  end)

  it("a list that fails once is retried and the work done #fakeonly", function()
    h:faults { { method = "GET", path = "/clusters(\\?|$)", times = 1, status = 500 } }
    local res = h:migrate(MIGRATION)
    assert.same({ "status" }, h:fired())
    assert.same({ changed = 3 }, res.outcome.counts)
  end)

  it("a write that keeps failing stops the step: the version stays #fakeonly", function()
    h:faults { { method = "PATCH", path = "namespaces/tenant-foo/clusters/seaweedfs-db(\\?|$)", times = -1, status = 500 } }
    local err = h:migrate_error(MIGRATION)
    assert.equal(500, err.code)
    assert.same({ "status", "status", "status" }, h:fired())
  end)

  it("is at most 1.5x its shell's code lines, counting the lib the shell sources #platform", function()
    local counts = differential.line_counts(53, MIGRATION)
    local lib = differential.code_lines(files.read(os.getenv("COZY_PLATFORM_MIGRATIONS") .. "/lib/seaweedfs-db-adopt.sh"), "#")
    assert.is_true(counts.lua <= 1.5 * (counts.shell + lib), counts.lua .. " > 1.5 x " .. (counts.shell + lib))
  end)

  describe("beside the platform's script 53", function()
    it("leaves the same objects #platform", function()
      local d = differential.run(h, 53, CLUSTER)
      assert.equal(0, d.shell.code)
      assert.same({}, differential.differences(d))
    end)

    it("an absent CRD: both stamp without a write #platform", function()
      local d = differential.run(h, 53, without_cnpg())
      assert.equal(0, d.shell.code)
      assert.same({}, differential.differences(d))
    end)

    it("a list that fails once: the shell fails closed (exit 1, nothing written), the port retries and does the work #fakeonly #platform", function()
      local d = differential.run(h, 53, CLUSTER,
        { faults = { { method = "GET", path = "/clusters(\\?|$)", times = 1, status = 500 } } })
      assert.same({ "status" }, d.shell.fired)
      assert.same({ "status" }, d.port.fired)
      assert.equal(1, d.shell.code)
      assert.same({ "Cluster tenant-foo/seaweedfs-db", "Cluster tenant-fresh/seaweedfs-db", "Cluster tenant-root/seaweedfs-db" },
        differential.differences(d))
    end)

    it("a Cluster deleted between read and write: the shell exits 1 there, leaving the tenants after it exposed "
      .. "(its bug); the port skips it and hands the others over #platform", function()
      local d = differential.run(h, 53, CLUSTER,
        { faults = { { method = "PATCH", path = "namespaces/tenant-foo/clusters/seaweedfs-db(\\?|$)", delete = true } } })
      assert.same({ "delete" }, d.shell.fired)
      assert.same({ "delete" }, d.port.fired)
      assert.equal(1, d.shell.code)
      assert.same({ "Cluster tenant-fresh/seaweedfs-db", "Cluster tenant-root/seaweedfs-db" }, differential.differences(d))
    end)
  end)
end)
