-- Migration 52-linstor-scheduler-admission on the spec harness (spec/README.md): the old
-- linstor-scheduler-admission Deployment goes, every other object stays as it was.
local harness = require "spec.helpers"
local differential = harness.differential

local NS, NAME = "cozy-linstor", "linstor-scheduler-admission"
local DEPLOY_PATH = "/apis/apps/v1/namespaces/cozy%-linstor/deployments/linstor%-scheduler%-admission$"

local function deployment(ns, name, selector)
  return { apiVersion = "apps/v1", kind = "Deployment", metadata = { name = name, namespace = ns },
    spec = { replicas = 1, selector = { matchLabels = selector },
      template = { metadata = { labels = selector },
        spec = { containers = { { name = "webhook", image = "registry.example/linstor-scheduler:0.2.0" } } } } } }
end

local NAMESPACES = { differential.namespace("cozy-system"), differential.namespace(NS), differential.namespace("cozy-other") }
-- the old Deployment, a sibling in its namespace and one of its name elsewhere: only the first goes
local OTHERS = {
  deployment(NS, "linstor-scheduler", { ["app.kubernetes.io/name"] = "linstor-scheduler" }),
  deployment("cozy-other", NAME, { ["app.kubernetes.io/name"] = "unrelated" }),
}
local OLD = deployment(NS, NAME, { ["app.kubernetes.io/name"] = "linstor-scheduler",
  ["app.kubernetes.io/component"] = "admission" })

local function fixture(with_old)
  local items = {}
  for _, o in ipairs(NAMESPACES) do items[#items + 1] = o end
  for _, o in ipairs(OTHERS) do items[#items + 1] = o end
  if with_old then items[#items + 1] = OLD end
  return items
end
local CLUSTER, DONE = fixture(true), fixture(false)

local function deployments(h)
  return differential.objects_of(h, "Deployment", function(o) return o.metadata.resourceVersion end)
end

describe("migration 52-linstor-scheduler-admission", function()
  local h = harness.fake { fixtures = { CLUSTER } }

  it("deletes the old Deployment and leaves every other one as it was", function()
    local before = deployments(h)
    assert.is_not_nil(before[NS .. "/" .. NAME])
    h:migrate(52)
    before[NS .. "/" .. NAME] = nil
    assert.same(before, deployments(h))
    local deletes = h:writes()
    assert.equal(1, #deletes)
    assert.equal("DELETE", deletes[1].method)
    assert.matches(DEPLOY_PATH, deletes[1].path)
  end)

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(52)
    assert.is_nil(h:object("Deployment", NS, NAME))
  end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(52)
    assert.is_nil(h:object("Deployment", NS, NAME))
  end)

  it("check lists the delete run would make, and writes nothing", function()
    local res = h:migrate(52, { mode = "check" })
    assert.no_writes()
    assert.equal(1, #res.findings)
    assert.equal("would delete deployments cozy-linstor/linstor-scheduler-admission", res.findings[1].message)
    assert.is_not_nil(h:object("Deployment", NS, NAME))
  end)

  it("has nothing to do when the Deployment is already gone (the target state)", function()
    h:reset(DONE)
    local res = h:migrate(52)
    assert.no_writes()
    assert.matches("absent: nothing to delete", res.log)
    assert.same({}, h:migrate(52, { mode = "check" }).findings)
  end)

  it("an object deleted between its read and its delete is done, not a failure", function()
    h:faults { { method = "DELETE", path = "linstor-scheduler-admission$", delete = true } }
    h:migrate(52)
    assert.same({ "delete" }, h:fired())
    assert.is_nil(h:object("Deployment", NS, NAME))
    assert.is_not_nil(h:object("Deployment", "cozy-other", NAME))
  end)

  it("a read that fails once is retried #fakeonly", function()
    h:faults { { method = "GET", path = "linstor-scheduler-admission$", times = 1, status = 500 } }
    h:migrate(52)
    assert.same({ "status" }, h:fired())
    assert.is_nil(h:object("Deployment", NS, NAME))
  end)

  it("a delete that keeps failing fails the step, and the Deployment stays #fakeonly", function()
    h:faults { { method = "DELETE", path = "linstor-scheduler-admission$", times = -1,
      status = { code = 500, message = "etcd down" } } }
    local err = h:migrate_error(52)
    assert.equal("api", err.kind)
    assert.equal(500, err.code)
    assert.is_true(#h:fired() >= 1)
    assert.is_not_nil(h:object("Deployment", NS, NAME))
  end)
end)

-- Beside the platform's script 52 (spec/helpers/differential.lua): the same fixtures
-- run by both, compared object by object (docs/migrations/52-linstor-scheduler-admission.md).
describe("migration 52-linstor-scheduler-admission beside the platform's script #platform", function()
  local h = harness.fake { fixtures = { CLUSTER } }
  local same_as_shell = differential.same_as_shell

  it("its code: within 1.5x the shell's lines (cozy.recipe builds the table)", function()
    local c = differential.line_counts(52, harness.migration_file(52))
    assert.equal(4, c.shell)
    assert(c.lua <= 6, ("52: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("deletes the old Deployment, as the shell does", function()
    local d = differential.run(h, 52, CLUSTER)
    same_as_shell(d)
    assert.is_nil(d.port.objects["Deployment cozy-linstor/linstor-scheduler-admission"])
  end)

  it("does nothing when it is already gone, as the shell does", function()
    same_as_shell(differential.run(h, 52, DONE))
  end)

  it("an object deleted between the read and the delete: both go on", function()
    local d = differential.run(h, 52, CLUSTER,
      { faults = { { method = "DELETE", path = "linstor-scheduler-admission$", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    same_as_shell(d)
  end)

  it("a read that fails once: both delete, but the shell fails (its bug) #fakeonly", function()
    -- kubectl deletes, then reads the object to wait for it to go: that read's 500
    -- makes the shell exit 1 after its work is done, and stops the upgrade
    local d = differential.run(h, 52, CLUSTER,
      { faults = { { method = "GET", path = "linstor-scheduler-admission$", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.is_not.equal(0, d.shell.code)
    assert.matches("InternalError", d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.is_nil(d.shell.objects["Deployment cozy-linstor/linstor-scheduler-admission"])
  end)

  it("a delete that keeps failing: both fail, the Deployment stays #fakeonly", function()
    local d = differential.run(h, 52, CLUSTER,
      { faults = { { method = "DELETE", path = "linstor-scheduler-admission$", times = -1, status = 500 } } })
    assert.equal("status", d.shell.fired[1])
    assert.equal("status", d.port.fired[1])
    assert.is_not.equal(0, d.shell.code)
    assert.is_false(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.is_not_nil(d.port.objects["Deployment cozy-linstor/linstor-scheduler-admission"])
  end)
end)
