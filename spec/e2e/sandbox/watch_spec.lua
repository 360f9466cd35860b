-- Migration code runs under a watch wherever the engine calls it: a <close>
-- handler run while a failing step unwinds, a migration's own message
-- handler, a coroutine's close handlers, a file's top level, the table a
-- file returns. None of them can outlive the step's time limit or SIGTERM,
-- and no Lua construct swallows a pending stop. (Issue: a hostile run, class 1.)
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local LOOPS = "setmetatable({}, { __close = function() while true do end end })"

local function step(body)
  return ([[
return {
  description = "hostile",
  run = function(ctx)
    ctx.log:info("step body running")
%s
  end,
}
]]):format(body)
end

-- Runs `run` of one migration in the background and waits for it (bounded:
-- a run that hangs fails the spec instead of hanging it).
local function run_step(srv, source, ...)
  local dir = cli.migration_dir { ["1-hostile.lua"] = source }
  local p = cli.start(cli.args(srv, dir, "run", ...))
  finally(function() p:cleanup(); files.rm_rf(dir) end)
  return p
end

describe("a step's migration code under its watch", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function stopped_at_limit(r)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile ran past its time limit of 1s", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end

  it("a <close> handler that loops while a failing step unwinds ends at the step's time limit", function()
    local p = run_step(srv, step(("local guard <close> = %s\n    error('fails, then unwinds')"):format(LOOPS)),
      "--step-timeout", "1")
    stopped_at_limit(p:wait(30))
  end)

  it("the same handler is stopped by SIGTERM, and the lock released", function()
    local p = run_step(srv, step(("local guard <close> = %s\n    error('fails, then unwinds')"):format(LOOPS)))
    assert.truthy(cli.poll(10, function() return p:stderr():find("step body running", 1, true) end), p:stderr())
    p:kill("TERM")
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile stopped by signal 15", r.stderr, 1, true)
    assert.equal("", cli.lease_holder(srv))
  end)

  it("a message handler of the migration's own xpcall that loops does not hide the stop", function()
    local p = run_step(srv, step("xpcall(function() while true do end end, function() while true do end end)"),
      "--step-timeout", "1")
    stopped_at_limit(p:wait(30))
  end)

  it("coroutine.close does not swallow a stop raised in the coroutine's close handler", function()
    -- on an old binary coroutine.close returned false and the step went on to
    -- finish and stamp long after its limit
    local p = run_step(srv, step(([[
    local co = coroutine.create(function()
      local guard <close> = %s
      coroutine.yield()
    end)
    coroutine.resume(co)
    coroutine.close(co)]]):format(LOOPS)), "--step-timeout", "1")
    stopped_at_limit(p:wait(30))
  end)

  it("an error object whose __tostring loops is reported without calling it", function()
    local p = run_step(srv, step("error(setmetatable({}, { __tostring = function() while true do end end }))"))
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile raised a table value: (a table value that cannot be shown)", r.stderr, 1, true)
    assert.equal("", cli.lease_holder(srv))
  end)
end)

describe("a migration file's own code outside a step", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  local function list(source)
    local dir = cli.migration_dir { ["1-hostile.lua"] = source }
    local p = cli.start(cli.args(srv, dir, "list"))
    finally(function() p:cleanup(); files.rm_rf(dir) end)
    return p:wait(30)
  end

  it("a <close> handler that loops at the top level of a failing file is stopped at the load limit", function()
    local r = list(("local guard <close> = %s\nerror('top level fails')\n"):format(LOOPS))
    assert.equal(2, r.code, r.stderr)
    assert.matches("1-hostile.lua: its top level did not return within 5s", r.stderr, 1, true)
  end)

  it("a returned table with an __index that loops is refused as not plain data, without calling it", function()
    local r = list("return setmetatable({}, { __index = function() while true do end end })\n")
    assert.equal(2, r.code, r.stderr)
    assert.matches("1-hostile.lua: the migration table must be plain data: a table in it has a metatable",
      r.stderr, 1, true)
  end)

  it("a __pairs on a permission entry is refused the same way", function()
    local r = list([[
return { description = "d", run = function() end,
  permissions = { setmetatable({ verb = "get", resource = "pods" }, { __pairs = function() while true do end end }) } }
]])
    assert.equal(2, r.code, r.stderr)
    assert.matches("must be plain data", r.stderr, 1, true)
  end)
end)
