-- docs/operations.md, "The runbook", followed command by command for a
-- failed step, a lock held by a dead runner, a manual repair and a baseline:
-- what status shows, the command the runbook gives, and what it leaves.
-- Runs on the real server too.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local cli = require("spec.helpers").cli

local LEASE = "cozystack-migrations"

local function a_lease(holder, renewed_ago)
  return { apiVersion = "coordination.k8s.io/v1", kind = "Lease", metadata = { name = LEASE, namespace = "cozy-system" },
    spec = { holderIdentity = holder, leaseDurationSeconds = 30, renewTime = lease.microtime(sys.time() - renewed_ago) } }
end

-- "partial" at version 2: vm-1 .. vm-6, `broken` one of them
local function fleet(broken, extra)
  local objects = { cli.configmap("runner-test", { first = "done" }) }
  for i = 1, 6 do
    objects[#objects + 1] = cli.configmap("vm-" .. i, { broken = i == broken and "its disk is gone" or nil })
  end
  for _, o in ipairs(extra or {}) do objects[#objects + 1] = o end
  return cli.fixture(2, objects)
end

local function fix_vm(srv, name)
  local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/" .. name,
    { body = { data = { broken = json.null } }, content_type = "application/merge-patch+json" })
  assert.equal(200, res.status, res.body)
end

describe("the runbook (docs/operations.md)", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { fleet(nil) } } end)
  teardown(function() srv:stop() end)

  local function cozy(...) return cli.run(cli.args(srv, "partial", ...)) end

  it("a failed step: status names it, fix the cause, `run` resumes at it", function()
    srv:reset(fleet(5))
    assert.equal(1, cozy("run").code)
    local s = cozy("status")
    assert.matches("last failure: 2-patches (2 -> 3)", s.stdout, 1, true)
    assert.matches("vm-5 is broken: its disk is gone", s.stdout, 1, true)
    assert.matches("outcome: patched=4 total=6", s.stdout, 1, true)
    fix_vm(srv, "vm-5")
    local r = cozy("run")
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
    s = cozy("status")
    assert.matches("state:%s+up to date", s.stdout)
    assert.not_matches("last failure", s.stdout, 1, true)
  end)

  it("a lock held by a dead runner: status shows it expired, `run --lock-timeout 1m` takes it over", function()
    srv:reset(fleet(nil, { a_lease("cozystack-migration-hook-dead", 120) }))
    local s = cozy("status")
    assert.matches("lock:%s+held by cozystack%-migration%-hook%-dead %(renewed [^,]+, expired%)", s.stdout)
    local r = cli.run(cli.args(srv, "partial", "run", "--lock-timeout", "1m"), { POD_NAME = "hook-new" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
    assert.equal("hook-new", cli.history(select(2, cli.version(srv)))[1].runner)
    assert.equal("", cli.lease_holder(srv))
  end)

  it("a manual repair: the step's work done by hand, `stamp N+1 --reason`, then `run` goes on", function()
    srv:reset(fleet(5))
    assert.equal(1, cozy("run").code)
    -- the operator does by hand what step 2 does for the rest
    for _, name in ipairs({ "vm-5", "vm-6" }) do
      local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/" .. name,
        { body = { data = { patched = "by hand" } }, content_type = "application/merge-patch+json" })
      assert.equal(200, res.status, res.body)
    end
    local r = cozy("stamp", "3", "--reason", "vm-5 and vm-6 patched by hand")
    assert.equal(0, r.code, r.stderr)
    local s = cozy("status")
    assert.not_matches("last failure", s.stdout, 1, true)
    assert.matches("2 %-> 3  manual stamp by [^\n]+: vm%-5 and vm%-6 patched by hand", s.stdout)
    r = cozy("run")
    assert.equal(0, r.code, r.stderr)
    assert.matches("up to date", r.stderr, 1, true)
    assert.equal("its disk is gone", srv:object("ConfigMap", "cozy-system", "vm-5").data.broken)
  end)

  it("a baseline: the stamp is missing, `run` refuses, `stamp N --reason` restores it, `run` goes on", function()
    local objects = fleet(nil, { a_lease("", 3600) })
    table.remove(objects, 2) -- the version ConfigMap
    srv:reset(objects)
    local s = cozy("status")
    assert.matches("state:%s+stamp missing", s.stdout)
    local r = cozy("run")
    assert.equal(1, r.code, r.stderr)
    assert.matches("is missing", r.stderr, 1, true)
    assert.is_nil(cli.version(srv))
    r = cozy("stamp", "2", "--reason", "baseline: the stamp was deleted, the Job's logs say 2")
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
    r = cozy("run")
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    local h = cli.history(cm)
    assert.same({ "manual", "2-patches" }, { h[1].kind, h[2].name })
  end)
end)
