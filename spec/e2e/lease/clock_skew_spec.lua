-- The Lease under clock skew (issue 35, class 7): another holder's lease
-- is timed by when this runner saw its record change, on this runner's own
-- monotonic clock, as client-go's leader election does; never by the
-- holder's renewTime, which comes from the holder's clock. The other holder
-- here is the spec itself, renewing the Lease as a runner would, with its
-- clock set where each case needs it. Real Lease semantics: these run on the
-- real kube-apiserver too.
local fake = require("spec.helpers").server
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/cozystack-migrations"

-- The runner's writes of the state the lock protects: everything but its Events.
local function state_writes(srv)
  local out = {}
  for _, e in ipairs(cli.runner_requests(srv)) do
    if cli.is_write(e) and not tostring(e.path):match("^/apis/events%.k8s%.io/") then out[#out + 1] = e end
  end
  return out
end

-- The holder renews, its clock `offset` seconds off ours (offset() is asked
-- at each renewal), every half second until the run `p` has exited.
local function hold_while(srv, p, offset)
  local renewals = 0
  local done = cli.poll(30, function()
    local res = srv:request("PATCH", LEASE_PATH, { content_type = "application/merge-patch+json",
      body = { spec = { renewTime = lease.microtime(sys.time() + offset()) } } })
    assert.equal(200, res.status, res.body)
    renewals = renewals + 1
    return p:done()
  end, 0.5)
  assert.truthy(done, "the run did not exit: " .. p:stderr())
  return renewals
end

describe("the Lease under clock skew", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  it("waits for a live holder whose clock runs a minute behind ours, and writes nothing", function()
    -- renewing every half second, a 3 s lease, its renewTime a minute old by
    -- our clock: by timestamps it expired 57 s ago; it is alive all along
    srv:reset(cli.fixture(1, { cli.lease_object("behind", lease.microtime(sys.time() - 60), 3) }))
    local p = cli.start(cli.args(srv, "two", "run", "--lock-timeout", "6"))
    finally(function() p:cleanup() end)
    local renewals = hold_while(srv, p, function() return -60 end)
    local r = p:wait(5)
    assert.equal(3, r.code, r.stderr)
    assert.matches("lock cozy%-system/cozystack%-migrations is held by behind", r.stderr)
    assert.not_matches("taken over", r.stderr)
    assert.is_true(renewals >= 6, renewals .. " renewals")
    assert.same({}, state_writes(srv))
    assert.equal("behind", cli.get_lease(srv).spec.holderIdentity)
    assert.equal(1, cli.version(srv))
  end)

  it("keeps waiting when the live holder's clock is stepped back an hour while it renews", function()
    -- the holder's clock right at first (the runner waits, as on main), then
    -- set back an hour (an NTP step): its renewals go on, with older times
    srv:reset(cli.fixture(1, { cli.lease_object("stepped", lease.microtime(sys.time()), 3) }))
    local p = cli.start(cli.args(srv, "two", "run", "--lock-timeout", "6"))
    finally(function() p:cleanup() end)
    local stepped = false
    hold_while(srv, p, function()
      stepped = stepped or p:stderr():find("waiting for the lock", 1, true) ~= nil
      return stepped and -3600 or 0
    end)
    assert.is_true(stepped, "the runner never waited")
    local r = p:wait(5)
    assert.equal(3, r.code, r.stderr)
    assert.matches("is held by stepped", r.stderr)
    assert.same({}, state_writes(srv))
    assert.equal("stepped", cli.get_lease(srv).spec.holderIdentity)
  end)

  it("takes a Lease last renewed long ago by its holder's clock only after watching it unchanged for its duration", function()
    -- by timestamps this Lease expired years ago; the runner cannot tell a
    -- dead holder from one whose clock is behind until the record stays
    -- the same for a whole leaseDurationSeconds (2 s) of its own clock
    srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 2) }))
    local r = cli.run(cli.args(srv, "two", "run", "--lock-timeout", "30"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("waiting for the lock", r.stderr)
    assert.matches("lock taken over from an expired holder", r.stderr)
    local first_read = cli.runner_requests(srv, "GET", "/leases/cozystack%-migrations$")[1]
    local take = cli.runner_requests(srv, "PATCH", "/leases/cozystack%-migrations$")[1]
    assert.truthy(first_read and take)
    assert.is_true(take.at - first_read.at >= 2, ("taken %.2fs after it was first read"):format(take.at - first_read.at))
    assert.equal(3, cli.version(srv))
  end)
end)
