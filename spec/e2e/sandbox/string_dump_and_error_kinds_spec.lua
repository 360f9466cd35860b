-- What a migration cannot reach or forge: `string.dump`, through a string's
-- methods or a loaded chunk, and the kind of an engine error it caught and
-- raised again (errors.kind is kept where a migration cannot write).
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local function run_migration(srv, source, ...)
  local dir = cli.migration_dir { ["1-hostile.lua"] = source }
  local r = cli.run(cli.args(srv, dir, "run", ...))
  files.rm_rf(dir)
  return r
end

describe("a string's methods", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  it("do not reach string.dump", function()
    local r = run_migration(srv, [[
return { description = "looks for dump", run = function(ctx)
  assert(("").dump == nil, "string.dump reachable through a string")
  assert(string.dump == nil, "string.dump reachable")
  assert(("x"):rep(3) == "xxx" and ("%d"):format(7) == "7", "string methods lost")
end }
]])
    assert.equal(0, r.code, r.stderr)
  end)

  it("do not reach it from a loaded chunk either", function()
    local r = run_migration(srv, [[
return { description = "looks for dump", run = function(ctx)
  local f = load("return ('').dump")
  assert(f() == nil, "string.dump reachable from load")
end }
]])
    assert.equal(0, r.code, r.stderr)
  end)
end)

describe("an engine error a migration catches", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function rethrown_as(kind)
    return ([[
return { description = "forges", permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx)
    local ok, err = pcall(function() return ctx.kube:resource("v1", "configmaps"):get("cozy-system", "nope") end)
    assert(not ok and err.code == 404, "expected a 404")
    err.kind = %q
    error(err)
  end }
]]):format(kind)
  end

  it("stays what the engine made it: kind 'lost' written on it still releases the lock", function()
    local r = run_migration(srv, rethrown_as("lost"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("NotFound", r.stderr, 1, true)
    assert.equal("", cli.lease_holder(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("kind 'locked' written on it does not change the exit status to 3", function()
    local r = run_migration(srv, rethrown_as("locked"))
    assert.equal(1, r.code, r.stderr)
    assert.equal("", cli.lease_holder(srv))
  end)
end)
