-- One walk for check and run (docs/engine-api.md, "One walk for check and
-- run"): a migration's `walk` runs in every mode; in check each write it would
-- make is kept back and reported as a finding, and nothing is sent.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local runner = require "cozy.runner"

-- A migration file of `source`, loaded (validated) as the runner loads it.
local function load(source)
  local dir = cli.migration_dir { ["1-walk.lua"] = source }
  local ok, m = pcall(runner.load_file, dir .. "/1-walk.lua")
  files.rm_rf(dir)
  if not ok then error(m, 0) end
  return m
end

-- The migration docs/engine-api.md prints under the section.
local function doc_migration()
  local doc = assert(files.read("docs/engine-api.md"))
  local at = assert(doc:find("\n### One walk for check and run\n", 1, true))
  return load(assert(doc:match("```lua\n(.-)```", at)))
end

local function fixture()
  return cli.fixture(1, {
    cli.configmap("app-a", { x = "1" }), cli.configmap("app-b", { x = "2" }), cli.configmap("other", { x = "3" }),
  })
end

local function messages(findings)
  local out = {}
  for i, f in ipairs(findings) do out[i] = f.message end
  table.sort(out)
  return out
end

describe("a migration's walk", function()
  local h = harness.fake { fixtures = { fixture() } }

  it("check reports each write the walk would make as a finding, and sends none", function()
    local res = h:migrate(doc_migration(), { mode = "check" })
    assert.no_writes()
    assert.same({ "would patch configmaps cozy-system/app-a", "would patch configmaps cozy-system/app-b" },
      messages(res.findings))
    local f = res.findings[1]
    assert.equal("info", f.severity)
    assert.equal("patch", f.fields.verb)
    assert.equal("configmaps", f.fields.resource)
    assert.equal("cozy-system", f.fields.namespace)
    -- the change it would send, without the engine's resourceVersion test
    assert.matches('^%[{"op":"add","path":"/metadata/labels","value":{"apps.cozystack.io/application.name":"[ab]"}}%]$',
      f.fields.change)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "app-a").metadata.labels)
  end)

  it("plan keeps the same writes back; run makes them; check then finds nothing to do", function()
    local planned = h:migrate(doc_migration(), { mode = "plan" })
    assert.no_writes()
    assert.equal(2, #planned.writes)
    assert.same({}, planned.findings)
    local ran = h:migrate(doc_migration())
    assert.same({ labelled = 2, failed = 0 }, ran.outcome.counts)
    assert.equal("a", h:object("ConfigMap", "cozy-system", "app-a").metadata.labels["apps.cozystack.io/application.name"])
    assert.equal("b", h:object("ConfigMap", "cozy-system", "app-b").metadata.labels["apps.cozystack.io/application.name"])
    assert.is_nil(h:object("ConfigMap", "cozy-system", "other").metadata.labels)
    h:mark()
    local checked = h:migrate(doc_migration(), { mode = "check" })
    assert.no_writes()
    assert.same({}, checked.findings)
  end)

  it("in check, reports a delete, a merge patch and a raw call alike, and words ctx.log:change as plan does", function()
    local res = h:migrate(load([[
return {
  description = "walk",
  permissions = {
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
    { verb = "delete", group = "", resource = "configmaps" },
  },
  walk = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    ctx.log:change("%s: {deleting|would delete}", "other")
    cms:delete(ctx.namespace, "other", { absent = "skip" })
    cms:merge_patch(ctx.namespace, "app-a", { data = { x = "9" } })
    ctx.kube:call("DELETE", "/api/v1/namespaces/cozy-system/configmaps/app-b")
    ctx:outcome { mode = ctx.mode, worded = ctx:worded("{done|would be done}") }
  end,
}
]]), { mode = "check" })
    assert.no_writes()
    assert.same({ "would delete configmaps cozy-system/app-b", "would delete configmaps cozy-system/other",
      "would patch configmaps cozy-system/app-a" }, messages(res.findings))
    assert.same({ mode = "check", worded = "would be done" }, res.outcome.counts)
    assert.matches("other: would delete", res.log, 1, true)
    assert.is_table(h:object("ConfigMap", "cozy-system", "other"))
    assert.equal("1", h:object("ConfigMap", "cozy-system", "app-a").data.x)
  end)

  it("in check, still refuses a write its permissions do not declare", function()
    local err = h:migrate_error(load([[
return {
  description = "walk",
  permissions = { { verb = "get", group = "", resource = "configmaps" } },
  walk = function(ctx)
    ctx.kube:resource("v1", "configmaps"):delete(ctx.namespace, "other")
  end,
}
]]), { mode = "check" })
    assert.equal("denied", err.kind)
    assert.matches("which its permissions do not declare", err.message, 1, true)
    assert.no_writes()
  end)

  it("is refused beside run or check, or when it is not a function", function()
    for _, case in ipairs {
      { "run = function() end, walk = function() end", "walk is run and check at once" },
      { "check = function() end, walk = function() end", "walk is run and check at once" },
      { "walk = 'labels'", "walk must be a function(ctx)" },
    } do
      local ok, err = pcall(load, ("return { description = 'walk', %s }"):format(case[1]))
      assert.is_false(ok)
      assert.equal("invalid", err.kind)
      assert.matches(case[2], err.message, 1, true)
    end
  end)
end)
