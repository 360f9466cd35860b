-- The spec harness itself (spec/README.md): each assertion passes where it
-- must and fails, saying why, where it must; migrations run through the
-- production step executor; fixtures, marks and the CLI runner behave as
-- documented. The migrations here live in a temporary directory.
local harness = require "spec.helpers"
local files = require("spec.helpers").files

local CM_PERMISSIONS = [[
  permissions = {
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
    { verb = "create", group = "", resource = "configmaps" },
  },
]]

-- Migration sources by name, each written as NN-name.lua.
local SOURCES = {
  -- labels every ConfigMap of the namespace once: idempotent, permissions complete
  ["1-label"] = [[
return {
  description = "label configmaps",
]] .. CM_PERMISSIONS .. [[
  check = function(ctx)
    for cm in ctx.kube:resource("v1", "configmaps"):list{ namespace = ctx.namespace } do
      if not (cm.metadata.labels or {}).done then ctx:finding("info", "would label " .. cm.metadata.name) end
    end
  end,
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    for cm in cms:list{ namespace = ctx.namespace } do
      if not (cm.metadata.labels or {}).done then
        cms:merge_patch(ctx.namespace, cm.metadata.name, { metadata = { labels = { done = "yes" } } })
      end
    end
  end,
}
]],
  -- creates a new ConfigMap on every run
  ["2-always"] = [[
return {
  description = "not idempotent",
]] .. CM_PERMISSIONS .. [[
  run = function(ctx)
    ctx.kube:resource("v1", "configmaps"):create{ apiVersion = "v1", kind = "ConfigMap",
      metadata = { generateName = "run-", namespace = ctx.namespace } }
  end,
}
]],
  -- reads a Lease it does not declare (the engine's own Lease rule names another)
  ["3-undeclared"] = [[
return {
  description = "reads a lease it does not declare",
]] .. CM_PERMISSIONS .. [[
  run = function(ctx)
    ctx.kube:resource("coordination.k8s.io/v1", "leases"):find(ctx.namespace, "token")
  end,
}
]],
  -- the same, but swallows the failure
  ["4-swallowed"] = [[
return {
  description = "reads a lease it does not declare and ignores the failure",
]] .. CM_PERMISSIONS .. [[
  run = function(ctx)
    pcall(function() ctx.kube:resource("coordination.k8s.io/v1", "leases"):find(ctx.namespace, "token") end)
  end,
}
]],
  -- declares its read for one namespace and reads another
  ["5-namespace"] = [[
return {
  description = "reads outside the namespace it declares",
  permissions = { { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" } },
  run = function(ctx)
    ctx.kube:resource("v1", "configmaps"):find("tenant-a", "settings")
  end,
}
]],
  -- re-reads only after a conflict, and does not declare that read
  ["7-reread"] = [[
return {
  description = "labels through the conflict-aware update, declaring no get",
  permissions = {
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
  },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = cms:list{ namespace = ctx.namespace }:collect()
    cms:update_each(items, function(cm)
      if cm.metadata.labels and cm.metadata.labels.done then return nil end
      cm.metadata.labels = { done = "yes" }
      return true
    end)
  end,
}
]],
  -- fails closed on purpose
  ["6-fails"] = [[
return {
  description = "fails",
  run = function(ctx)
    ctx.log:warn("about to fail")
    error("nothing is as expected")
  end,
}
]],
}

local FIXTURE = {
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "tenant-a" } },
  { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "settings", namespace = "cozy-system" },
    data = { a = "1" } },
  { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "settings", namespace = "tenant-a" },
    data = { b = "2" } },
}

local function fails(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "the assertion passed")
  local text = tostring(err)
  if pattern then assert.matches(pattern, text, 1, true) end
  return text
end

