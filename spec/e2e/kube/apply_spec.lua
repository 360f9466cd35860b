-- Server-side apply (`res:apply(obj, { field_manager =, force = })`,
-- docs/engine-api.md): one PATCH application/apply-patch+yaml with a JSON
-- body. The same cases on the fake and on the real kube-apiserver
-- (COZY_SPEC_SERVER=real): created when absent, the field manager recorded,
-- the applied fields merged (what the manager no longer applies removed),
-- a field another manager owns a 409 unless force; and in a rehearsal (plan)
-- it is a write like any other, seen by the step's later reads and sent to
-- the server with dryRun=All only.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local kube = require "cozy.kube"
local runner = require "cozy.runner"

local function app(data, labels)
  return { apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = "app", namespace = "cozy-system", labels = labels }, data = data }
end

-- The apply managers of an object's managedFields, sorted.
local function appliers(obj)
  local out = {}
  for _, e in ipairs(obj.metadata.managedFields or {}) do
    if e.operation == "Apply" then out[#out + 1] = e.manager end
  end
  table.sort(out)
  return out
end

-- A migration applying `data` to ConfigMap cozy-system/app as team-a, then
-- reading it back through the same client.
local MIGRATION = [[
return {
  description = "apply the app's ConfigMap",
  permissions = { { verb = "patch", group = "", resource = "configmaps" },
                  { verb = "get", group = "", resource = "configmaps" } },
  walk = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local applied = cms:apply({ apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "app", namespace = "cozy-system" }, data = { color = "blue" } },
      { field_manager = "team-a" })
    local read = cms:get("cozy-system", "app")
    ctx:outcome { applied = applied.data.color, read = read.data.color, kept = read.data.keep or "none" }
  end,
}
]]

local function load(source)
  local dir = cli.migration_dir { ["1-apply.lua"] = source }
  finally(function() files.rm_rf(dir) end)
  return runner.load_file(dir .. "/1-apply.lua")
end

