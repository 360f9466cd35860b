-- A run's Kubernetes Events (events.k8s.io/v1) and the pod's termination
-- message: what `kubectl get events` and `kubectl describe pod` show an
-- operator (issue 26, item 4). On the fake and on the real API server.
local events = require "cozy.runner.events"
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local lease = require "cozy.runner.lease"
local rbac = require "cozy.rbac"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local EVENTS = "/apis/events.k8s.io/v1/namespaces/cozy-system/events"
local MICROTIME = "^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%d%d%d%dZ$"

-- What `kubectl get events -n cozy-system --field-selector regarding.kind=KIND`
-- lists, oldest first: the Events of the server, as it stores them.
local function events_of(srv, kind)
  local res = srv:request("GET", EVENTS)
  assert.equal(200, res.status, res.body)
  local out = {}
  for _, e in ipairs(res.json.items) do
    if e.regarding.kind == kind then out[#out + 1] = e end
  end
  table.sort(out, function(a, b) return a.eventTime < b.eventTime end)
  return out
end

local function reasons(list)
  local out = {}
  for _, e in ipairs(list) do out[#out + 1] = e.reason end
  return out
end

local function event_posts(srv)
  return srv:requests{ method = "POST", path = "events%.k8s%.io" }
end

describe("a run's Events and termination message", function()
  local srv, dir
  setup(function()
    srv = fake.start{ fixtures = { cli.fixture(1) } }
    dir = cli.tmpdir()
  end)
  teardown(function()
    srv:stop()
    files.rm_rf(dir)
  end)

  -- the kubelet creates the file before the container starts
  local function termination_log()
    local path = dir .. "/termination-log"
    files.write(path, "")
    return path
  end

  it("records each step started and done on the ConfigMap and the pod, and the summary as the termination message",
    function()
      srv:reset(cli.fixture(1))
      local path = termination_log()
      local r = cli.run(cli.args(srv, "two", "run"), { POD_NAME = "migrate-job-abc",
        COZY_MIGRATE_TERMINATION_LOG = path })
      assert.equal(0, r.code, r.stderr)
      local _, cm = cli.version(srv)
      local on_cm = events_of(srv, "ConfigMap")
      assert.same({ "StepStarted", "StepSucceeded", "StepStarted", "StepSucceeded" }, reasons(on_cm))
      for _, e in ipairs(on_cm) do
        assert.same({ apiVersion = "v1", kind = "ConfigMap", name = "cozystack-version", namespace = "cozy-system",
          uid = cm.metadata.uid }, e.regarding)
        assert.equal("cozystack.io/cozy-migrate", e.reportingController)
        assert.equal("migrate-job-abc", e.reportingInstance)
        assert.equal("Migrate", e.action)
        assert.equal("Normal", e.type)
        assert.matches(MICROTIME, e.eventTime)
        assert.matches("^cozystack%-version%.%x+$", e.metadata.name)
      end
      assert.equal("migration 1-first started: version 1 to 2 (lua), runner migrate-job-abc", on_cm[1].note)
      assert.matches("^migration 2%-second done in [%d.]+s: version stamped 3$", on_cm[4].note)
      local on_pod = events_of(srv, "Pod")
      assert.same(reasons(on_cm), reasons(on_pod))
      for _, e in ipairs(on_pod) do
        assert.same({ apiVersion = "v1", kind = "Pod", name = "migrate-job-abc", namespace = "cozy-system" },
          e.regarding)
        assert.matches("^migrate%-job%-abc%.%x+$", e.metadata.name)
      end
      assert.matches("^done: version 3, target 3, 2 step%(s%), %d+ write%(s%), [%d.]+s$", files.read(path))
      if srv.real then
        -- docs/operations.md's commands, by kubectl itself (the fake has no
        -- field selectors on Events)
        local k = srv:kubectl("-n", "cozy-system", "get", "events", "--field-selector",
          "involvedObject.name=cozystack-version,reason=StepSucceeded", "-o", "name")
        assert.is_true(k.ok, k.stderr)
        assert.equal(2, select(2, k.stdout:gsub("\n", "")), k.stdout)
        k = srv:kubectl("-n", "cozy-system", "get", "events.events.k8s.io", "--field-selector",
          "regarding.kind=Pod,regarding.name=migrate-job-abc", "-o", "name")
        assert.is_true(k.ok, k.stderr)
        assert.equal(4, select(2, k.stdout:gsub("\n", "")), k.stdout)
      end
    end)

  it("records a failed step with its cause as a Warning, and the failure as the termination message", function()
    srv:reset(cli.fixture(1))
    local path = termination_log()
    local r = cli.run(cli.args(srv, "fail", "run"), { COZY_MIGRATE_TERMINATION_LOG = path })
    assert.equal(1, r.code, r.stderr)
    local on_cm = events_of(srv, "ConfigMap")
    assert.same({ "StepStarted", "StepSucceeded", "StepStarted", "StepFailed" }, reasons(on_cm))
    assert.equal("Warning", on_cm[4].type)
    assert.matches("migration 2-fails failed: ", on_cm[4].note, 1, true)
    assert.matches("step 2 refuses to continue", on_cm[4].note, 1, true)
    -- no POD_NAME: nothing but the ConfigMap's
    assert.same({}, events_of(srv, "Pod"))
    local message = files.read(path)
    assert.matches("^failed %(exit 1%): migration 2%-fails failed: ", message)
    assert.matches("step 2 refuses to continue", message, 1, true)
    assert.is_nil(message:find("\n", 1, true))
  end)

  it("records the wait for a live foreign lock, and the takeover of an expired one", function()
    srv:reset(cli.fixture(1, { cli.lease_object("other-runner", lease.microtime(sys.time()), 3600) }))
    local r = cli.run(cli.args(srv, "two", "run", "--lock-timeout", "1"))
    assert.equal(3, r.code, r.stderr)
    local waited = events_of(srv, "ConfigMap")
    assert.same({ "LockWaiting" }, reasons(waited))
    assert.equal("Lock", waited[1].action)
    assert.matches("held by other-runner", waited[1].note, 1, true)

    srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
    r = cli.run(cli.args(srv, "two", "run", "--lock-timeout", "5"))
    assert.equal(0, r.code, r.stderr)
    -- a dead holder's Lease is taken once it stayed unchanged for its duration: a wait first
    local taken = events_of(srv, "ConfigMap")
    assert.same({ "LockWaiting", "LockTakenOver" }, { taken[1].reason, taken[2].reason })
    assert.equal("Warning", taken[2].type)
    assert.matches("from dead-runner, whose lease did not change for ", taken[2].note, 1, true)
  end)

  it("records the lock's Events for a stamp by hand too", function()
    srv:reset(cli.fixture(1, { cli.lease_object("other-runner", lease.microtime(sys.time()), 3600) }))
    local r = cli.run(cli.args(srv, "two", "stamp", "3", "--reason", "repaired by hand", "--lock-timeout", "1"))
    assert.equal(3, r.code, r.stderr)
    local waited = events_of(srv, "ConfigMap")
    assert.same({ "LockWaiting" }, reasons(waited))
    assert.matches("held by other-runner", waited[1].note, 1, true)

    srv:reset(cli.fixture(1, { cli.lease_object("dead-runner", "2020-01-01T00:00:00.000000Z", 1) }))
    r = cli.run(cli.args(srv, "two", "stamp", "3", "--reason", "repaired by hand", "--lock-timeout", "5"),
      { POD_NAME = "stamp-job-abc" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
    for _, kind in ipairs({ "ConfigMap", "Pod" }) do
      local taken = events_of(srv, kind)
      assert.same({ "LockWaiting", "LockTakenOver" }, reasons(taken), kind)
      assert.equal("Warning", taken[2].type)
      assert.matches("from dead-runner", taken[2].note, 1, true)
    end
  end)

  it("goes on when the server refuses Events (403), trying no further Event after it #fakeonly", function()
    srv:reset(cli.fixture(1))
    srv:faults{ { method = "POST", path = "events\\.k8s\\.io", times = -1, status = 403 } }
    local path = termination_log()
    local r = cli.run(cli.args(srv, "two", "run"), { POD_NAME = "migrate-job-abc",
      COZY_MIGRATE_TERMINATION_LOG = path })
    assert.equal(0, r.code, r.stderr)
    assert.same({ "status" }, srv:fired())
    assert.equal(1, #event_posts(srv))
    assert.equal(3, cli.version(srv))
    local _, warned = r.stderr:gsub("could not write a Kubernetes Event", "")
    assert.equal(1, warned, r.stderr)
    assert.matches("code=403", r.stderr, 1, true)
    assert.matches("^done: version 3", files.read(path))
  end)

  it("goes on when its identity may not create Events, trying no further Event after the refusal", function()
    srv:reset(cli.fixture(1))
    -- the engine's own permissions but the Events', and the fixture's
    local rules = { { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" },
      { verb = "create", group = "", resource = "configmaps", namespace = "cozy-system" },
      { verb = "patch", group = "", resource = "configmaps", namespace = "cozy-system" } }
    for _, p in ipairs(rbac.engine_permissions(false)) do
      if not p.best_effort then
        rules[#rules + 1] = { verb = p.verb, group = p.group, resource = p.resource, name = p.name,
          namespace = "cozy-system" }
      end
    end
    local who = cli.restricted(srv, "cozy-system", "no-events", rules)
    finally(function() if not srv.real then srv:allow(nil) end end)
    srv:clear_requests()
    local r = cli.run(cli.with_kubeconfig(cli.args(srv, "two", "run"), who.kubeconfig),
      { POD_NAME = "migrate-job-abc" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
    local posts = event_posts(srv)
    assert.equal(1, #posts)
    assert.equal(403, posts[1].status)
    assert.matches("could not write a Kubernetes Event", r.stderr, 1, true)
    if not srv.real then srv:allow(nil) end -- the spec's own list is allowed again
    assert.same({}, events_of(srv, "ConfigMap"))
  end)

  it("has check warn, not block, when the identity may not create Events", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", {}) }))
    local ns = "cozy-system"
    -- everything check asks about but the Events' create (as runner/status_spec's checker)
    local checker = cli.restricted(srv, ns, "no-events-checker", {
      { verb = "get", group = "", resource = "configmaps" },
      { verb = "list", group = "", resource = "configmaps" },
      { verb = "create", group = "", resource = "configmaps", namespace = ns },
      { verb = "patch", group = "", resource = "configmaps", namespace = ns },
      { verb = "get", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "create", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "patch", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "patch", group = "apps", resource = "deployments" },
    })
    finally(function() if not srv.real then srv:allow(nil) end end)
    local r = cli.run(cli.with_kubeconfig(cli.args(srv, "checks", "check"), checker.kubeconfig))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("DENIED%s+create events.events.k8s.io in cozy%-system", r.stdout)
    assert.matches("[WARN] engine: not allowed: create events.events.k8s.io in namespace cozy-system", r.stdout, 1, true)
    assert.matches(": the run goes on without it", r.stdout, 1, true)
    assert.matches("2 finding(s): 0 block, 1 warn, 1 info", r.stdout, 1, true)
  end)

  it("leaves check's verdict as the termination message: passed, or blocked with the first blocking finding", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", { warn = "1" }) }))
    local path = termination_log()
    local r = cli.run(cli.args(srv, "checks", "check"), { COZY_MIGRATE_TERMINATION_LOG = path })
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal("check passed; 2 finding(s): 0 block, 1 warn, 1 info", files.read(path))

    srv:reset(cli.fixture(1, { cli.configmap("runner-test", { block = "yes" }) }))
    path = termination_log()
    r = cli.run(cli.args(srv, "checks", "check"), { COZY_MIGRATE_TERMINATION_LOG = path })
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.equal("check blocked: 1-inspect: runner-test asks to block; 2 finding(s): 1 block, 0 warn, 1 info",
      files.read(path))
    assert.same({}, event_posts(srv))
  end)

  it("writes no Event in a plan, a dry run or check, and no termination message where the file is absent", function()
    srv:reset(cli.fixture(1))
    local absent = dir .. "/no-termination-log"
    for _, args in ipairs { { "two", "plan" }, { "two", "run", "--dry-run" }, { "checks", "check" } } do
      local r = cli.run(cli.args(srv, table.unpack(args)), { POD_NAME = "migrate-job-abc",
        COZY_MIGRATE_TERMINATION_LOG = absent })
      assert.equal(0, r.code, r.stdout .. r.stderr)
    end
    assert.same({}, event_posts(srv))
    assert.is_nil(files.read(absent))
  end)

  it("keeps a note within kube-apiserver's 1024 bytes, cut at a character boundary", function()
    local rec = events.recorder { namespace = "cozy-system", configmap = "cozystack-version", identity = "x" }
    local e = rec:object(rec.configmap, "StepFailed", "Migrate", ("é"):rep(2000), sys.time())
    assert.equal(1024, #e.note)
    assert.truthy(utf8.len(e.note))
    assert.equal("Warning", e.type)
    local other = rec:object(rec.configmap, "StepFailed", "Migrate", "n", sys.time())
    assert.are_not.equal(e.metadata.name, other.metadata.name)
  end)
end)