describe("the spec harness", function()
  local dir = files.tmpdir("cozy-harness-spec")
  for name, source in pairs(SOURCES) do files.write(dir .. "/" .. name .. ".lua", source) end
  local function m(name) return dir .. "/" .. name .. ".lua" end
  teardown(function() files.rm_rf(dir) end)

  local h = harness.fake { fixtures = { FIXTURE } }

  describe("h:migrate", function()
    it("runs a migration through the step executor, returning its findings, log and plan", function()
      local res = h:migrate(m("1-label"), { mode = "check" })
      assert.same({ "would label settings" }, { res.findings[1].message })
      assert.no_writes()
      res = h:migrate(m("1-label"), { mode = "plan" })
      assert.no_writes()
      assert.equal(1, #res.writes)
      assert.equal("PATCH", res.writes[1].method)
      h:migrate(m("1-label"))
      assert.equal("yes", h:object("ConfigMap", "cozy-system", "settings").metadata.labels.done)
      assert.is_nil(h:object("ConfigMap", "tenant-a", "settings").metadata.labels)
    end)

    it("raises with the migration's log when it fails; migrate_error returns the error", function()
      local text = fails(function() h:migrate(m("6-fails")) end, "nothing is as expected")
      assert.matches("about to fail", text, 1, true)
      local err, res = h:migrate_error(m("6-fails"))
      assert.equal("migration", err.kind)
      assert.equal("warn", res.lines[1].level)
      fails(function() h:migrate_error(m("1-label")) end, "succeeded (run), a failure was expected")
    end)

    it("refuses an undeclared request before it is sent, as production does", function()
      local err = h:migrate_error(m("3-undeclared"))
      assert.equal("denied", err.kind)
      assert.same({}, h:requests { path = "leases" })
    end)
  end)

  describe("fixtures and the log", function()
    it("resets to the block's fixtures before each test (1/2: change the state)", function()
      h:migrate(m("2-always"))
      assert.equal(1, #h:writes())
    end)

    it("resets to the block's fixtures before each test (2/2: it is back)", function()
      assert.equal(4, #h:objects())
      assert.same({}, h:requests { all = true })
    end)

    it("reset takes paths and tables mixed", function()
      h:reset { "spec/fixtures/fake/basic.json", { FIXTURE[2], FIXTURE[4] } }
      assert.is_not_nil(h:object("ConfigMap", "default", "cm-a"))
      assert.is_not_nil(h:object("ConfigMap", "tenant-a", "settings"))
    end)

    it("mark: requests and writes look only at what came after it", function()
      h:migrate(m("2-always"))
      assert.equal(1, #h:writes())
      h:mark()
      assert.same({}, h:writes())
      assert.same({}, h:requests())
      assert.equal(1, #h:requests { all = true, method = "POST" })
    end)

    it("runs the binary against the server", function()
      local r = h:cli { "status", "--no-builtin", "--migrations", dir, "--output", "json" }
      assert.equal(0, r.code, r.stderr)
      assert.is_true(#h:requests { method = "GET" } >= 1)
    end)
  end)

  describe("assert.no_writes", function()
    it("passes on reads and fails on a write, listing it", function()
      h:migrate(m("1-label"), { mode = "check" })
      assert.no_writes()
      h:migrate(m("1-label"))
      fails(function() assert.no_writes() end,
        "1 write(s) since the reset or mark:\n  PATCH /api/v1/namespaces/cozy-system/configmaps/settings -> 200")
      h:mark()
      assert.no_writes(h)
    end)
  end)

  describe("assert.migration_idempotent", function()
    it("passes for a migration whose second run writes nothing", function()
      assert.migration_idempotent(m("1-label"))
    end)

    it("fails for one that writes again, naming the writes and the changes", function()
      local text = fails(function() assert.migration_idempotent(m("2-always")) end,
        "is not idempotent: its second run sent 1 write(s)")
      assert.matches("POST /api/v1/namespaces/cozy-system/configmaps -> 201", text, 1, true)
      assert.matches("and changed objects:\n  added v1 ConfigMap cozy-system/run-", text, 1, true)
    end)
  end)

  describe("assert.permissions_complete", function()
    it("passes for a migration that declares what it uses, check and run", function()
      assert.permissions_complete(m("1-label"))
      -- run did run, and the allow list is off again
      assert.equal("yes", h:object("ConfigMap", "cozy-system", "settings").metadata.labels.done)
      assert.is_false(h.srv:control("GET", "/_fake/allows").enabled)
    end)

    it("fails for an undeclared request, naming the declaration to add", function()
      fails(function() assert.permissions_complete(m("3-undeclared")) end,
        'GET /apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/token -> 403: declare { verb = "get", '
        .. 'group = "coordination.k8s.io", resource = "leases" } (namespace cozy-system)')
    end)

    it("fails even when the migration swallows the refusal", function()
      -- the migration completes: only the fake's log shows the refused request
      h:migrate(m("4-swallowed"))
      local text = fails(function() assert.permissions_complete(m("4-swallowed")) end,
        "run (hook RBAC): completed, refused:")
      assert.matches("leases/token -> 403", text, 1, true)
    end)

    it("fails for a read that only a conflict makes (the run's first PATCH meets one)", function()
      h:migrate(m("7-reread")) -- without a conflict it completes under its declarations
      h:reset()
      fails(function() assert.permissions_complete(m("7-reread")) end,
        'GET /api/v1/namespaces/cozy-system/configmaps/settings -> 403: declare { verb = "get", group = "", '
        .. 'resource = "configmaps" }')
      assert.same({ "bump" }, h:fired { method = "PATCH" })
    end)

    it("refuses to run over the test's own fault rules", function()
      h:faults { { method = "GET", path = "configmaps", times = 1, status = 500 } }
      fails(function() assert.permissions_complete(m("1-label")) end, "sets fault rules of its own")
    end)

    it("fails for a request outside the namespace a permission names", function()
      fails(function() assert.permissions_complete(m("5-namespace")) end,
        "GET /api/v1/namespaces/tenant-a/configmaps/settings -> 403")
    end)
  end)
end)
