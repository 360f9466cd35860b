-- `cozy-migrate stamp N --reason TEXT` (issue 26, item 5): a baseline or a
-- manual repair under the lock, a version never moved down without --force,
-- one history record of kind "manual" with who (the kube user from a
-- SelfSubjectReview, and POD_NAME) and why; `stamp --dry-run` shows it and
-- writes nothing. Runs on the real server too (its SelfSubjectReview).
local fake = require("spec.helpers").server
local json = require "cozy.json"
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local POD = { POD_NAME = "operator-shell-7f9c" }

-- Who the server says the kubeconfig's user is, asked by the spec itself.
local function kube_user(srv)
  local res = srv:request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    { body = { apiVersion = "authentication.k8s.io/v1", kind = "SelfSubjectReview" } })
  assert.equal(201, res.status, res.body)
  return json.decode(res.body).status.userInfo.username
end

local function stamp_writes(srv)
  local out = {}
  for _, w in ipairs(cli.writes(srv)) do
    if w.path:find("configmaps", 1, true) then out[#out + 1] = w.method .. " " .. w.path end
  end
  return out
end

describe("cozy-migrate stamp", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(nil) } } end)
  teardown(function() srv:stop() end)

  it("baselines a cluster without a ConfigMap, under the lock, with who and why", function()
    srv:reset(cli.fixture(nil))
    local user = kube_user(srv)
    local r = cli.run(cli.args(srv, "two", "stamp", "3", "--reason", "imported from the old installer"), POD)
    assert.equal(0, r.code, r.stderr)
    assert.matches("stamped: create cozy-system/cozystack-version at version 3 (baseline); recorded as manual, by "
      .. user, r.stdout, 1, true)
    assert.matches("lock acquired", r.stderr, 1, true)
    assert.matches("lock released", r.stderr, 1, true)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    assert.equal("true", cm.metadata.labels["platform.cozystack.io/no-delete"])
    local h = cli.history(cm)
    assert.equal(1, #h)
    assert.same({ "manual", 3, user, "operator-shell-7f9c", "imported from the old installer" },
      { h[1].kind, h[1].to, h[1].user, h[1].runner, h[1].reason })
    assert.is_nil(h[1].from)
    assert.is_string(h[1].started); assert.is_string(h[1].finished); assert.is_string(h[1].engine)
    assert.equal("", cli.lease_holder(srv))
    -- a run now has nothing to do
    r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("up to date", r.stderr, 1, true)
  end)

  it("records a manual repair of a failed step: the step is stamped done, status clears the failure", function()
    local extra = { cli.configmap("runner-test", { first = "done" }) }
    for i = 1, 6 do extra[#extra + 1] = cli.configmap("vm-" .. i, { broken = i == 5 and "gone" or nil }) end
    srv:reset(cli.fixture(2, extra))
    assert.equal(1, cli.run(cli.args(srv, "partial", "run")).code)
    local s = cli.run(cli.args(srv, "partial", "status"))
    assert.matches("last failure: 2-patches", s.stdout, 1, true)
    local r = cli.run(cli.args(srv, "partial", "stamp", "3", "--reason", "vm-5 repaired by hand"), POD)
    assert.equal(0, r.code, r.stderr)
    assert.matches("stamped: move cozy-system/cozystack-version from version 2 to 3", r.stdout, 1, true)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    local h = cli.history(cm)
    assert.same({ "failed", "manual" }, { h[1].result, h[2].kind })
    assert.same({ 2, 3, "vm-5 repaired by hand" }, { h[2].from, h[2].to, h[2].reason })
    s = cli.run(cli.args(srv, "partial", "status"))
    assert.equal(0, s.code, s.stderr)
    assert.not_matches("last failure", s.stdout, 1, true)
    assert.matches("2 %-> 3  manual stamp by [^\n]+ %(operator%-shell%-7f9c%): vm%-5 repaired by hand", s.stdout)
    local st = json.decode(cli.run(cli.args(srv, "partial", "status", "-o", "json")).stdout)
    assert.equal(json.null, st.last_failure)
    assert.equal("manual", st.history[2].kind)
  end)

  it("refuses to move the version down without --force, and records it with --force", function()
    srv:reset(cli.fixture(3))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "stamp", "2", "--reason", "redo step 2"), POD)
    assert.equal(1, r.code, r.stderr)
    assert.matches("refusing to move the version down from 3 to 2: a version never goes down by itself", r.stderr,
      1, true)
    assert.same({}, stamp_writes(srv))
    assert.equal(3, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
    r = cli.run(cli.args(srv, "two", "stamp", "2", "--reason", "redo step 2", "--force"), POD)
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(2, v)
    local h = cli.history(cm)
    assert.same({ "manual", 3, 2, true }, { h[1].kind, h[1].from, h[1].to, h[1].forced })
  end)

  it("shows what it would do with --dry-run and writes nothing", function()
    srv:reset(cli.fixture(2))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "stamp", "3", "--reason", "try", "--dry-run"), POD)
    assert.equal(0, r.code, r.stderr)
    assert.matches("stamp (dry run, nothing written): would move cozy-system/cozystack-version from version 2 to 3",
      r.stdout, 1, true)
    local rec = json.decode(r.stdout:match("record: ([^\n]+)"))
    assert.same({ "manual", 2, 3, "try" }, { rec.kind, rec.from, rec.to, rec.reason })
    assert.same({}, cli.writes(srv))
    assert.equal(2, cli.version(srv))
  end)

  it("waits for a live runner's lock and gives up with exit 3", function()
    srv:reset(cli.fixture(2, { { apiVersion = "coordination.k8s.io/v1", kind = "Lease",
      metadata = { name = "cozystack-migrations", namespace = "cozy-system" },
      spec = { holderIdentity = "job-pod-1", leaseDurationSeconds = 600, renewTime = lease.microtime(sys.time()) } } }))
    local r = cli.run(cli.args(srv, "two", "stamp", "3", "--reason", "x", "--lock-timeout", "1s"), POD)
    assert.equal(3, r.code, r.stderr)
    assert.matches("job-pod-1", r.stderr, 1, true)
    assert.equal(2, cli.version(srv))
  end)

  it("needs N and --reason (exit 2)", function()
    local r = cli.run(cli.args(srv, "two", "stamp", "3"))
    assert.equal(2, r.code)
    assert.matches("stamp needs --reason TEXT", r.stderr, 1, true)
    r = cli.run(cli.args(srv, "two", "stamp", "--reason", "x"))
    assert.equal(2, r.code)
    assert.matches("stamp needs the version: cozy-migrate stamp N --reason TEXT", r.stderr, 1, true)
    r = cli.run(cli.args(srv, "two", "stamp", "x3", "--reason", "x"))
    assert.equal(2, r.code)
    assert.matches('stamp expects a version, a non-negative integer, got "x3"', r.stderr, 1, true)
  end)
end)
