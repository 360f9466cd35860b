-- The Lease against a hostile or slow API server (issue 23, class 3; issue
-- 22's Lease 422 loop): the lock's validity counts from before the request
-- that took or renewed it was sent, never from its answer, and every refusal
-- of the Lease either backs off within --lock-timeout (exit 3) or fails at
-- once (exit 1), with a bounded number of requests. Fault rules: fake only.
local fake = require("spec.helpers").server
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local NS = "cozy-system"
local LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/cozystack-migrations"
local LEASE_RULE = "leases/cozystack-migrations$"
local LEASES_RULE = "namespaces/cozy-system/leases$"

-- The runner's writes of anything but the Lease and its Events (reports,
-- written without the lock: a wait for a Lease is one).
local function writes_besides_lease(srv)
  local out = {}
  for _, e in ipairs(cli.runner_requests(srv)) do
    if cli.is_write(e) and not tostring(e.path):match("/leases")
        and not tostring(e.path):match("^/apis/events%.k8s%.io/") then
      out[#out + 1] = e
    end
  end
  return out
end

-- A run of `set` under --lock-timeout `timeout`, in the background, bounded:
-- main's binary loops for ever on some of these refusals, so a run that does
-- not exit fails the spec rather than hanging it.
local function run_bounded(srv, set, timeout, env)
  local p = cli.start(cli.args(srv, set, "run", "--lock-timeout", tostring(timeout)), env)
  local ok, r = pcall(p.wait, p, 20)
  local sent = #srv:requests()
  p:cleanup()
  assert(ok, ("the run did not exit within 20s (%d requests so far): %s"):format(sent, tostring(r)))
  return r
end

describe("the Lease, hostile server #fakeonly", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  after_each(function() srv:clear_faults() end)

  describe("timing", function()
    it("writes nothing under a Lease whose create was answered after the lease ran out, "
      .. "and another runner took it", function()
      -- The issue's 18 s create under a 10 s lease, scaled to a 3 s lease:
      -- the create is held 1.8 leases, then stored with the renewTime of its
      -- sending. A second runner takes it over the moment it appears, as
      -- a runner does: a write guarded by its resourceVersion (a runner
      -- would first watch it unchanged for a duration; a takeover at any
      -- moment after the first third is the case the lock must survive).
      -- Our runner's re-read of the Lease is
      -- held 1.5 s, so that the takeover certainly comes first.
      local duration, delay = 3, 5.4
      srv:reset(cli.fixture(1))
      srv:faults {
        { method = "POST", path = LEASES_RULE, times = 1, delay_ms = math.floor(delay * 1000) },
        { method = "GET", path = LEASE_RULE, skip = 1, times = 1, delay_ms = 1500 },
      }
      local p = cli.start(cli.args(srv, "slow", "run", "--lock-timeout", "3"),
        { COZY_MIGRATE_LEASE_SECONDS = tostring(duration) })
      finally(function() p:cleanup() end)
      local created = cli.poll(20, function() return cli.get_lease(srv) end, 0.005)
      assert.truthy(created, "the Lease was never created: " .. p:stderr())
      -- stored already expired by its own renewTime
      assert.is_true(lease.remaining(created, sys.time()) < 0, "not expired: " .. created.spec.renewTime)
      local theft = srv:request("PATCH", LEASE_PATH, { content_type = "application/json-patch+json", body = {
        { op = "test", path = "/metadata/resourceVersion", value = created.metadata.resourceVersion },
        { op = "add", path = "/spec", value = { holderIdentity = "thief", leaseDurationSeconds = 3600,
          acquireTime = lease.microtime(sys.time()), renewTime = lease.microtime(sys.time()), leaseTransitions = 1 } },
      } })
      assert.equal(200, theft.status, theft.body)
      local r = p:wait(20)
      -- the answer came too late to write under: the runner took the lock
      -- again, found the thief's live lease, and gave up after its timeout
      assert.equal(3, r.code, r.stderr)
      assert.matches("lock answer came too late to count on", r.stderr)
      assert.matches("held by thief", r.stderr)
      assert.same({}, writes_besides_lease(srv))
      assert.is_nil(srv:object("ConfigMap", NS, "runner-test"))
      assert.equal(1, cli.version(srv))
      assert.equal("thief", cli.get_lease(srv).spec.holderIdentity)
      assert.same({ "delay", "delay" }, srv:fired { path = "leases" })
    end)

    it("sends no write that could land after its Lease, as the server stamped it, expires, "
      .. "when a renewal is answered late", function()
      -- A 6 s lease, renewed every 2 s. One renewal is held 1.8 s, then
      -- stored with the renewTime of its sending; every renewal after it is
      -- refused (503), so that renewal is the last: the server holds the lock
      -- for us until its renewTime + 6 s. Each write attempt under the lock
      -- may take half the lease (docs/transport.md, "The lock and retried
      -- writes"), so an attempt that arrives later than renewTime + 3 s may
      -- land when another runner may already have the lock.
      local duration = 6
      srv:reset(cli.fixture(1))
      local p = cli.start(cli.args(srv, "slow", "run"), { COZY_MIGRATE_LEASE_SECONDS = tostring(duration) })
      finally(function() p:cleanup() end)
      assert.truthy(cli.poll(20, function()
        local t = srv:object("ConfigMap", NS, "runner-test")
        return t and t.data and t.data.i
      end), "the slow migration did not start: " .. p:stderr())
      srv:faults {
        { method = "PATCH", path = LEASE_RULE, times = 1, delay_ms = 1800 },
        { method = "PATCH", path = LEASE_RULE, times = -1, status = { code = 503 } },
      }
      local r = p:wait(30)
      assert.equal(1, r.code, r.stderr)
      assert.matches("lock lost: not renewed for", r.stderr)
      assert.equal(1, cli.version(srv))
      local renewals = cli.runner_requests(srv, "PATCH", "/leases/")
      local late
      for _, e in ipairs(renewals) do
        if e.fault and e.fault.action == "delay" then late = e end
      end
      assert.truthy(late, "no renewal met the delay")
      assert.equal(200, late.status)
      local stamped
      for _, op in ipairs(fake.json.decode(late.body)) do
        if op.path == "/spec/renewTime" then stamped = lease.parse_time(op.value) end
      end
      assert.is_number(stamped)
      local after = 0
      for _, e in ipairs(cli.runner_requests(srv, "PATCH", "runner%-test$")) do
        if e.at > late.at then
          after = after + 1
          assert.is_true(e.at + duration / 2 <= stamped + duration,
            ("a write arrived %.2fs after the late renewal was stamped"):format(e.at - stamped))
        end
      end
      assert.is_true(after >= 1, "no write after the late renewal arrived: the case proves nothing")
      local refused = srv:fired { method = "PATCH", path = "leases" }
      assert.equal("delay", refused[1])
      assert.is_true(#refused >= 2 and refused[2] == "status", table.concat(refused, ","))
    end)

    it("refuses a renewal held past its timeout when it lands after a newer one", function()
      -- A 3 s lease, renewed every second, each renewal's timeout 1 s. One
      -- renewal is held 2 s: the runner gives up on it and sends the next at
      -- once, which lands first. The held one then lands with its older
      -- renewTime: guarded by the resourceVersion it was based on, it is
      -- refused, so the server never counts the lease from an older time
      -- than the runner does, and the run goes on.
      -- (the first step's first read is held 3.5 s, so that the run lasts
      -- past a few renewals; the first PATCH of the Lease is a renewal)
      srv:reset(cli.fixture(1))
      srv:faults {
        { method = "GET", path = "configmaps/runner-test$", times = 1, delay_ms = 3500 },
        { method = "PATCH", path = LEASE_RULE, times = 1, delay_ms = 2000 },
      }
      local p = cli.start(cli.args(srv, "two", "run"), { COZY_MIGRATE_LEASE_SECONDS = "3" })
      finally(function() p:cleanup() end)
      local r = p:wait(30)
      assert.equal(0, r.code, r.stderr)
      assert.equal(3, cli.version(srv))
      local held
      assert.truthy(cli.poll(10, function()
        for _, e in ipairs(cli.runner_requests(srv, "PATCH", "/leases/")) do
          if e.fault and e.fault.action == "delay" and type(e.status) == "number" and e.status ~= 0 then held = e end
        end
        return held
      end), "the held renewal was never answered")
      assert.equal(422, held.status)
      local newer = 0
      for _, e in ipairs(cli.runner_requests(srv, "PATCH", "/leases/")) do
        if e.at > held.at and e.at < held.at + 2 and e.status == 200 then newer = newer + 1 end
      end
      assert.is_true(newer >= 1, "no renewal landed while one was held")
      assert.same({ "delay", "delay" }, srv:fired())
    end)

    it("takes an expired Lease again when the takeover was answered too late, and writes only after", function()
      -- the takeover of a dead runner's Lease held 1.2 s under a 3 s lease:
      -- answered past the first third, it is not acted on; the runner takes
      -- the Lease again (now its own, guarded by its resourceVersion), and
      -- its first write follows that second take
      srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
      srv:faults { { method = "PATCH", path = LEASE_RULE, times = 1, delay_ms = 1200 } }
      local r = run_bounded(srv, "two", 10, { COZY_MIGRATE_LEASE_SECONDS = "3" })
      assert.equal(0, r.code, r.stderr)
      assert.matches("lock taken over from an expired holder", r.stderr)
      assert.matches("lock answer came too late to count on", r.stderr)
      assert.equal(3, cli.version(srv))
      local takes = cli.runner_requests(srv, "PATCH", "/leases/")
      assert.is_true(#takes >= 2, #takes .. " lease writes")
      assert.same({ action = "delay", rule = 0 }, takes[1].fault)
      assert.is_nil(takes[2].fault)
      local first = writes_besides_lease(srv)[1]
      assert.truthy(first, "no write")
      assert.is_true(first.at > takes[2].at, "a write before the second take")
      -- the second take is of the runner's own Lease: the same holder, no
      -- further transition
      local function spec_of(e)
        for _, op in ipairs(fake.json.decode(e.body)) do
          if op.path == "/spec" then return op.value end
        end
      end
      local one, two = spec_of(takes[1]), spec_of(takes[2])
      assert.equal(one.holderIdentity, two.holderIdentity)
      assert.same({ 1, 1 }, { one.leaseTransitions, two.leaseTransitions })
    end)

    it("gives up, releasing the Lease, when every take of it is answered too late", function()
      -- every write of the Lease held 1.2 s under a 3 s lease: each answer
      -- comes after the first third, when the first renewal was due; the
      -- runner takes the lock again and again until its timeout, then exits
      -- 3 without a write, and gives the Lease up (holder emptied)
      srv:reset(cli.fixture(1))
      srv:faults {
        { method = "POST", path = LEASES_RULE, times = -1, delay_ms = 1200 },
        { method = "PATCH", path = LEASE_RULE, times = -1, delay_ms = 1200 },
      }
      local r = run_bounded(srv, "two", 2, { COZY_MIGRATE_LEASE_SECONDS = "3" })
      assert.equal(3, r.code, r.stderr)
      assert.matches("could not take the lock cozy%-system/cozystack%-migrations within 2s: "
        .. "the server answered its last take after 1%.%ds, past a third of the 3s lease", r.stderr)
      assert.matches("lock answer came too late to count on", r.stderr)
      assert.matches("lock released", r.stderr)
      assert.same({}, writes_besides_lease(srv))
      assert.equal(1, cli.version(srv))
      assert.equal("", cli.get_lease(srv).spec.holderIdentity)
      -- the create, the takes again within the 2 s, the release: all held
      local takes = cli.runner_requests(srv, nil, "/leases")
      local writes = 0
      for _, e in ipairs(takes) do
        if e.method ~= "GET" then
          writes = writes + 1
          assert.same({ action = "delay", rule = e.method == "POST" and 0 or 1 }, e.fault)
        end
      end
      assert.is_true(writes >= 3 and writes <= 5, writes .. " writes of the Lease")
    end)
  end)

  describe("refusals", function()
    it("fails at once on a create refused with 422 (an admission policy's denial)", function()
      srv:reset(cli.fixture(1))
      srv:faults { { method = "POST", path = LEASES_RULE, times = -1, status = { code = 422,
        message = "leases.coordination.k8s.io \"cozystack-migrations\" is forbidden: "
          .. "ValidatingAdmissionPolicy 'no-leases' with binding 'no-leases' denied request: nope" } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(1, r.code, r.stderr)
      assert.matches("cannot take the lock cozy%-system/cozystack%-migrations %(not a conflict, so not retried%)", r.stderr)
      assert.matches("ValidatingAdmissionPolicy 'no%-leases'", r.stderr)
      assert.equal(1, #cli.runner_requests(srv, "POST", "/leases$"))
      assert.same({ "status" }, srv:fired { method = "POST" })
      assert.same({}, writes_besides_lease(srv))
    end)

    it("backs off on a create refused with 409, then exits 3 within the lock timeout", function()
      srv:reset(cli.fixture(1))
      srv:faults { { method = "POST", path = LEASES_RULE, times = -1, status = { code = 409 } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(3, r.code, r.stderr)
      assert.matches("could not take the lock cozy%-system/cozystack%-migrations within 2s: "
        .. "the server kept refusing it: POST [^\n]*Conflict %(409%)", r.stderr)
      assert.matches("lock write refused, backing off", r.stderr)
      -- the update engine's backoff (10 ms x3 per try, capped at 2 s, jitter
      -- 0.5) fits at most 8 tries into 2 s
      local posts = #cli.runner_requests(srv, "POST", "/leases$")
      assert.is_true(posts >= 2 and posts <= 8, posts .. " creates")
      for _, action in ipairs(srv:fired { method = "POST" }) do assert.equal("status", action) end
      assert.same({}, writes_besides_lease(srv))
    end)

    it("fails at once on a takeover answered 422 while the Lease did not move", function()
      -- issue 22: a 422 on the takeover's JSON patch is a conflict only when
      -- the re-read shows the Lease moved on (our resourceVersion test failed)
      srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
      srv:faults { { method = "PATCH", path = LEASE_RULE, times = -1, status = { code = 422 } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(1, r.code, r.stderr)
      assert.matches("cannot take the lock cozy%-system/cozystack%-migrations %(not a conflict, so not retried%)", r.stderr)
      assert.matches("Invalid %(422%)", r.stderr)
      assert.equal(1, #cli.runner_requests(srv, "PATCH", "/leases/"))
      assert.same({ "status" }, srv:fired { method = "PATCH" })
      assert.equal("dead-runner", cli.get_lease(srv).spec.holderIdentity)
    end)

    it("fails at once on a takeover refused with a 422 that names a field", function()
      srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
      srv:faults { { method = "PATCH", path = LEASE_RULE, times = -1, respond = { status = 422, body = {
        kind = "Status", apiVersion = "v1", status = "Failure", reason = "Invalid", code = 422,
        message = "Lease.coordination.k8s.io \"cozystack-migrations\" is invalid: spec.holderIdentity: Invalid value",
        details = { name = "cozystack-migrations", group = "coordination.k8s.io", kind = "Lease",
          causes = { { reason = "FieldValueInvalid", message = "Invalid value", field = "spec.holderIdentity" } } } } } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(1, r.code, r.stderr)
      assert.matches("not a conflict, so not retried%): [^\n]*spec%.holderIdentity: Invalid value", r.stderr)
      assert.equal(1, #cli.runner_requests(srv, "PATCH", "/leases/"))
      assert.same({ "respond" }, srv:fired { method = "PATCH" })
    end)

    it("backs off on a takeover answered 409, then exits 3 within the lock timeout", function()
      srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
      srv:faults { { method = "PATCH", path = LEASE_RULE, times = -1, status = { code = 409 } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(3, r.code, r.stderr)
      assert.matches("the server kept refusing it: PATCH [^\n]*Conflict %(409%)", r.stderr)
      assert.matches("lock write refused, backing off", r.stderr)
      local patches = #cli.runner_requests(srv, "PATCH", "/leases/")
      assert.is_true(patches >= 2 and patches <= 8, patches .. " takeovers")
      for _, action in ipairs(srv:fired { method = "PATCH" }) do assert.equal("status", action) end
      assert.equal("dead-runner", cli.get_lease(srv).spec.holderIdentity)
    end)

    it("fails at once on a create the runner may not make (403)", function()
      srv:reset(cli.fixture(1))
      srv:faults { { method = "POST", path = LEASES_RULE, times = -1, status = { code = 403 } } }
      local r = run_bounded(srv, "two", 2)
      assert.equal(1, r.code, r.stderr)
      assert.matches("Forbidden %(403%): cannot take the lock cozy%-system/cozystack%-migrations", r.stderr)
      assert.equal(1, #cli.runner_requests(srv, "POST", "/leases$"))
      assert.same({ "status" }, srv:fired { method = "POST" })
    end)
  end)
end)
