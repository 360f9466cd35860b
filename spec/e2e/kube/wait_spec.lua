-- ctx.kube:wait and resource:wait (cozy.kube.wait) run by `cozy-migrate run`
-- in the background: satisfied by a write the spec makes after the wait has
-- started (seen as a watch event, not a poll), relisted where a watch ends
-- (a 410, an ERROR event: fake faults that are asserted to have fired),
-- failing closed at its own timeout, stopped at once by SIGTERM and by the
-- step's time limit, read once in check and in a rehearsal (marked as a
-- controller's work), and refused without the watch permission. On either
-- server (COZY_SPEC_SERVER=real), the fault cases on the fake alone.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local WAIT = [[
return {
  description = "waits for the gate",
  permissions = {
    { verb = "list", resource = "configmaps" },
    %s
    { verb = "create", resource = "configmaps" },
  },
  run = function(ctx)
    ctx.log:info("step body running")
    local cms = ctx.kube:resource("v1", "configmaps", { kind = "ConfigMap" })
    local obj, info = cms:wait("cozy-system", "gate", { timeout = %s, what = "ready",
      condition = function(o) return o.data ~= nil and o.data.ready == "yes" end })
    ctx.log:info("wait returned", { met = info.met, once = info.once, events = info.events, relists = info.relists })
    if ctx.mode == "run" then
      cms:create{ apiVersion = "v1", kind = "ConfigMap", metadata = { name = "seen", namespace = "cozy-system" },
        data = { ready = obj.data.ready } }
    end
  end,
}
]]

local WATCH = '{ verb = "watch", resource = "configmaps" },'

local function migration(timeout, watch)
  return WAIT:format(watch == false and "" or WATCH, tostring(timeout))
end

