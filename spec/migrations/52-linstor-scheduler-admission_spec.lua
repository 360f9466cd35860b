-- Migration 52-linstor-scheduler-admission on the spec harness (spec/README.md): the old
-- linstor-scheduler-admission Deployment goes, every other object stays as it was.
local harness = require "spec.helpers"

local NS, NAME = "cozy-linstor", "linstor-scheduler-admission"
local DEPLOY_PATH = "/apis/apps/v1/namespaces/cozy%-linstor/deployments/linstor%-scheduler%-admission$"

local function deployment(ns, name, selector)
  return { apiVersion = "apps/v1", kind = "Deployment", metadata = { name = name, namespace = ns },
    spec = { replicas = 1, selector = { matchLabels = selector },
      template = { metadata = { labels = selector },
        spec = { containers = { { name = "webhook", image = "registry.example/linstor-scheduler:0.2.0" } } } } } }
end

local NAMESPACES = {
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
  { apiVersion = "v1", kind = "Namespace", metadata = { name = NS } },
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-other" } },
}
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
  local out = {}
  for _, o in ipairs(h:objects()) do
    if o.kind == "Deployment" then out[o.metadata.namespace .. "/" .. o.metadata.name] = o.metadata.resourceVersion end
  end
  return out
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
