-- Migration 49-tenant-ancestor-labels on the spec harness (spec/README.md): every tenant
-- namespace but tenant-root gets one empty label per ancestor; nothing else changes.
local harness = require "spec.helpers"
local differential = harness.differential

local P = "tenant.cozystack.io/"
local ns = differential.namespace
local function ancestors(...)
  local out = {}
  for _, a in ipairs { ... } do out[P .. a] = "" end
  return out
end

-- tenant-a-b lacks tenant-root (the chart's old bug); tenant-a-b-c is already done;
-- tenant-a has another label that stays and one with a value that the shell empties;
-- tenant-x--y would need the key tenant.cozystack.io/tenant-x-, which no server takes.
local CLUSTER = {
  ns("cozy-system"), ns("kube-system"), ns("tenant-root"), ns("tenantless"), ns("my-tenant-a"),
  ns("tenant-a", { [P .. "tenant-a"] = "yes", team = "blue" }),
  ns("tenant-a-b", { [P .. "tenant-a"] = "" }),
  ns("tenant-a-b-c", ancestors("tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c")),
  ns("tenant-x--y"),
}
-- What each namespace's labels must be afterwards (the server's own label aside).
local WANT = {
  ["tenant-a"] = ancestors("tenant-root", "tenant-a"),
  ["tenant-a-b"] = ancestors("tenant-root", "tenant-a", "tenant-a-b"),
  ["tenant-a-b-c"] = ancestors("tenant-root", "tenant-a", "tenant-a-b", "tenant-a-b-c"),
}
WANT["tenant-a"].team = "blue"

local function labels(h)
  return differential.objects_of(h, "Namespace", function(o)
    local l = {}
    for k, v in pairs(o.metadata.labels or {}) do
      if k ~= "kubernetes.io/metadata.name" then l[k] = v end
    end
    return next(l) and l or nil
  end)
end

local function patched(h) return differential.patched(h, "/namespaces/([^/]+)$") end