describe("a wait", function()
  local srv, dir
  setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:reset(cli.fixture(1, { cli.configmap("gate", { ready = "no" }) }))
  end)
  after_each(function() if dir then files.rm_rf(dir) end end)

  local function start(source, ...)
    dir = cli.migration_dir { ["1-wait.lua"] = source }
    local p = cli.start(cli.args(srv, dir, ...))
    finally(function() p:cleanup() end)
    return p
  end

  -- the wait has listed the object and found it not ready
  local function waiting(p)
    assert.truthy(cli.poll(30, function()
      return p:stderr():find("waiting for ConfigMap cozy-system/gate ready", 1, true) or p:done()
    end), p:stderr())
    assert.is_nil(p:done(), p:stderr())
  end

  local function make_ready()
    local r = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/gate",
      { body = { data = { ready = "yes" } }, content_type = "application/merge-patch+json" })
    assert.equal(200, r.status, r.body)
  end

  it("is met by a write made after it started, seen as the watch's event", function()
    local p = start(migration(120), "run")
    waiting(p)
    make_ready()
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.matches("waited [%d.]+s for ConfigMap cozy%-system/gate ready events=1", r.stderr)
    assert.matches("relists=0", r.stderr, 1, true)
    assert.equal("yes", srv:object("ConfigMap", "cozy-system", "seen").data.ready)
    assert.equal(2, cli.version(srv))
  end)

  it("for a deletion, is met by a delete made after it started", function()
    local p = start(([[
return {
  description = "waits for the gate to go",
  permissions = { { verb = "list", resource = "configmaps" }, { verb = "watch", resource = "configmaps" } },
  run = function(ctx)
    local obj, info = ctx.kube:wait("configmaps", "gate", { namespace = "cozy-system", deleted = true, timeout = 120 })
    ctx.log:info("wait returned", { gone = obj == nil, events = info.events })
  end,
}
]]), "run")
    assert.truthy(cli.poll(30, function()
      return p:stderr():find("waiting for ConfigMap cozy-system/gate deleted", 1, true) or p:done()
    end), p:stderr())
    local r = srv:request("DELETE", "/api/v1/namespaces/cozy-system/configmaps/gate")
    assert.equal(200, r.status, r.body)
    r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.matches("wait returned events=1 gone=true", r.stderr, 1, true)
  end)

  it("refuses a wait that asks for two things, or for a timeout that is not a positive number", function()
    for _, opts in ipairs({ '{ namespace = "cozy-system", deleted = true, created = true }',
        '{ namespace = "cozy-system", deleted = true, timeout = -1 }' }) do
      dir = cli.migration_dir { ["1-wait.lua"] = ([[
return {
  description = "asks badly",
  permissions = { { verb = "list", resource = "configmaps" }, { verb = "watch", resource = "configmaps" } },
  run = function(ctx) ctx.kube:wait("configmaps", "gate", %s) end,
}
]]):format(opts) }
      local r = cli.run(cli.args(srv, dir, "run"))
      files.rm_rf(dir)
      assert.equal(1, r.code, r.stderr)
      assert.matches(opts:find("created") and "wait: give exactly one of condition, deleted = true, created = true"
        or "wait: timeout must be a positive number of seconds", r.stderr, 1, true)
      assert.equal(1, cli.version(srv))
    end
    dir = nil
  end)

  it("returns at once, with no watch, when the condition already holds", function()
    make_ready()
    local p = start(migration(120), "run")
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.matches("wait returned events=0 met=true", r.stderr, 1, true)
    for _, e in ipairs(srv:requests { method = "GET", path = "configmaps" }) do
      assert.not_matches("watch=true", tostring(e.query), 1, true)
    end
  end)

  it("times out closed: the step fails naming what it waited for, nothing stamped, lock released", function()
    local p = start(migration(1), "run")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches('wait for ConfigMap cozy-system/gate ready: timed out after 1s', r.stderr, 1, true)
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "seen"))
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("is stopped at once by SIGTERM, long before its own timeout", function()
    local p = start(migration(3600), "run")
    waiting(p)
    p:kill("TERM")
    -- bounded by Proc:wait: a wait that swallowed the stop would run to its 3600 s
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-wait stopped by signal 15 during GET /api/v1/namespaces/cozy-system/configmaps?watch=true",
      r.stderr, 1, true)
    assert.not_matches("timed out", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("is stopped by the step's time limit, shorter than its own timeout", function()
    local p = start(migration(3600), "run", "--step-timeout", "2")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-wait ran past its time limit during GET /api/v1/namespaces/cozy-system/configmaps?watch=true",
      r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
  end)

  it("relists where a watch ends with 410 Gone, then sees the write #fakeonly", function()
    srv:faults { { method = "GET", path = "configmaps\\?watch=true", times = 1, status = { code = 410 } } }
    local p = start(migration(120), "run", "-v", "1")
    waiting(p)
    assert.truthy(cli.poll(30, function() return #srv:fired() == 1 end))
    make_ready()
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.same({ "status" }, srv:fired())
    assert.matches("the watch ended (410 Gone), relisting", r.stderr, 1, true)
    assert.matches("events=1 migration=1-wait relists=1", r.stderr, 1, true)
  end)

  it("relists where a watch answers an ERROR event (410 Expired in the stream) #fakeonly", function()
    srv:faults { { method = "GET", path = "configmaps\\?watch=true", times = 1, respond = { status = 200,
      body = '{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure",'
        .. '"message":"too old resource version","reason":"Expired","code":410}}\n' } } }
    local p = start(migration(120), "run", "-v", "1")
    waiting(p)
    assert.truthy(cli.poll(30, function() return #srv:fired() == 1 end))
    make_ready()
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.same({ "respond" }, srv:fired())
    assert.matches("events=1 migration=1-wait relists=1", r.stderr, 1, true)
  end)

  it("relists where the server closes the stream without an event", function()
    -- the wait's first watch asks the server to end within its 2 s; the write
    -- comes after that watch has ended and the wait has relisted
    local p = start(migration(2.5), "run", "-v", "1")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("the watch ended (stream closed), relisting", r.stderr, 1, true)
    assert.matches("timed out after 2.5s", r.stderr, 1, true)
  end)

  it("needs the watch permission: without it the step is refused, naming it; rbac grants what is declared", function()
    local p = start(migration(120, false), "run")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches('which its permissions do not declare; declare { verb = "watch", group = "", resource = "configmaps" }',
      r.stderr, 1, true)
    -- a wait's requests are a list and a watch like any other: declared, they are granted
    files.write(dir .. "/1-wait.lua", migration(120))
    r = cli.run({ "rbac", "--all", "--no-builtin", "--migrations", dir, "-o", "json" })
    assert.equal(0, r.code, r.stderr)
    assert.matches('"watch"', r.stdout, 1, true)
  end)

  it("in check, reads once and does not wait: no watch is sent", function()
    dir = cli.migration_dir { ["1-wait.lua"] = migration(3600) }
    local r = cli.run(cli.args(srv, dir, "check"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("wait for ConfigMap cozy-system/gate ready: not met now; not waited on in check", r.stderr, 1, true)
    for _, e in ipairs(srv:requests { method = "GET", path = "configmaps" }) do
      assert.not_matches("watch=true", tostring(e.query), 1, true)
    end
  end)

  it("in a rehearsal (plan), answers from the merged state and marks the step as waiting on a controller", function()
    dir = cli.migration_dir { ["1-wait.lua"] = migration(3600) }
    local r = cli.run(cli.args(srv, dir, "plan", "-o", "json"))
    assert.equal(0, r.code, r.stderr)
    local plan = json.decode(r.stdout)
    assert.same({ exact = false, why = { "waited on a controller's work: ConfigMap cozy-system/gate ready" } },
      plan.steps[1].rehearsed)
    assert.equal(1, cli.version(srv))
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "seen"))
  end)
end)
