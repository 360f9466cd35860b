-- A batch's per-item error policy (docs/engine-api.md, "A batch's errors"):
-- update_each stops at the first failure by default or, with on_error =
-- "continue", counts an item's API error and goes on; under both every item
-- that failed is told (a warning naming it, kept in the step's outcome) and,
-- going on, returned as plain data. Only an item's API error is an item error:
-- an error of the migration's own code still stops the batch. ctx.kube.is_item_error
-- tells an API error apart for a migration's own best-effort loop.
local harness = require "spec.helpers"
local files = require("spec.helpers").files

local migration, fixture = harness.configmap_probe, harness.configmaps_fixture

-- Marks every cm-N done; the batch's counts and its first failure in the outcome.
local EACH = [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local picked = {}
    for cm in cms:list{ namespace = "cozy-system" } do
      if cm.metadata.name:find("^cm%%-") then picked[#picked + 1] = cm end
    end
    local told = 0
    local counts, failures = cms:update_each(picked, function(cm) cm.data.done = "yes" end, {
      label = "ConfigMaps", concurrency = %d, on_error = %s,
      on_failure = function(cm, _, f) told = told + 1 assert(f.name == cm.metadata.name) end })
    local f = failures[1] or {}
    ctx:outcome { total = counts.total, changed = counts.changed, failed = counts.failed, told = told,
      failures = #failures, name = f.name, namespace = f.namespace, kind = f.kind, code = f.code,
      reason = f.reason, message = f.message }
]]

-- The ```lua blocks under docs/engine-api.md's heading `heading`, in order.
local function doc_examples(heading)
  local text = assert(files.read("docs/engine-api.md"))
  local at = assert(text:find("\n" .. heading .. "\n", 1, true), "no section " .. heading)
  local stop = text:find("\n#+ ", at + 1) or #text
  local out = {}
  for code in text:sub(at, stop):gmatch("```lua\n(.-)```") do out[#out + 1] = code end
  return out
end

local function warnings(out)
  local found = {}
  for _, ln in ipairs(out.lines) do
    if ln.level == "warn" then found[#found + 1] = ln.message end
  end
  return found
end

describe("update_each's per-item error policy", function()
  local h = harness.fake { fixtures = { fixture(4) } }

  for _, n in ipairs { 1, 4 } do
    it(("with on_error = \"continue\", counts an item's API error, records it and goes on (concurrency %d) #fakeonly")
        :format(n), function()
      h:faults { { method = "PATCH", path = "/configmaps/cm-2$", times = 1, status = 403 } }
      local res = h:migrate(migration(EACH:format(n, '"continue"')))
      assert.same({ "status" }, h:fired())
      assert.same({ total = 4, changed = 3, failed = 1, told = 1, failures = 1, name = "cm-2",
        namespace = "cozy-system", kind = "api", code = 403, reason = "Forbidden", message = "injected fault" },
        res.outcome.counts)
      for _, i in ipairs { 1, 3, 4 } do assert.equal("yes", h:object("ConfigMap", "cozy-system", "cm-" .. i).data.done) end
      assert.is_nil(h:object("ConfigMap", "cozy-system", "cm-2").data.done)
      -- the failed item is a warning naming it, kept in the step's history record
      local line = "ConfigMap cozy-system/cm-2: failed, 403 Forbidden: injected fault"
      assert.same({ line }, warnings(res))
      assert.same({ line }, res.outcome.warnings)
      assert.matches("ConfigMaps: 3 changed, 0 unchanged, 0 deleted since the list, 1 failed", res.log, 1, true)
    end)
  end

  it("by default stops at the first failure, and still names the item that failed #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-2$", times = 1, status = 403 } }
    local err, out = h:migrate_error(migration(EACH:format(1, "nil")))
    assert.same({ "status" }, h:fired())
    assert.equal("api", err.kind)
    assert.equal(403, err.code)
    assert.same({ "ConfigMap cozy-system/cm-2: failed, 403 Forbidden: injected fault" }, warnings(out))
    -- one at a time: nothing after it was changed
    assert.is_nil(h:object("ConfigMap", "cozy-system", "cm-3").data.done)
  end)

  it("with on_error = \"continue\", an object deleted since the list is an item error unless absent = \"skip\" #fakeonly",
      function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-3$", times = 1, status = 404 } }
    local res = h:migrate(migration(EACH:format(1, '"continue"')))
    assert.same({ "status" }, h:fired())
    assert.equal(1, res.outcome.counts.failed)
    assert.equal("cm-3", res.outcome.counts.name)
    assert.equal(404, res.outcome.counts.code)
  end)

  it("with on_error = \"continue\", still stops at an error of the migration's own edit", function()
    local err = h:migrate_error(migration([[
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:update_each(cms:list{ namespace = "cozy-system" }, function(cm)
      if cm.metadata.name == "cm-2" then error("edit refuses cm-2") end
      cm.data = cm.data or {}
      cm.data.done = "yes"
    end, { concurrency = 1, on_error = "continue" })
]]))
    assert.equal("migration", err.kind)
    assert.matches("edit refuses cm%-2", err.message)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "cm-3").data.done)
  end)

  it("docs/engine-api.md's examples run as printed #fakeonly", function()
    local examples = doc_examples("### A batch's errors")
    assert.equal(2, #examples)
    h:faults { { method = "PATCH", path = "/configmaps/cm-3$", times = 1, status = 403 } }
    local res = h:migrate(migration(examples[1]))
    -- the version ConfigMap and cm-1, 2, 4 labelled; cm-3 refused, named, and the step done
    assert.same({ "status" }, h:fired())
    assert.same({ labelled = 4, failed = 1, first_failed = "cm-3" }, res.outcome.counts)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "cm-3").metadata.labels)
    h:reset()
    h:faults { { method = "PATCH", path = "/configmaps/cm-2$", times = 1, status = 409 } }
    res = h:migrate(migration(examples[2]))
    assert.same({ "status" }, h:fired())
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "cm-1").data.done)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "cm-2").data.done)
    assert.same({ "ConfigMap cm-2: injected fault" }, res.outcome.warnings)
  end)

  it("refuses an on_error that is neither \"stop\" nor \"continue\"", function()
    local err = h:migrate_error(migration([[
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:update_each({}, function() end, { on_error = "ignore" })
]]))
    assert.matches('opts.on_error must be "stop" or "continue"', err.message, 1, true)
  end)

  it("ctx.kube.is_item_error tells a request's API error from the migration's own and from a refusal of the engine #fakeonly",
      function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = 1, status = 500 } }
    local res = h:migrate(migration([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local ok, api = pcall(cms.merge_patch, cms, "cozy-system", "cm-1", { data = { done = "yes" } })
    assert(not ok)
    local _, own = pcall(error, "mine")
    local _, table_err = pcall(error, { code = 500 })
    -- an undeclared request is refused by the engine before it is sent: kind denied, not an API error
    local _, denied = pcall(ctx.kube.call, ctx.kube, "DELETE", "/api/v1/namespaces/cozy-system/configmaps/cm-1")
    ctx:outcome { api = ctx.kube:is_item_error(api), code = api.code, own = ctx.kube:is_item_error(own),
      table_err = ctx.kube:is_item_error(table_err), denied = ctx.kube:is_item_error(denied), denied_kind = denied.kind }
]]))
    assert.same({ "status" }, h:fired())
    assert.same({ api = true, code = 500, own = false, table_err = false, denied = false, denied_kind = "denied" },
      res.outcome.counts)
  end)
end)