describe("migration 49-tenant-ancestor-labels", function()
  local h = harness.fake { fixtures = { CLUSTER } }

  it("labels each tenant namespace with its ancestors and leaves every other namespace as it was", function()
    local before = labels(h)
    local res = h:migrate(49)
    local want = labels(h)
    for k, v in pairs(before) do if not WANT[k] then want[k] = v end end
    for k, v in pairs(WANT) do want[k] = v end
    assert.same(want, labels(h))
    assert.same(before["tenant-x--y"], labels(h)["tenant-x--y"])
    assert.same({ "tenant-a", "tenant-a-b" }, patched(h))
    assert.same({ labelled = 2, failed = 0 }, res.outcome.counts)
    assert.is_nil(res.outcome.leave)
    assert.matches('namespace tenant%-x%-%-y not labelled: .*name part must', res.log)
  end)

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(49)
    assert.same(WANT["tenant-a-b"], labels(h)["tenant-a-b"])
  end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(49)
    assert.same(WANT["tenant-a-b"], labels(h)["tenant-a-b"])
  end)

  it("check lists the namespaces run would label, and writes nothing", function()
    local res = h:migrate(49, { mode = "check" })
    assert.no_writes()
    local names = {}
    for _, f in ipairs(res.findings) do
      assert.equal("patch", f.fields.verb)
      names[#names + 1] = f.fields.name
    end
    table.sort(names)
    assert.same({ "tenant-a", "tenant-a-b" }, names)
  end)

  it("a namespace already in the target state is not written", function()
    h:reset { ns("tenant-a-b-c", WANT["tenant-a-b-c"]) }
    h:migrate(49)
    assert.no_writes()
  end)

  it("a namespace deleted between the list and its patch is skipped, the others labelled #fakeonly", function()
    -- fake only: on kube-apiserver without a namespace controller a deleted namespace stays Terminating
    h:faults { { method = "PATCH", path = "/namespaces/tenant-a-b(\\?|$)", delete = true } }
    local res = h:migrate(49)
    assert.same({ "delete" }, h:fired())
    assert.is_nil(h:object("Namespace", nil, "tenant-a-b"))
    assert.same(WANT["tenant-a"], labels(h)["tenant-a"])
    assert.same({ labelled = 1, failed = 0 }, res.outcome.counts)
  end)

  it("a list that fails once is retried, and the work done #fakeonly", function()
    h:faults { { method = "GET", path = "^/api/v1/namespaces(\\?|$)", times = 1, status = 500 } }
    local res = h:migrate(49)
    assert.same({ "status" }, h:fired())
    assert.same({ "tenant-a", "tenant-a-b" }, patched(h))
    assert.is_nil(res.outcome.leave)
  end)

  it("a list that keeps failing leaves the version, writing nothing #fakeonly", function()
    h:faults { { method = "GET", path = "^/api/v1/namespaces(\\?|$)", times = -1, status = { code = 500, message = "etcd down" } } }
    local res = h:migrate(49)
    assert.is_true(#h:fired() >= 1)
    assert.no_writes()
    assert.equal("namespaces not listed: etcd down", res.outcome.leave)
  end)

  it("a patch that keeps failing is logged, the others labelled, and the version stamped, as the shell #fakeonly", function()
    h:faults { { method = "PATCH", path = "/namespaces/tenant-a(\\?|$)", times = -1, status = { code = 500, message = "etcd down" } } }
    local res = h:migrate(49)
    assert.is_true(#h:fired { method = "PATCH" } >= 1)
    assert.same({ labelled = 1, failed = 1 }, res.outcome.counts)
    assert.same(WANT["tenant-a-b"], labels(h)["tenant-a-b"])
    assert.same({ [P .. "tenant-a"] = "yes", team = "blue" }, labels(h)["tenant-a"])
    assert.is_nil(res.outcome.leave)
    assert.matches("tenant%-a: failed, 500", res.log)
  end)
end)

-- Beside the platform's script 49 (spec/helpers/differential.lua): the same fixtures
-- run by both, compared object by object (docs/migrations/49-tenant-ancestor-labels.md).
describe("migration 49-tenant-ancestor-labels beside the platform's script #platform", function()
  local h = harness.fake { fixtures = { CLUSTER } }
  local same_as_shell = differential.same_as_shell

  it("its code is at most 1.5x its shell's (blank and comment lines not counted)", function()
    local c = differential.line_counts(49, harness.migration_file(49))
    assert.equal(24, c.shell)
    assert(c.ratio <= 1.5, ("49: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("labels the same namespaces the same way, the invalid key's namespace left by both", function()
    local d = differential.run(h, 49, CLUSTER)
    same_as_shell(d)
    assert.same(WANT["tenant-a-b"], (function()
      local l = {}
      for k, v in pairs(d.shell.objects["Namespace tenant-a-b"].metadata.labels) do
        if k ~= "kubernetes.io/metadata.name" then l[k] = v end
      end
      return l
    end)())
  end)

  it("a namespace already in the target state: both leave it", function()
    same_as_shell(differential.run(h, 49, { ns("cozy-system"), ns("tenant-a-b-c", WANT["tenant-a-b-c"]) }))
  end)

  it("a namespace deleted between the list and its patch: both go on #fakeonly", function()
    local d = differential.run(h, 49, CLUSTER,
      { faults = { { method = "PATCH", path = "/namespaces/tenant-a-b(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    same_as_shell(d)
  end)

  it("a patch that keeps failing: both log it and go on #fakeonly", function()
    local d = differential.run(h, 49, CLUSTER,
      { faults = { { method = "PATCH", path = "/namespaces/tenant-a(\\?|$)", times = -1, status = 500 } } })
    assert.equal("status", d.shell.fired[1])
    assert.equal("status", d.port.fired[1])
    same_as_shell(d)
  end)

  it("a list that fails once: the shell labels nothing and stamps (its bug), the port retries #fakeonly", function()
    local d = differential.run(h, 49, CLUSTER,
      { faults = { { method = "GET", path = "^/api/v1/namespaces(\\?|$)", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({ "Namespace tenant-a", "Namespace tenant-a-b" }, differential.differences(d))
  end)
end)
