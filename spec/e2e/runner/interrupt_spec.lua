-- A step is stopped wherever it is: a loop that never writes ends at its
-- time limit or on SIGTERM; a migration file whose top level never returns is
-- refused; a write retried past the lease's expiry is never sent.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli

local migration_dir = cli.migration_dir

local LOOP = [[
return {
  description = "never ends",
  %s
  run = function(ctx)
    ctx.log:info("looping")
    local n = 0
    while true do n = n + 1 end
  end,
  check = function(ctx) while true do end end,
}
]]

local function error_lines(text)
  local out = {}
  for _, line in ipairs(cli.lines(text)) do
    if line:find(" ERROR ", 1, true) then out[#out + 1] = line end
  end
  return out
end

describe("a step that never ends", function()
  local srv
  setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:reset(cli.fixture(1))
    srv:clear_requests()
  end)

  it("is stopped at its own time limit: exit 1, nothing stamped, lock released", function()
    local dir = migration_dir { ["1-loop.lua"] = LOOP:format("timeout = 1,") }
    local r = cli.run(cli.args(srv, dir, "run"))
    os.execute("rm -rf " .. cli.quote(dir))
    assert.equal(1, r.code, r.stderr)
    local lines = error_lines(r.stderr)
    assert.equal(1, #lines, r.stderr)
    assert.matches("1-loop ran past its time limit of 1s", lines[1], 1, true)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("is stopped at --step-timeout, which overrides the migration's own", function()
    local dir = migration_dir { ["1-loop.lua"] = LOOP:format("timeout = 3600,") }
    local r = cli.run(cli.args(srv, dir, "run", "--step-timeout", "0.5"))
    os.execute("rm -rf " .. cli.quote(dir))
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-loop ran past its time limit of 0.5s", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
  end)

  it("is stopped by SIGTERM while it loops, releasing the lock", function()
    local dir = migration_dir { ["1-loop.lua"] = LOOP:format("") }
    local p = cli.start(cli.args(srv, dir, "run"))
    finally(function() p:cleanup(); os.execute("rm -rf " .. cli.quote(dir)) end)
    assert.truthy(cli.poll(10, function() return p:stderr():find("looping", 1, true) end), p:stderr())
    p:kill("TERM")
    local r = p:wait(10)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-loop stopped by signal 15", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("in check(): a blocking finding, at the time limit", function()
    local dir = migration_dir { ["1-loop.lua"] = LOOP:format("") }
    local r = cli.run(cli.args(srv, dir, "check", "--step-timeout", "0.5"))
    os.execute("rm -rf " .. cli.quote(dir))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("[BLOCK] 1-loop: check() failed: 1-loop ran past its time limit of 0.5s", r.stdout, 1, true)
  end)

  it("at a migration file's top level: the set is refused (exit 2), list and status too", function()
    local dir = migration_dir { ["1-hangs.lua"] = "while true do end\nreturn {}\n" }
    for _, command in ipairs({ "list", "status", "run" }) do
      local r = cli.run(cli.args(srv, dir, command))
      assert.equal(2, r.code, command .. ": " .. r.stderr)
      assert.matches("1-hangs.lua: its top level did not return within 5s", r.stderr, 1, true)
    end
    os.execute("rm -rf " .. cli.quote(dir))
    assert.same({}, cli.writes(srv))
  end)
end)

describe("a write retried while the lock expires", function()
  local srv
  setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)

  it("is never sent after the lease has expired", function()
    local LEASE = 3
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", {}) }))
    srv:clear_requests()
    local p = cli.start(cli.args(srv, "slow", "run"), { COZY_MIGRATE_LEASE_SECONDS = tostring(LEASE) })
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(10, function() return p:stderr():find("step started", 1, true) end), p:stderr())
    -- the migration's next write meets 429s for longer than the lease lasts;
    -- once one has, renewals fail. In that order: with a 3 s lease a write
    -- goes out only in the half second after a renewal (its attempt must end
    -- inside the lease), so renewals failing first could leave no write to
    -- throttle
    srv:faults { { method = "PATCH", path = "/configmaps/runner-test$", times = 8, status = { code = 429, retry_after = 1 } } }
    assert.truthy(cli.poll(10, function() return #srv:fired { path = "/configmaps/runner%-test$" } > 0 end),
      "the 429 fault fired")
    srv:faults { { method = "PATCH", path = "/leases/cozystack-migrations$", times = -1, status = 500 } }
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("lock lost", r.stderr, 1, true)
    local last_renewal, throttled
    local writes = {}
    for _, e in ipairs(srv:requests()) do
      -- taking the lease (POST) or renewing it (PATCH): the last time it was ours for sure
      if e.path:find("/leases", 1, true) and e.method ~= "GET" and e.status and e.status >= 200
          and e.status < 300 then last_renewal = e.at end
      if e.method == "PATCH" and e.path:find("/configmaps/runner-test", 1, true) then
        writes[#writes + 1] = e
        if e.status == 429 then throttled = true end
      end
    end
    assert.truthy(last_renewal, "the lease was never written")
    assert.truthy(throttled, "the 429 fault never fired")
    assert.is_true(#srv:requests { method = "PATCH", path = "/leases/" } > 0)
    local expiry = last_renewal + LEASE
    for _, w in ipairs(writes) do
      assert.is_true(w.at < expiry, ("a write attempt arrived %.2fs after the lease expired"):format(w.at - expiry))
    end
    assert.equal(1, cli.version(srv))
  end)
end)
