-- cozy-migrate under valgrind memcheck, end to end: `run` of migration 59
-- (built in) on a small fleet, with list pages, the lease thread renewing,
-- a retried request and a restarted list; then a run that fails closed.
-- No memory error and no leak of any kind (definite, indirect or possible)
-- in either: memcheck's exit status 99 would say otherwise. Registered only
-- in the plain build (SANITIZE off): an ASan binary cannot run under
-- valgrind. No suppressions.
local campaign = require("spec.helpers").campaign

local VALGRIND = "/usr/bin/valgrind"
local BIN = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"
local MEMCHECK = { "--error-exitcode=99", "--leak-check=full",
  "--errors-for-leak-kinds=definite,indirect,possible", "--show-leak-kinds=definite,indirect,possible" }
-- A 6 s lease is renewed every 2 s, each renewal with 2 s to answer (ample
-- under memcheck); the rate limit (4 requests a second, no burst) makes the
-- run outlast a renewal whatever the machine's speed.
local ENV = { COZY_MIGRATE_PAGE_LIMIT = "10", COZY_MIGRATE_LEASE_SECONDS = "6" }
local SLOW = { "--qps", "4", "--burst", "1" }

local function memcheck(srv)
  local args = {}
  for _, a in ipairs(MEMCHECK) do args[#args + 1] = a end
  args[#args + 1] = BIN
  -- generous: everything is 20-50 times slower under memcheck
  for _, a in ipairs(campaign.args(srv, "--request-timeout", "60", "-v", table.unpack(SLOW))) do args[#args + 1] = a end
  local saved = campaign.runner.bin
  campaign.runner.bin = VALGRIND
  local ok, r = pcall(campaign.runner.run, args, ENV)
  campaign.runner.bin = saved
  assert(ok, r)
  return r
end

local function count(text, needle)
  local n = 0
  for line in text:gmatch("[^\n]+") do
    if line:find(needle, 1, true) then n = n + 1 end
  end
  return n
end

describe("cozy-migrate under valgrind memcheck", function()
  local dir, fixture, needs, srv

  setup(function()
    dir = campaign.tmpdir()
    fixture, needs = campaign.fleet(dir, 30)
    srv = campaign.server(fixture, dir)
  end)
  teardown(function()
    if srv then srv:stop() end
    campaign.rmdir(dir)
  end)

  it("is clean on a run of migration 59 with pages, renewals, a retry and a list restart", function()
    srv:faults {
      { method = "GET", path = "/virtualmachines\\?.*continue=", status = { code = 410, reason = "Expired" } },
      { method = "PATCH", path = "/virtualmachines/node-00012$", status = { code = 503, retry_after = 1 } },
    }
    local r = memcheck(srv)
    assert.equal(0, r.code, r.stderr)
    assert.equal(1, count(r.stderr, "ERROR SUMMARY: 0 errors from 0 contexts"), r.stderr)
    assert.equal(1, count(r.stderr, "All heap blocks were freed -- no leaks are possible"), r.stderr)
    assert.equal("60", campaign.state(srv).version)
    campaign.assert_patched_once(srv, needs, "under valgrind")
    assert.same({ "status", "status" }, srv:fired())
    -- the lease thread ran under memcheck too
    assert.is_true(count(r.stderr, "lock renewed") >= 1, r.stderr)
    assert.equal(1, count(r.stderr, "list continue token expired (410)"), r.stderr)
  end)

  it("is clean on a run that fails closed", function()
    srv:reset(fixture)
    srv:faults { { method = "PATCH", path = "/virtualmachines/node-00012$", status = { code = 403 } } }
    local r = memcheck(srv)
    assert.equal(1, r.code, r.stderr)
    assert.equal(1, count(r.stderr, "ERROR SUMMARY: 0 errors from 0 contexts"), r.stderr)
    assert.equal(1, count(r.stderr, "All heap blocks were freed -- no leaks are possible"), r.stderr)
    assert.equal("59", campaign.state(srv).version)
    assert.same({ "status" }, srv:fired())
  end)
end)