describe("server-side apply", function()
  local h = harness.fake { fixtures = { cli.fixture(1) } }
  local function configmaps() return h:client("run"):resource("v1", "configmaps") end

  it("creates the object when it is absent and records the field manager", function()
    local got = configmaps():apply(app { color = "blue", size = "s" }, { field_manager = "team-a" })
    assert.same({ color = "blue", size = "s" }, got.data)
    local stored = h:object("ConfigMap", "cozy-system", "app")
    assert.same({ color = "blue", size = "s" }, stored.data)
    assert.same({ "team-a" }, appliers(stored))
    local writes = h:writes { path = "/configmaps/app$" }
    assert.equal(1, #writes)
    assert.equal("PATCH", writes[1].method)
    assert.equal("application/apply-patch+yaml", writes[1].content_type)
    assert.equal("fieldManager=team-a", writes[1].query)
  end)

  it("merges the applied fields into the object; what the manager applied before and no longer applies goes",
      function()
    h:reset { cli.fixture(1, { cli.configmap("app", { keep = "x" }) }) }
    local cms = configmaps()
    cms:apply(app { color = "blue", size = "s" }, { field_manager = "team-a" })
    assert.same({ keep = "x", color = "blue", size = "s" }, h:object("ConfigMap", "cozy-system", "app").data)
    local got = cms:apply(app({ color = "red" }, { tier = "web" }), { field_manager = "team-a" })
    assert.same({ keep = "x", color = "red" }, got.data)
    assert.equal("web", got.metadata.labels.tier)
    assert.same({ keep = "x", color = "red" }, h:object("ConfigMap", "cozy-system", "app").data)
    -- the same configuration again changes nothing
    local rv = h:object("ConfigMap", "cozy-system", "app").metadata.resourceVersion
    cms:apply(app({ color = "red" }, { tier = "web" }), { field_manager = "team-a" })
    assert.equal(rv, h:object("ConfigMap", "cozy-system", "app").metadata.resourceVersion)
  end)

  it("answers 409 for a field another manager owns with another value, unless force takes it over", function()
    local cms = configmaps()
    cms:apply(app { color = "blue" }, { field_manager = "team-a" })
    local ok, err = pcall(cms.apply, cms, app { color = "green" }, { field_manager = "team-b" })
    assert.is_false(ok)
    assert.equal(409, err.code)
    assert.equal("Conflict", err.reason)
    assert.matches('conflict with "team-a"', err.message, 1, true)
    assert.matches(".data.color", err.message, 1, true)
    assert.equal("blue", h:object("ConfigMap", "cozy-system", "app").data.color)
    -- the same value is no conflict: both own it
    cms:apply(app { color = "blue" }, { field_manager = "team-b" })
    assert.same({ "team-a", "team-b" }, appliers(h:object("ConfigMap", "cozy-system", "app")))
    -- force: team-c takes the field, and team-a now conflicts with it
    local got = cms:apply(app { color = "green" }, { field_manager = "team-c", force = true })
    assert.equal("green", got.data.color)
    ok, err = pcall(cms.apply, cms, app { color = "blue" }, { field_manager = "team-a" })
    assert.is_false(ok)
    assert.equal(409, err.code)
    assert.matches('conflict with "team-c"', err.message, 1, true)
  end)

  it("words conflicts and records managers as kube-apiserver does: the message, its causes, managedFields", function()
    local cms = configmaps()
    cms:apply(app { a = "1", b = "2" }, { field_manager = "team-a" })
    cms:apply(app { c = "1" }, { field_manager = "team-z" })
    local ok, err = pcall(cms.apply, cms, app { a = "9", b = "8", c = "7" }, { field_manager = "team-b" })
    assert.is_false(ok)
    assert.equal('Apply failed with 3 conflicts: conflicts with "team-a":\n- .data.a\n- .data.b\n'
      .. 'conflicts with "team-z":\n- .data.c', err.message)
    -- the real server lists the causes in no set order
    local causes = err.details.causes
    table.sort(causes, function(x, y) return x.field < y.field end)
    assert.same({
      { field = ".data.a", message = 'conflict with "team-a"', reason = "FieldManagerConflict" },
      { field = ".data.b", message = 'conflict with "team-a"', reason = "FieldManagerConflict" },
      { field = ".data.c", message = 'conflict with "team-z"', reason = "FieldManagerConflict" },
    }, causes)
    ok, err = pcall(cms.apply, cms, app { a = "9" }, { field_manager = "team-b" })
    assert.is_false(ok)
    assert.equal('Apply failed with 1 conflict: conflict with "team-a": .data.a', err.message)
    local fields = {}
    for _, e in ipairs(h:object("ConfigMap", "cozy-system", "app").metadata.managedFields) do
      fields[e.manager] = { e.operation, e.apiVersion, e.fieldsType, e.fieldsV1 }
    end
    assert.same({
      ["team-a"] = { "Apply", "v1", "FieldsV1", { ["f:data"] = { ["f:a"] = {}, ["f:b"] = {} } } },
      ["team-z"] = { "Apply", "v1", "FieldsV1", { ["f:data"] = { ["f:c"] = {} } } },
    }, fields)
    -- team-a no longer applies b, which it alone owned: b goes, team-z's c stays
    cms:apply(app { a = "1" }, { field_manager = "team-a" })
    assert.same({ a = "1", c = "1" }, h:object("ConfigMap", "cozy-system", "app").data)
  end)

  it("from a migration: the gate admits it as a patch, and the object is created and read back", function()
    local ran = h:migrate(load(MIGRATION))
    assert.same({ applied = "blue", read = "blue", kept = "none" }, ran.outcome.counts)
    assert.same({ "team-a" }, appliers(h:object("ConfigMap", "cozy-system", "app")))
    local denied = load((MIGRATION:gsub('verb = "patch"', 'verb = "update"')))
    h:reset()
    local err = h:migrate_error(denied)
    assert.equal("denied", err.kind)
    assert.no_writes()
  end)

  it("in a rehearsal: sent with dryRun=All, seen by the step's later reads, nothing stored", function()
    h:reset { cli.fixture(1, { cli.configmap("app", { keep = "x" }) }) }
    local o = { kubeconfig = h.srv.kubeconfig, dry_run = "rehearse" }
    for k, v in pairs(harness.CONNECT) do o[k] = v end
    local ran = h:migrate(load(MIGRATION), { mode = "plan", client = kube.connect(o) })
    assert.same({ applied = "blue", read = "blue", kept = "x" }, ran.outcome.counts)
    assert.same({ keep = "x" }, h:object("ConfigMap", "cozy-system", "app").data)
    for _, w in ipairs(h:writes()) do
      assert.matches("dryRun=All", w.query or "", 1, true)
    end
    -- absent: created in the rehearsal only
    h:reset()
    ran = h:migrate(load(MIGRATION), { mode = "plan", client = kube.connect(o) })
    assert.same({ applied = "blue", read = "blue", kept = "none" }, ran.outcome.counts)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "app"))
  end)

  it("in a client dry run: recorded with its field manager, answered with the fields merged locally, nothing sent",
      function()
    h:reset { cli.fixture(1, { cli.configmap("app", { keep = "x" }) }) }
    local ran = h:migrate(load(MIGRATION), { mode = "plan" })
    assert.no_writes()
    assert.equal("blue", ran.outcome.counts.applied)
    assert.equal(1, #ran.writes)
    local w = ran.writes[1]
    assert.equal("PATCH", w.method)
    assert.equal("application/apply-patch+yaml", w.content_type)
    assert.same({ fieldManager = "team-a" }, w.query)
    assert.same({ color = "blue" }, w.body.data)
  end)

  it("in check: a finding naming the object and the applied fields, nothing sent", function()
    h:reset { cli.fixture(1, { cli.configmap("app", { keep = "x" }) }) }
    local res = h:migrate(load(MIGRATION), { mode = "check" })
    assert.no_writes()
    assert.equal(1, #res.findings)
    assert.equal("would patch configmaps cozy-system/app", res.findings[1].message)
    assert.equal("app", res.findings[1].fields.name)
    assert.matches('"data":{"color":"blue"}', res.findings[1].fields.change, 1, true)
    assert.same({ keep = "x" }, h:object("ConfigMap", "cozy-system", "app").data)
  end)

  it("refuses an apply without a field manager or a name before sending anything", function()
    local cms = configmaps()
    assert.has_error(function() cms:apply(app { color = "x" }, {}) end,
      "apply(obj, opts): opts must be a table { field_manager = a name of 1 to 128 bytes, force = nil or a boolean }")
    local nameless = app { color = "x" }
    nameless.metadata.name = nil
    assert.has_error(function() cms:apply(nameless, { field_manager = "m" }) end,
      "apply(obj, opts): obj must be an object with metadata.name")
    assert.no_writes()
  end)
end)
