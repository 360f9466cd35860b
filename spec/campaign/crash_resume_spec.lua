-- Crash-resume: kill -9 of a 1,000-VM run of migration 59 (built in) at 20
-- points chosen with a fixed seed (printed), then a rerun: the final state
-- is that of an uninterrupted run, and no VM got a volume or disk twice.
--
-- A point is one request of the uninterrupted run's main thread (lease
-- renewals come on a clock, so they are not points): the n-th request with
-- that method and path. A fault rule holds exactly that request unserved
-- (skip the first n-1, then a long delay and a dropped connection, so it is
-- never applied) and the runner is killed while it waits for the answer:
-- the server then holds what requests 1..k-1 did (and what other requests
-- of the same parallel batch of writes did), as after a kill at any moment
-- (the runner's memory dies with it, so "applied but not yet answered"
-- leaves the same state). No timing decides where it dies.
local campaign = require("spec.helpers").campaign

local FLEET = 1000
local SEED = 20261203
local POINTS = 20
local FAST = { "--qps", "1000", "--burst", "1000" }
-- The rerun is the Job's container restarted in the same pod (same
-- POD_NAME): it takes the dead runner's lock at once. Taking over an expired
-- lease from another identity is e2e/runner/kill_spec's and e2e/lease/lock_spec's.
local ENV = { POD_NAME = "cozy-migrate-job-x7k2p", COZY_MIGRATE_LEASE_SECONDS = "6" }

local function regex_escape(s)
  return (s:gsub("[^%w/]", "\\%0"))
end

describe("crash-resume: kill -9 of a " .. FLEET .. "-VM run of migration 59", function()
  local dir, fixture, needs, srv

  setup(function()
    dir = campaign.tmpdir()
    fixture, needs = campaign.fleet(dir, FLEET)
    srv = campaign.server(fixture, dir, { tls = false })  -- TLS is not what this is about
  end)
  teardown(function()
    if srv then srv:stop() end
    campaign.rmdir(dir)
  end)

  it("reaches the state of an uninterrupted run after kills at " .. POINTS .. " points (seed " .. SEED .. ")", function()
    local r = campaign.runner.run(campaign.args(srv, table.unpack(FAST)), ENV)
    assert.equal(0, r.code, r.stderr)
    local reference = campaign.state(srv)
    assert.equal("60", reference.version)
    assert.same({ 59 }, reference.history)
    assert.same({}, campaign.duplicated(reference))
    campaign.assert_patched_once(srv, needs, "uninterrupted run")
    local points, seen = {}, {}
    for _, e in ipairs(srv:requests()) do
      local key = e.method .. " " .. e.path
      seen[key] = (seen[key] or 0) + 1
      if not e.path:find("/leases/", 1, true) then
        points[#points + 1] = { method = e.method, path = e.path, n = seen[key] }
      end
    end
    assert.is_true(#points > campaign.count(needs), #points .. " points")
    print(("crash_resume_spec: seed %d, %d candidate points"):format(SEED, #points))

    math.randomseed(SEED)
    local killed, mid_fleet = 0, 0
    for trial = 1, POINTS do
      local k = math.random(1, #points)
      local at = points[k]
      local where = ("seed %d trial %d: killed at request %d of %d, %s %s (#%d of that)"):format(
        SEED, trial, k, #points, at.method, at.path, at.n)
      print("crash_resume_spec: " .. where)
      srv:reset(fixture)
      srv:faults { { method = at.method, path = "^" .. regex_escape(at.path) .. "(\\?|$)", skip = at.n - 1,
        delay_ms = 60000, reset = true } }
      local p = campaign.runner.start(campaign.args(srv, table.unpack(FAST)), ENV)
      -- the rule's counter, not the whole request log: cheap to poll
      local reached = campaign.poll(60, function()
        if p:done() then return "exited" end
        if srv:control("GET", "/_fake/faults")[1].fired >= 1 then return "held" end
      end, 0.01)
      assert.equal("held", reached, where .. ": the point was not reached: " .. p:stderr())
      p:kill("KILL")
      local held
      for _, e in ipairs(srv:requests()) do
        if e.fault then held = e end
      end
      assert.equal(at.method .. " " .. at.path, held.method .. " " .. held.path, where)
      local first = p:wait(10)
      p:cleanup()
      assert.equal(128 + 9, first.code, where .. ": " .. first.stderr)
      killed = killed + 1
      -- the stamp has not moved: the last point is the stamp itself, held unapplied
      assert.equal("59", srv:object("ConfigMap", "cozy-system", "cozystack-version").data.version, where)
      local done = campaign.count(campaign.vm_patches(srv))
      if done > 0 and done < campaign.count(needs) then mid_fleet = mid_fleet + 1 end

      srv:clear_faults()
      local again = campaign.runner.run(campaign.args(srv, "--lock-timeout", "30", table.unpack(FAST)), ENV)
      assert.equal(0, again.code, where .. ": " .. again.stderr)
      local final = campaign.state(srv)
      assert.is_true(campaign.same(reference, final), where .. ": the rerun left another state")
      assert.same({}, campaign.duplicated(final), where)
      campaign.assert_patched_once(srv, needs, where)
    end
    assert.equal(POINTS, killed)
    print(("crash_resume_spec: %d of %d kills survived, %d of them in the middle of the VM patches")
      :format(killed, POINTS, mid_fleet))
  end)
end)
