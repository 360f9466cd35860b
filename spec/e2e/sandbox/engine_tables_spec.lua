-- No table the engine uses is reachable from a migration, by any means
-- (`pairs`, `next`, `rawget`, `rawset`, metatables), and no Lua construct
-- swallows a pending stop. What a migration holds of the engine (the JSON
-- markers, `ctx` and its sealed objects, the client's counters) is a proxy
-- whose state lives in closures; the sandbox's raw functions refuse it.
-- (Issue 35, class 1: the sandbox boundary leaks through iteration.)
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

-- A run of the migrations `sources` (file name -> source), in the
-- background and bounded: a run that hangs fails the spec instead of
-- hanging it.
local function run_set(srv, sources, ...)
  local dir = cli.migration_dir(sources)
  local p = cli.start(cli.args(srv, dir, ...))
  finally(function() p:cleanup(); files.rm_rf(dir) end)
  return p
end

local function step(body)
  return ([[
local json = require "cozy.json"
return {
  description = "hostile",
  run = function(ctx)
%s
  end,
}
]]):format(body)
end

local BENIGN = [[return { description = "benign", run = function() end }]]

describe("the JSON markers a migration holds", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  -- migration 1 stamps a first history record; migration 2 reaches for the
  -- real marker behind the stand-in and changes it; the stamp of 2 follows
  local function tampered(body)
    local p = run_set(srv, { ["1-first.lua"] = BENIGN, ["2-hostile.lua"] = step(body) }, "run")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
    local _, cm = cli.version(srv)
    local names = {}
    for _, rec in ipairs(cli.history(cm)) do names[#names + 1] = rec.name end
    assert.same({ "1-first", "2-hostile" }, names)
    return r
  end

  it("pairs(json.array_mt) hands out no table: a __len set through it cannot empty the history", function()
    -- on the binary before, pairs gave the engine's real array_mt and the
    -- stamp of 2 wrote the history as [] (both records lost)
    tampered([[
    pcall(function() select(2, pairs(json.array_mt)).__len = function() return 0 end end)]])
  end)

  it("a __len that loops, set the same way, cannot hang the engine's stamp", function()
    -- on the binary before, the stamp's #history ran it outside any watch:
    -- SIGTERM ignored, the lease renewed for ever
    tampered([[
    pcall(function() select(2, pairs(json.array_mt)).__len = function() while true do end end end)]])
  end)

  it("the marker from getmetatable of a decoded object neither: what later steps decode reads as the server sent it", function()
    -- on the binary before, the __index set here answered every absent key
    -- of every object decoded afterwards, the engine's and step 3's
    local p = run_set(srv, {
      ["1-first.lua"] = BENIGN,
      ["2-hostile.lua"] = step([[
    local _, state = pairs(getmetatable(json.decode("{}")))
    pcall(function() state.__index = function() return "forged" end end)]]),
      ["3-reads.lua"] = step([[
    local decoded = json.decode('{"metadata":{"name":"x"}}')
    assert(decoded.metadata.namespace == nil, "an absent key read as " .. tostring(decoded.metadata.namespace))]]),
    }, "run")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.equal(4, cli.version(srv))
  end)

  it("rawset cannot write into a stand-in (shared by every migration of the run)", function()
    local p = run_set(srv, { ["1-hostile.lua"] = step([[
    rawset(json.array_mt, "__len", function() return 0 end)]]) }, "run")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("cozy sandbox: rawset of an engine object is not available to migrations", r.stderr, 1, true)
  end)
end)

describe("ctx and its sealed objects", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1, { cli.configmap("target", { keep = "me" }) })) end)

  -- a walk that would patch one ConfigMap, after `tamper`: check must
  -- still report the write it would make
  local function walk(tamper)
    return ([[
return {
  description = "walks",
  permissions = { { verb = "get", group = "", resource = "configmaps" },
                  { verb = "patch", group = "", resource = "configmaps" } },
  walk = function(ctx)
    pcall(function()
%s
    end)
    ctx.kube:resource("v1", "configmaps"):merge_patch("cozy-system", "target", { data = { keep = "changed" } })
  end,
}
]]):format(tamper)
  end

  local function reported(tamper)
    local p = run_set(srv, { ["1-walks.lua"] = walk(tamper) }, "check", "-o", "json")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    local out = json.decode(r.stdout)
    local messages = {}
    for _, f in ipairs(out.findings) do
      if f.migration == "1-walks" then messages[#messages + 1] = f.message end
    end
    assert.same({ "would patch configmaps cozy-system/target" }, messages)
  end

  it("ctx.finding cannot be replaced: check still reports what the walk would write", function()
    -- on the binary before, the walk's would-write findings went to the
    -- migration's function and check reported nothing
    reported([[      ctx.finding = function() end]])
  end)

  it("nor by rawset on ctx", function()
    reported([[      rawset(ctx, "finding", function() end)]])
  end)

  it("pairs on a sealed object hands out no table of its fields", function()
    local p = run_set(srv, { ["1-hostile.lua"] = step([[
    for _, sealed in ipairs({ ctx, ctx.kube, ctx.log, ctx.kube:resource("v1", "configmaps"), ctx:queue() }) do
      local iter, state = pairs(sealed)
      assert(rawequal(state, sealed), "pairs handed out another table")
      local ok = pcall(function() state.anything = 1 end)
      assert(not ok, "a sealed object took a field")
      local n = 0
      for k, v in pairs(sealed) do n = n + 1 end
      assert(n > 0, "pairs lists nothing")
    end
    ctx.log:info("sealed objects hold")]]) }, "run")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.matches("sealed objects hold", r.stderr, 1, true)
  end)

  it("the client's live counters cannot be written through pairs: the summary counts what was sent", function()
    -- on the binary before, pairs gave the client's own stats table and the
    -- run's summary said writes=1000
    local p = run_set(srv, { ["1-hostile.lua"] = step([[
    local before = ctx.kube.stats.writes
    local _, counters = pairs(ctx.kube.stats)
    pcall(function() counters.writes = 1000 end)
    assert(ctx.kube.stats.writes == before, "counters changed")
    for k, v in pairs(ctx.kube.stats) do assert(type(v) == "number", k) end]]) }, "run")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    -- the Lease's create and the stamp
    assert.matches("INFO  summary .* writes=2\n", r.stderr)
  end)
end)

describe("a stop inside load's reader", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local LOADS = [[
    ctx.log:info("step body running")
    while true do load(function() while true do end end) end]]

  it("is not swallowed: a loop around load(reader) ends at the step's time limit", function()
    -- on the binary before, load returned nil and the error, and the loop
    -- went on for ever
    local p = run_set(srv, { ["1-hostile.lua"] = step(LOADS) }, "run", "--step-timeout", "1")
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile ran past its time limit of 1s", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("nor SIGTERM", function()
    local p = run_set(srv, { ["1-hostile.lua"] = step(LOADS) }, "run")
    assert.truthy(cli.poll(10, function() return p:stderr():find("step body running", 1, true) end), p:stderr())
    p:kill("TERM")
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile stopped by signal 15", r.stderr, 1, true)
    assert.equal("", cli.lease_holder(srv))
  end)

  it("nor when load itself is called through pcall (load returns, so pcall has nothing to rethrow)", function()
    local p = run_set(srv, { ["1-hostile.lua"] = step([[
    while true do pcall(load, function() while true do end end) end]]) }, "run", "--step-timeout", "1")
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-hostile ran past its time limit of 1s", r.stderr, 1, true)
  end)
end)
