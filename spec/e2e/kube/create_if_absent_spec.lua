-- create if absent (`res:create(obj, { exists = "skip" })`) and what check
-- says of a create: the object it would create, by name.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local runner = require "cozy.runner"

local MIGRATION = [[
return {
  description = "ensure the defaults ConfigMap",
  permissions = {
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "create", group = "", resource = "configmaps" },
  },
  walk = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local obj, created = cms:create({ metadata = { name = "defaults", namespace = "cozy-system" },
      data = { mode = "new" } }, { exists = "skip" })
    ctx:outcome { created = created, mode = obj.data.mode }
  end,
}
]]

local function load(source)
  local dir = cli.migration_dir { ["1-ensure.lua"] = source }
  finally(function() files.rm_rf(dir) end)
  return runner.load_file(dir .. "/1-ensure.lua")
end

describe("create if absent", function()
  local h = harness.fake { fixtures = { cli.fixture(1) } }

  it("creates the object when it is absent, and returns the existing one untouched when not", function()
    local ran = h:migrate(load(MIGRATION))
    assert.same({ created = true, mode = "new" }, ran.outcome.counts)
    h:reset { cli.fixture(1, { cli.configmap("defaults", { mode = "kept" }) }) }
    local again = h:migrate(load(MIGRATION))
    assert.same({ created = false, mode = "kept" }, again.outcome.counts)
    assert.equal("kept", h:object("ConfigMap", "cozy-system", "defaults").data.mode)
  end)

  it("check names the object a create would make, and says nothing when it exists", function()
    local res = h:migrate(load(MIGRATION), { mode = "check" })
    assert.no_writes()
    assert.equal(1, #res.findings)
    assert.equal("would create configmaps cozy-system/defaults", res.findings[1].message)
    assert.equal("defaults", res.findings[1].fields.name)
    h:reset { cli.fixture(1, { cli.configmap("defaults", { mode = "kept" }) }) }
    assert.same({}, h:migrate(load(MIGRATION), { mode = "check" }).findings)
  end)

  it("refuses a create-if-absent without a name, and an unknown exists policy", function()
    local err = h:migrate_error(load((MIGRATION:gsub('name = "defaults"', 'generateName = "d-"'))))
    assert.matches('needs obj.metadata.name', err.message)
    err = h:migrate_error(load((MIGRATION:gsub('exists = "skip"', 'exists = "maybe"'))))
    assert.matches('exists is "skip" or "fail"', err.message)
    assert.no_writes()
  end)
end)
