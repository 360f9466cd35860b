-- The Lease lock: a live foreign lease (wait, then exit 3), an expired one
-- (taken over), two runners at once, a lost lease, SIGTERM.
local fake = require("spec.helpers").server
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/cozystack-migrations"

local function set_holder(srv, holder)
  local res = srv:request("PATCH", LEASE_PATH, { content_type = "application/merge-patch+json",
    body = { spec = { holderIdentity = holder, renewTime = lease.microtime(sys.time()), leaseDurationSeconds = 3600 } } })
  assert.equal(200, res.status, res.body)
end

-- Waits until the slow migration has written (it is then under the lock).
local function wait_slow(srv, p)
  assert.truthy(cli.poll(20, function()
    local t = srv:object("ConfigMap", "cozy-system", "runner-test")
    return t and t.data and t.data.i
  end), "the slow migration did not start: " .. p:stderr())
end

-- Waits for a run whose lease "thief" took: it exits 1 with "lock lost",
-- unstamped, the thief holding the lease and the slow migration cut short.
-- Returns the run's result.
local function stopped_by_theft(srv, p)
  local r = p:wait(20)
  assert.equal(1, r.code, r.stderr)
  assert.matches("lock lost", r.stderr)
  assert.equal(1, cli.version(srv))
  assert.equal("thief", cli.get_lease(srv).spec.holderIdentity)
  assert.is_true(tonumber(srv:object("ConfigMap", "cozy-system", "runner-test").data.i) < 20000)
  return r
end

-- Is this request-log entry one of the runner's (not the spec's own)?
local function ours(e)
  return (e.user_agent or ""):match("^cozy%-migrate") ~= nil
end

-- A run's Kubernetes Event (runner/events.lua): a report, written without
-- the lock (a wait, a lost lock), never the state the lock protects.
local function is_event(e)
  return e.method == "POST" and e.path:match("^/apis/events%.k8s%.io/") ~= nil
end

