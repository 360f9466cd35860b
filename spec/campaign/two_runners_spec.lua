-- Two runners started together on the same cluster, 20 trials: migration 59
-- (built in) is applied exactly once. One stamp 59 -> 60 with one history
-- entry, every VM that needs the copy patched once by one of them, none
-- twice, the final objects those of a single run.
--
-- What the engine does with the one that loses the race for the Lease:
-- it waits for the lock (up to --lock-timeout), then decides again under
-- it, finds 60 and exits 0 with "up to date after taking the lock"; with
-- --lock-timeout 0 it gives up at once with exit 3. Odd trials wait, even
-- trials do not; each asserts exactly its outcome. The first stamp is held
-- (the fake's `await`) until both have read the Lease, so every trial is
-- two runners at once, however loaded the machine.
local campaign = require("spec.helpers").campaign

local FLEET = 200
local TRIALS = 20
local FAST = { "--qps", "1000", "--burst", "1000" }

local function lines_with(text, needle)
  local n = 0
  for line in text:gmatch("[^\n]+") do
    if line:find(needle, 1, true) then n = n + 1 end
  end
  return n
end

describe("two runners started together, " .. TRIALS .. " trials on a " .. FLEET .. "-VM fleet", function()
  local dir, fixture, needs, srv, reference

  setup(function()
    dir = campaign.tmpdir()
    fixture, needs = campaign.fleet(dir, FLEET)
    srv = campaign.server(fixture, dir, { tls = false })  -- TLS is not what this is about
    local r = campaign.runner.run(campaign.args(srv, table.unpack(FAST)), { POD_NAME = "runner-ref" })
    assert(r.code == 0, r.stderr)
    reference = campaign.state(srv)
  end)
  teardown(function()
    if srv then srv:stop() end
    campaign.rmdir(dir)
  end)

  it("apply each step exactly once", function()
    local waited, refused = 0, 0
    for trial = 1, TRIALS do
      local wait = trial % 2 == 1
      local where = ("trial %d (%s)"):format(trial, wait and "--lock-timeout 60" or "--lock-timeout 0")
      srv:reset(fixture)
      -- Started together is not enough on a loaded machine: one runner could
      -- still finish before the other has asked for anything, and the other
      -- then rightly finds nothing to do, which is not two runners at once. So
      -- the first stamp is held until both runners have read the Lease: the
      -- second always meets the first holding the lock.
      srv:faults { { method = "PATCH", path = "/configmaps/cozystack-version$", times = 1,
        await = { method = "GET", path = "/leases/cozystack-migrations$", count = 2, timeout_ms = 60000 } } }
      local timeout = wait and "60" or "0"
      -- both wait at a gate, opened once both are there: started one after
      -- the other, the second could come after the first had finished (and
      -- rightly find nothing to do), which is not two runners at once
      local gate = ("%s/gate-%d"):format(dir, trial)
      local procs = {}
      for i, name in ipairs({ "runner-a", "runner-b" }) do
        procs[i] = campaign.runner.start(campaign.args(srv, "--lock-timeout", timeout, table.unpack(FAST)),
          { POD_NAME = name }, { gate = gate })
      end
      campaign.runner.open_gate(gate)
      local res = {}
      for i, p in ipairs(procs) do
        res[i] = p:wait(120)
        p:cleanup()
      end

      -- one of them ran the step and stamped
      local winner, loser
      for i, r in ipairs(res) do
        if lines_with(r.stderr, "step done, stamped") == 1 then
          assert.is_nil(winner, where .. ": both runners stamped")
          winner = i
        end
      end
      assert.is_number(winner, where .. ": no runner stamped:\n" .. res[1].stderr .. "\n" .. res[2].stderr)
      loser = 3 - winner
      local w, l = res[winner], res[loser]
      assert.equal(0, w.code, where .. ": " .. w.stderr)
      assert.equal(0, lines_with(l.stderr, "step started"), where .. ": the other runner ran the step:\n" .. l.stderr)
      if wait then
        assert.equal(0, l.code, where .. ": " .. l.stderr)
        assert.equal(1, lines_with(l.stderr, "up to date after taking the lock"), where .. ":\n" .. l.stderr)
        waited = waited + 1
      else
        assert.equal(3, l.code, where .. ": " .. l.stderr)
        assert.equal(1, lines_with(l.stderr, "is held by runner-"), where .. ":\n" .. l.stderr)
        refused = refused + 1
      end

      local held = srv:requests { method = "PATCH", path = "/configmaps/cozystack%-version$" }[1]
      assert.is_true(held.fault ~= nil and held.fault.awaited, where .. ": the stamp was not held until both read the Lease")
      local final = campaign.state(srv)
      assert.equal("60", final.version, where)
      assert.same({ 59 }, final.history, where)
      assert.is_true(campaign.same(reference, final), where .. ": another state than a single run's")
      assert.same({}, campaign.duplicated(final), where)
      campaign.assert_patched_once(srv, needs, where)
      -- a single stamp write landed
      local stamps = 0
      for _, e in ipairs(srv:requests { method = "PATCH" }) do
        if e.path:find("/configmaps/cozystack-version", 1, true) and e.status == 200 then stamps = stamps + 1 end
      end
      assert.equal(1, stamps, where)
      -- one GET (srv:object reads every object, which costs a real server
      -- a list of every resource)
      local lease = srv:request("GET", "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/cozystack-migrations")
      assert.equal(200, lease.status, where .. ": " .. lease.body)
      assert.equal("", lease.json.spec.holderIdentity, where .. ": the lock was not released")
    end
    print(("two_runners_spec: %d of %d trials applied the step once (%d waited and found it done, %d refused with exit 3)")
      :format(waited + refused, TRIALS, waited, refused))
  end)
end)
