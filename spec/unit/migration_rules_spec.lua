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

describe("cozy.rule that orchestrates", function()
  it("passes its tools, parameters and files through; finally gets selections of its own", function()
    local got
    local m = rule {
      description = "d",
      select = { a = { "configmaps", get = true } },
      tools = { ["etcd-migrate"] = { "get,list pods" } },
      parameters = { { name = "P", default = "0", description = "p" } },
      files = { crds = "$P" },
      walk = walk,
      finally = function(ctx, s) got = { ctx = ctx, s = s } end,
    }
    assert.same({ ["etcd-migrate"] = { "get,list pods" } }, m.tools)
    assert.same({ { name = "P", default = "0", description = "p" } }, m.parameters)
    assert.same({ crds = "$P" }, m.files)
    local ctx = {}
    m.finally(ctx)
    assert.equal(ctx, got.ctx)
    assert.equal("function", type(got.s.a.get))
    assert.equal("function", type(got.s.a.each))
    -- the ready-made conditions of a selection's wait
    assert.equal("function", type(rule.conditions.rolled_out))
    assert.equal("function", type(rule.conditions.alt_names { "x" }))
  end)

  it("gives each migration's require of cozy.rule conditions of its own", function()
    local sandbox = require "cozy.sandbox"
    local a, b = sandbox.modules["cozy.rule"](), sandbox.modules["cozy.rule"]()
    a.conditions.rolled_out = function() return true end
    assert.equal(rule.conditions.rolled_out, b.conditions.rolled_out)
    assert.not_equal(a.conditions.rolled_out, b.conditions.rolled_out)
  end)

  it("derives get, apply (get, create, patch) and wait (list, watch), scoped as the selection", function()
    local m = rule {
      description = "d",
      select = {
        crds = { "customresourcedefinitions.apiextensions.k8s.io", get = true, apply = true, wait = true },
        op = { "deployments.apps", namespace = "ns", name = "x", patch = true, wait = true },
      },
      walk = walk,
    }
    local CRD = { group = "apiextensions.k8s.io", resource = "customresourcedefinitions" }
    local function p(verb, base, more)
      local out = { verb = verb }
      for k, v in pairs(base) do out[k] = v end
      for k, v in pairs(more or {}) do out[k] = v end
      return out
    end
    local DEPLOY = { group = "apps", resource = "deployments", namespace = "ns" }
    assert.same({
      p("list", CRD), p("get", CRD), p("create", CRD), p("patch", CRD), p("watch", CRD),
      p("get", DEPLOY, { name = "x" }), p("patch", DEPLOY, { name = "x" }),
      p("list", DEPLOY), p("watch", DEPLOY),
    }, m.permissions)
  end)

  it("refuses a tool without its access, a finally that is not a function, an undeclared method", function()
    local function refused(expected, spec)
      spec.description, spec.select, spec.walk = "d", spec.select or {}, spec.walk or walk
      local ok, err = pcall(rule, spec)
      assert.is_false(ok)
      assert.matches(expected, tostring(err), 1, true)
    end
    refused("tools: a tool is declared with what it may do on the cluster", { tools = { "etcd-migrate" } })
    refused("tools must be name -> its access lines", { tools = "etcd-migrate" })
    refused("finally must be a function(ctx, s)", { finally = 1 })
    refused('select.a: unknown field "watch"', { select = { a = { "pods", watch = true } } })
    local m = rule { description = "d", select = { a = { "pods" } },
      walk = function(_, s) s.a:apply({}) end }
    local ok, err = pcall(m.walk, {})
    assert.is_false(ok)
    assert.matches("s.a:apply: declare apply = true in select.a", tostring(err), 1, true)
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

  it("refuses a tool declared without its access; reading a declared file is no resource", function()
    local dir = files.tmpdir()
    files.write(dir .. "/50-tool.lua", [[
local rule = require "cozy.rule"
return rule {
  description = "tool", select = {}, files = { crds = "/x" },
  tools = { "etcd-migrate" },
  walk = function(ctx) return ctx.files:list("crds", ".json") end,
}
]])
    local r = cli.shell("hack/migration-idioms.sh " .. files.quote(dir))
    assert.equal(1, r.code, r.stdout)
    assert.equal('50-tool.lua:4: a tool without its access: tools = { ["name"] = { "VERBS RESOURCE" } }\n',
      r.stdout:gsub("[^\n]*/50%-tool", "50-tool"))
    files.write(dir .. "/50-tool.lua", (files.read(dir .. "/50-tool.lua")
      :gsub('tools = { "etcd%-migrate" }', 'tools = { ["etcd-migrate"] = { "get pods" } }')))
    r = cli.shell("hack/migration-idioms.sh " .. files.quote(dir))
    assert.equal(0, r.code, r.stdout)
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