-- The writes of the state the lock protects: every write but the Events,
-- and the reasons of those Events.
local function state_writes(srv)
  local out, reasons = {}, {}
  for _, e in ipairs(cli.writes(srv)) do
    if is_event(e) then reasons[#reasons + 1] = fake.json.decode(e.body).reason else out[#out + 1] = e end
  end
  return out, reasons
end

describe("runner lock", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  it("waits for a live foreign lease, then exits 3 within the timeout without a write", function()
    srv:reset(cli.fixture(1, { cli.lease_object("other-runner", lease.microtime(sys.time()), 3600) }))
    srv:clear_requests()
    local t0 = sys.monotime()
    local r = cli.run(cli.args(srv, "two", "run", "--lock-timeout", "1"))
    local took = sys.monotime() - t0
    assert.equal(3, r.code, r.stderr)
    assert.matches("held by other%-runner", r.stderr)
    assert.is_true(took >= 1, "gave up before its --lock-timeout of 1 s: " .. took .. "s")
    local writes, reasons = state_writes(srv)
    assert.same({}, writes)
    assert.same({ "LockWaiting" }, reasons)
    assert.equal(1, cli.version(srv))
  end)

  it("goes on when the foreign holder releases within the timeout", function()
    srv:reset(cli.fixture(1, { cli.lease_object("other-runner", lease.microtime(sys.time()), 3600) }))
    local p = cli.start(cli.args(srv, "two", "run", "--lock-timeout", "60"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("waiting for the lock", 1, true) end))
    assert.equal(1, cli.version(srv))
    set_holder(srv, "")
    local r = p:wait(30)
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
  end)

  it("takes over an expired lease and logs it", function()
    srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
    local r = cli.run(cli.args(srv, "two", "run", "--lock-timeout", "5"), { POD_NAME = "migrate-job-abc" })
    assert.equal(0, r.code, r.stderr)
    assert.matches("lock taken over from an expired holder", r.stderr)
    assert.matches("previous=dead%-runner", r.stderr)
    assert.equal(3, cli.version(srv))
    local l = cli.get_lease(srv)
    assert.equal("", l.spec.holderIdentity)         -- released at the end
    assert.equal(1, l.spec.leaseTransitions)
    local h = cli.history(select(2, cli.version(srv)))
    assert.equal("migrate-job-abc", h[1].runner)    -- identity: $POD_NAME
  end)

  it("runs each step exactly once with two runners started at the same moment (10 times)", function()
    for round = 1, 10 do
      srv:reset(cli.fixture(1))
      -- both released at once from a gate (started one after the other, the
      -- second could find the first done, which is no race at all)
      local gate = os.tmpname()
      os.remove(gate)
      local a = cli.start(cli.args(srv, "counter", "run"), nil, { gate = gate })
      local b = cli.start(cli.args(srv, "counter", "run"), nil, { gate = gate })
      cli.open_gate(gate)
      local ra, rb = a:wait(60), b:wait(60)
      os.remove(gate)
      a:cleanup(); b:cleanup()
      assert.equal(0, ra.code, "round " .. round .. ": " .. ra.stderr)
      assert.equal(0, rb.code, "round " .. round .. ": " .. rb.stderr)
      local counter = srv:object("ConfigMap", "cozy-system", "runner-counter")
      assert.equal("1", counter.data.count, "round " .. round)
      assert.equal(2, cli.version(srv))
      assert.equal(1, #cli.history(select(2, cli.version(srv))))
    end
  end)

  it("stops when another holder takes the lease", function()
    srv:reset(cli.fixture(1))
    local p = cli.start(cli.args(srv, "slow", "run"), { COZY_MIGRATE_LEASE_SECONDS = "3" })
    finally(function() p:cleanup() end)
    wait_slow(srv, p)
    set_holder(srv, "thief")
    local r = stopped_by_theft(srv, p)
    -- the theft, then the runner's renewal that found it: its test of the
    -- holder failed (422), the loss noticed
    local log = srv:requests()
    local theft, noticed
    for n, e in ipairs(log) do
      if not theft and e.method == "PATCH" and e.path == LEASE_PATH and not ours(e) then theft = n end
      if theft and not noticed and n > theft and ours(e) and e.method == "PATCH" and e.path == LEASE_PATH then
        noticed = n
      end
    end
    assert.truthy(theft, "the theft is not in the request log")
    assert.truthy(noticed, "no renewal after the theft")
    assert.equal(422, log[noticed].status)
    local renewal = fake.json.decode(log[noticed].body)
    assert.same({ op = "test", path = "/spec/holderIdentity" }, { op = renewal[1].op, path = renewal[1].path })
    assert.equal(r.stderr:match("lock acquired holder=(%S+)"), renewal[1].value)
    -- after the theft the runner wrote nothing but the migration's own
    -- object (the writes in flight before it learnt of the loss: how many
    -- is bounded on the fake alone, whose faults can hold them, below) and
    -- its renewal, testing that it is still the holder, refused; once it
    -- knew, not even a release (it would only be refused): no stamp, and the
    -- thief keeps the lease
    for n = theft + 1, #log do
      local e = log[n]
      if ours(e) and e.method ~= "GET" and not is_event(e) then
        if e.path == LEASE_PATH then
          assert.equal(noticed, n, "a lease write after the renewal that found the theft")
        else
          assert.equal("PATCH /api/v1/namespaces/cozy-system/configmaps/runner-test", e.method .. " " .. e.path)
        end
      end
    end
  end)

  it("stops before the next write when the lease is lost #fakeonly", function()
    srv:reset(cli.fixture(1))
    local p = cli.start(cli.args(srv, "slow", "run"), { COZY_MIGRATE_LEASE_SECONDS = "3" })
    finally(function() p:cleanup(); srv:clear_faults() end)
    assert.truthy(cli.poll(20, function()
      local t = srv:object("ConfigMap", "cozy-system", "runner-test")
      return t and t.data and t.data.i
    end), "the slow migration did not start: " .. p:stderr())
    -- Hold each of the migration's writes for 1 s from now on (an attempt
    -- under a 3 s lease may take 1.5 s at most), so that the
    -- renewal that finds the lease stolen (due within 1 s: every duration/3)
    -- comes while at most one write is in flight, and the runner has learnt
    -- of the loss before it could send another: what follows the renewal in
    -- the log is then exactly what the runner did knowing the lease was lost.
    srv:faults { { method = "PATCH", path = "configmaps/runner-test$", times = -1, delay_ms = 1000 } }
    set_holder(srv, "thief")
    stopped_by_theft(srv, p)
    -- from the request log: the theft, then the runner's renewal that found it ...
    local log = srv:requests()
    local theft, noticed
    for n, e in ipairs(log) do
      local mine = ours(e)
      if not theft and e.method == "PATCH" and e.path == LEASE_PATH and not mine then theft = n end
      if theft and not noticed and n > theft and mine and e.method == "PATCH" and e.path == LEASE_PATH then
        noticed = n
      end
    end
    assert.truthy(theft, "the theft is not in the request log")
    assert.truthy(noticed, "no renewal after the theft")
    assert.equal(422, log[noticed].status)   -- its test of holderIdentity failed: the loss, noticed
    local renewal = fake.json.decode(log[noticed].body)
    assert.same({ op = "test", path = "/spec/holderIdentity" }, { op = renewal[1].op, path = renewal[1].path })
    local identity = renewal[1].value
    -- ... and after it, no write: the migration's writes stop, and the only
    -- request that could change anything is the release, which tests that the
    -- lease is still ours first and is refused (the thief keeps it)
    local writes_after = {}
    for n = noticed + 1, #log do
      local e = log[n]
      if e.method ~= "GET" and (e.user_agent or ""):match("^cozy%-migrate") and not is_event(e) then
        writes_after[#writes_after + 1] = e
      end
    end
    assert.is_true(#writes_after <= 1, #writes_after .. " writes after the loss was noticed")
    for _, e in ipairs(writes_after) do
      assert.equal("PATCH " .. LEASE_PATH, e.method .. " " .. e.path)
      assert.same({ op = "test", path = "/spec/holderIdentity", value = identity }, fake.json.decode(e.body)[1])
      assert.equal(422, e.status)
    end
    -- the migration's writes were held as planned: the fault fired on each one sent after the rule
    local held = srv:fired { method = "PATCH", path = "runner%-test$" }
    assert.is_true(#held >= 1, "no write of the migration met the delay")
    for _, action in ipairs(held) do assert.equal("delay", action) end
  end)

  it("stops when it may no longer renew the lease", function()
    srv:reset(cli.fixture(1))
    -- the runner as an identity that may do what the run needs (RBAC on a
    -- real server, allow rules on the fake), then no longer patch the lease
    local ns = "cozy-system"
    local needs = {
      { verb = "get", group = "", resource = "configmaps", namespace = ns },
      { verb = "create", group = "", resource = "configmaps", namespace = ns },
      { verb = "patch", group = "", resource = "configmaps", namespace = ns },
      { verb = "get", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "create", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "update", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "patch", group = "coordination.k8s.io", resource = "leases", namespace = ns },
    }
    local runner = cli.restricted(srv, ns, "runner", needs)
    local p = cli.start(cli.with_kubeconfig(cli.args(srv, "slow", "run"), runner.kubeconfig),
      { COZY_MIGRATE_LEASE_SECONDS = "3" })
    finally(function() p:cleanup() end)
    wait_slow(srv, p)
    local revoked = {}
    for _, rule in ipairs(needs) do
      if not (rule.resource == "leases" and rule.verb == "patch") then revoked[#revoked + 1] = rule end
    end
    -- from the revocation on: grant returns once the authorizer refuses, and
    -- a renewal due while it waits for that may still be allowed
    local from = #srv:requests()
    runner.grant(revoked)
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("lock lost: not renewed for", r.stderr)
    assert.equal(1, cli.version(srv))
    -- the renewals were refused, and nothing else stopped the run: no other
    -- request of the runner failed (its writes wait for a renewal that is
    -- due, so after the refused one it may send none)
    local log = srv:requests()
    local refused = 0
    for n = from + 1, #log do
      local e = log[n]
      if ours(e) and e.method == "PATCH" and e.path == LEASE_PATH then
        -- allowed until the authorizer took up the revocation, refused after
        if refused > 0 or e.status ~= 200 then
          assert.equal(403, e.status)
          refused = refused + 1
        end
      elseif ours(e) then
        assert.equal(e.method .. " " .. e.path .. " 200", e.method .. " " .. e.path .. " " .. tostring(e.status))
      end
    end
    -- (one or two: the run stops once two thirds of the lease passed since
    -- the last renewal, which came up to a renewal interval before the
    -- revocation)
    assert.is_true(refused >= 1, "no renewal was refused")
    -- a lost lock is not released (the release would be refused too): the
    -- lease still names the runner, to expire
    local holder = r.stderr:match("lock acquired holder=(%S+)")
    assert.is_string(holder, r.stderr)
    assert.equal(holder, cli.get_lease(srv).spec.holderIdentity)
  end)

  it("stops before the next write when the lease cannot be renewed #fakeonly", function()
    srv:reset(cli.fixture(1))
    local p = cli.start(cli.args(srv, "slow", "run"), { COZY_MIGRATE_LEASE_SECONDS = "3" })
    finally(function() p:cleanup(); srv:clear_faults() end)
    assert.truthy(cli.poll(20, function()
      local t = srv:object("ConfigMap", "cozy-system", "runner-test")
      return t and t.data and t.data.i
    end), "the slow migration did not start: " .. p:stderr())
    -- every renewal now fails (the server answers 503), the migration's writes still work
    srv:faults{ { method = "PATCH", path = "leases/cozystack-migrations", times = -1,
      status = { code = 503 } } }
    local r = p:wait(30)
    assert.equal(1, r.code, r.stderr)
    assert.matches("lock lost: not renewed for", r.stderr)
    assert.equal(1, cli.version(srv))
    -- the renewals (and the release) met the 503s: nothing else stopped the run
    local fired = srv:fired { method = "PATCH", path = "leases/cozystack%-migrations$" }
    assert.is_true(#fired >= 2, #fired .. " renewals met the fault")
    for _, action in ipairs(fired) do assert.equal("status", action) end
  end)

  it("stops waiting for the lock on SIGTERM", function()
    srv:reset(cli.fixture(1, { cli.lease_object("other-runner", lease.microtime(sys.time()), 3600) }))
    local p = cli.start(cli.args(srv, "two", "run", "--lock-timeout", "60"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("waiting for the lock", 1, true) end))
    p:kill("TERM")
    local r = p:wait(10)
    assert.equal(1, r.code, r.stderr)
    assert.matches("interrupted while waiting for the lock", r.stderr)
    assert.equal(1, cli.version(srv))
  end)

  it("on SIGTERM stops at a safe point, releases the lock and exits non-zero", function()
    srv:reset(cli.fixture(1))
    local p = cli.start(cli.args(srv, "slow", "run"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function()
      local t = srv:object("ConfigMap", "cozy-system", "runner-test")
      return t and t.data and t.data.i
    end), "the slow migration did not start: " .. p:stderr())
    p:kill("TERM")
    local r = p:wait(20)
    assert.equal(1, r.code, r.stderr)
    assert.matches("stopped by signal 15", r.stderr)
    assert.matches("lock released", r.stderr)
    assert.equal("", cli.get_lease(srv).spec.holderIdentity)
    assert.equal(1, cli.version(srv))
  end)
end)
