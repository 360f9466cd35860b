-- Migrations as rules (docs/engine-api.md, "Rules"): cozy.rule derives a
-- migration's permissions from its declared selections, refuses a selection
-- it cannot judge at load time, and hack/migration-idioms.sh (run by
-- hack/lint.sh) holds migrations/ to the one idiom per job.
local rule = require "cozy.rule"
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local function walk() end

describe("cozy.rule", function()
  it("derives the permissions from the selections: list, get+patch to edit, get+delete, scoped, check_only", function()
    local m = rule {
      description = "d",
      select = {
        a = { "kuberneteses.apps.cozystack.io", edit = true },
        b = { "deployments.apps", namespace = "ns", name = "x", delete = true },
        c = { "kubevirts.kubevirt.io", check_only = true },
        d = { "configmaps", "secrets" },
      },
      walk = walk,
    }
    assert.same({
      { verb = "list", group = "apps.cozystack.io", resource = "kuberneteses" },
      { verb = "get", group = "apps.cozystack.io", resource = "kuberneteses" },
      { verb = "patch", group = "apps.cozystack.io", resource = "kuberneteses" },
      { verb = "get", group = "apps", resource = "deployments", namespace = "ns", name = "x" },
      { verb = "delete", group = "apps", resource = "deployments", namespace = "ns", name = "x" },
      { verb = "list", group = "kubevirt.io", resource = "kubevirts", check_only = true },
      { verb = "list", group = "", resource = "configmaps" },
      { verb = "list", group = "", resource = "secrets" },
    }, m.permissions)
    -- one function is the rule's entry in every mode
    assert.equal(m.walk, m.run)
    assert.equal(m.walk, m.check)
  end)

  it("refuses at load time what it cannot judge: a short name, an unknown field or policy", function()
    local function refused(expected, select)
      local ok, err = pcall(rule, { description = "d", select = select, walk = walk })
      assert.is_false(ok)
      assert.matches(expected, tostring(err), 1, true)
    end
    refused('resource "pvc": not a core plural', { a = { "pvc" } })
    refused('select.a: unknown field "permissions"', { a = { "configmaps", permissions = {} } })
    refused('select.a.writes must be "stop", "fail", "leave" or "warn"', { a = { "configmaps", writes = "ignore" } })
    refused('select.a.reads must be "stop", "warn" or "leave"', { a = { "configmaps", reads = "fail" } })
    refused("select.a: a named object needs its namespace", { a = { "deployments.apps", name = "x" } })
    local ok, err = pcall(rule, { description = "d", select = {}, walk = walk, permissions = {} })
    assert.is_false(ok)
    assert.matches('unknown field "permissions"', tostring(err), 1, true)
  end)
end)

describe("hack/migration-idioms.sh", function()
  it("passes every migration in migrations/", function()
    local r = cli.shell("hack/migration-idioms.sh")
    assert.equal(0, r.code, r.stdout .. r.stderr)
  end)

  it("refuses a migration written the old way, naming each job done by hand", function()
    local dir = files.tmpdir()
    files.write(dir .. "/46-old.lua", [[
local recipe = require "cozy.recipe"
return {
  description = "old",
  permissions = recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "get", "patch" }),
  walk = function(ctx)
    local res = assert(ctx.kube:lookup("kuberneteses.apps.cozystack.io"))
    local ok, counts = pcall(res.update_each, res, res:list{}, function() end, { on_error = "continue" })
    if not ok and not ctx.kube:is_item_error(counts) then error(counts, 0) end
    if not ok then return ctx:leave_version("not listed") end
  end,
}
]])
    local r = cli.shell("hack/migration-idioms.sh " .. files.quote(dir))
    assert.equal(1, r.code, r.stdout)
    for _, want in ipairs {
      "46-old.lua: not a rule", "46-old.lua:1: cozy.recipe", "46-old.lua:4: hand-written permissions",
      "46-old.lua:6: a resource by hand", "46-old.lua:7: a batch by hand", "46-old.lua:7: a failure policy by hand",
      "46-old.lua:9: a failure policy by hand",
    } do
      assert.matches(want, r.stdout, 1, true)
    end
  end)

  it("refuses an orphaning and a label check written by hand (rule.orphan, obj.set_labels)", function()
    local dir = files.tmpdir()
    files.write(dir .. "/55-old.lua", [[
local json = require "cozy.json"
local obj = require "cozy.obj"
return require("cozy.rule") {
  description = "old",
  select = { hrs = { "helmreleases.helm.toolkit.fluxcd.io", patch = true, delete = true } },
  walk = function(ctx, s)
    s.hrs:each(function(hr)
      if obj.key_error("x/" .. hr.metadata.name) then return end
      s.hrs:merge_patch(hr, { metadata = { finalizers = json.null } })
    end)
  end,
}
]])
    local r = cli.shell("hack/migration-idioms.sh " .. files.quote(dir))
    assert.equal(1, r.code, r.stdout)
    assert.matches("55-old.lua:8: label keys checked by hand", r.stdout, 1, true)
    assert.matches("55-old.lua:9: finalizers by hand: rule.orphan", r.stdout, 1, true)
  end)
end)
