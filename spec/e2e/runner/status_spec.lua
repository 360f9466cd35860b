-- `status` and `check`: read-only reports, text and JSON.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

-- One API server for the file (a real one takes seconds to start); every
-- test resets it to its own fixture.
local srv
setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
teardown(function() if srv then srv:stop() end end)

describe("cozy-migrate status", function()

  it("shows version, target, pending, lock and history; writes nothing", function()
    srv:reset(cli.fixture(1))
    assert.equal(0, cli.run(cli.args(srv, "two", "run", "--target", "2")).code)
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "status"))
    assert.equal(0, r.code, r.stderr)
    assert.same({}, cli.writes(srv))
    assert.matches("version:%s+2\n", r.stdout)
    assert.matches("target:%s+3\n", r.stdout)
    assert.matches("lock:%s+free", r.stdout)
    assert.matches("pending:\n%s+2%s+2%-second", r.stdout)
    assert.matches("history:\n%s+1 %-> 2%s+1%-first", r.stdout)
    assert.not_matches("WARNING", r.stdout)

    local j = cli.run(cli.args(srv, "two", "status", "--output", "json"))
    assert.equal(0, j.code, j.stderr)
    local st = json.decode(j.stdout)
    assert.same({ 2, 3 }, { st.current, st.target })
    assert.equal(1, #st.pending)
    assert.equal("2-second", st.pending[1].name)
    assert.equal(1, #st.history)
    assert.equal("1-first", st.history[1].name)
    assert.equal(json.null, st.lock)
  end)

  it("warns when a shipped file's sha256 differs from the recorded one", function()
    srv:reset(cli.fixture(1))
    assert.equal(0, cli.run(cli.args(srv, "two", "run", "--target", "2")).code)
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    os.execute(("cp spec/fixtures/runner/two/*.lua %s/ && echo '-- edited' >> %s/1-first.lua"):format(dir, dir))
    local r = cli.run(cli.args(srv, dir, "status"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("1%-first.*WARNING: sha256 differs", r.stdout)
    assert.matches("warning: migration 1%-first: the shipped file's sha256", r.stdout)
    local st = json.decode(cli.run(cli.args(srv, dir, "status", "--output", "json")).stdout)
    assert.is_string(st.history[1].sha256_mismatch)
  end)

  it("shows the lock holder", function()
    srv:reset(cli.fixture(1, { { apiVersion = "coordination.k8s.io/v1", kind = "Lease",
      metadata = { name = "cozystack-migrations", namespace = "cozy-system" },
      spec = { holderIdentity = "job-pod-1", leaseDurationSeconds = 60, renewTime = lease.microtime(sys.time()) } } }))
    local r = cli.run(cli.args(srv, "two", "status"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("lock:%s+held by job%-pod%-1", r.stdout)
    local st = json.decode(cli.run(cli.args(srv, "two", "status", "--output", "json")).stdout)
    assert.same({ "job-pod-1", false }, { st.lock.holder, st.lock.expired })
  end)

  it("reports a fresh install", function()
    srv:reset(cli.fixture(nil))
    local r = cli.run(cli.args(srv, "two", "status", "--output", "json"))
    assert.equal(0, r.code, r.stderr)
    assert.equal(json.null, json.decode(r.stdout).current)
  end)
end)

describe("cozy-migrate check", function()

  it("passes with info findings and writes nothing", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", {}) }))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "checks", "check"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("api: reachable", r.stdout)
    assert.matches("allowed patch deployments.apps", r.stdout)
    assert.matches("%[INFO%] 1%-inspect: looked at runner%-test  present=true", r.stdout)
    assert.matches("1 finding%(s%): 0 block, 0 warn, 1 info", r.stdout)
    for _, w in ipairs(cli.writes(srv)) do error("unexpected write " .. w.method .. " " .. w.path) end
    local reviews = srv:requests{ method = "POST", path = "selfsubjectaccessreviews" }
    assert.equal(10, #reviews)   -- 7 for the engine (its Events' create included), 3 declared by the migration
  end)

  it("exits 1 when a finding blocks, and says which (JSON)", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", { block = "yes", warn = "yes" }) }))
    local r = cli.run(cli.args(srv, "checks", "check", "--output", "json"))
    assert.equal(1, r.code, r.stderr)
    local rep = json.decode(r.stdout)
    assert.is_true(rep.blocked)
    local sev = {}
    for _, f in ipairs(rep.findings) do sev[#sev + 1] = f.severity .. ":" .. f.migration end
    assert.same({ "info:1-inspect", "block:1-inspect", "warn:1-inspect" }, sev)
  end)

  it("blocks on a denied permission the migration declared", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", {}) }))
    -- an identity granted everything the check asks about but that one
    -- permission (RBAC on a real server, allow rules on the fake)
    local ns = "cozy-system"
    local checker = cli.restricted(srv, ns, "checker", {
      -- the migration's declarations name no namespace: cluster-wide
      { verb = "get", group = "", resource = "configmaps" },
      { verb = "list", group = "", resource = "configmaps" },
      { verb = "create", group = "", resource = "configmaps", namespace = ns },
      { verb = "patch", group = "", resource = "configmaps", namespace = ns },
      { verb = "get", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "create", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "patch", group = "coordination.k8s.io", resource = "leases", namespace = ns },
      { verb = "create", group = "events.k8s.io", resource = "events", namespace = ns },
    })
    local args = cli.with_kubeconfig(cli.args(srv, "checks", "check"), checker.kubeconfig)
    local r = cli.run(args)
    assert.equal(1, r.code, r.stdout)
    assert.matches("allowed patch configmaps", r.stdout)
    assert.matches("DENIED%s+patch deployments.apps", r.stdout)
    assert.equal(1, select(2, r.stdout:gsub("DENIED", "")), r.stdout) -- that one, and nothing else
    assert.matches("%[BLOCK%] 1%-inspect: not allowed: patch deployments.apps", r.stdout)
  end)

  it("blocks when the API is unreachable", function()
    local kubeconfig = os.tmpname()
    finally(function() os.remove(kubeconfig) end)
    local f = assert(io.open(kubeconfig, "w"))
    f:write([[
apiVersion: v1
kind: Config
clusters: [{name: x, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: x, user: {token: t}}]
contexts: [{name: x, context: {cluster: x, user: x}}]
current-context: x
]])
    f:close()
    local r = cli.run({ "check", "--kubeconfig", kubeconfig, "--no-builtin", "--migrations", "spec/fixtures/runner/checks",
      "--request-timeout", "2" })
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("UNREACHABLE", r.stdout)
  end)

  it("takes the client's rate limit from --qps and --burst", function()
    srv:reset(cli.fixture(1, { cli.configmap("runner-test", {}) }))
    local r = cli.run(cli.args(srv, "checks", "status", "-v", "--qps", "7.5", "--burst", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("connected .*burst=3", r.stderr)
    assert.matches("connected .*qps=7.5", r.stderr)
    r = cli.run(cli.args(srv, "checks", "status", "-v"))
    assert.matches("connected .*burst=2000", r.stderr) -- the documented defaults
    assert.matches("connected .*qps=1000", r.stderr)
    for _, bad in ipairs({ { "--qps", "0" }, { "--qps", "-1" }, { "--burst", "x" }, { "--qps", "nan" } }) do
      r = cli.run(cli.args(srv, "checks", "status", bad[1], bad[2]))
      assert.equal(2, r.code, table.concat(bad, " "))
      assert.matches("expects a positive number", r.stderr)
    end
  end)

  it("checks one migration with --migration N", function()
    srv:reset(cli.fixture(5, { cli.configmap("runner-test", { warn = "1" }) }))
    local r = cli.run(cli.args(srv, "checks", "check", "--migration", "1"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("%[WARN%] 1%-inspect", r.stdout)
    assert.equal(2, cli.run(cli.args(srv, "checks", "check", "--migration", "9")).code)
  end)
end)
