-- One calling convention for ctx (docs/engine-api.md, "Calling convention"):
-- every function reached through ctx is a method, called with `:`; a call
-- with `.` is refused with an error naming the right form, never taken for
-- the other convention.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local runner = require "cozy.runner"

local function load(body)
  local dir = cli.migration_dir { ["1-probe.lua"] = ([[
return {
  description = "calling convention probe",
  permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx)
    %s
  end,
}]]):format(body) }
  finally(function() files.rm_rf(dir) end)
  return runner.load_file(dir .. "/1-probe.lua")
end

describe("ctx's calling convention", function()
  local h = harness.fake { fixtures = { cli.fixture(1, { cli.configmap("app-a", {}) }) } }

  it("takes every call with ':'", function()
    local res = h:migrate(load([[
    local cm = ctx.kube:resource("v1", "configmaps"):get("cozy-system", "app-a")
    ctx.log:info("read " .. cm.metadata.name)
    ctx:finding("info", "seen")
    ctx:outcome { read = 1 }]]))
    assert.same({ read = 1 }, res.outcome.counts)
    assert.equal("seen", res.findings[1].message)
  end)

  for _, case in ipairs {
    { [[ctx.finding("info", "x")]], "ctx.finding called with '.': call it with ':' (ctx:finding(...))" },
    { [[ctx.outcome { read = 1 }]], "ctx.outcome called with '.': call it with ':' (ctx:outcome(...))" },
    { [[ctx.log.info("x")]], "ctx.log.info called with '.': call it with ':' (ctx.log:info(...))" },
    { [[ctx.kube.lookup("configmaps")]], "ctx.kube.lookup called with '.': call it with ':' (ctx.kube:lookup(...))" },
    { [[ctx.kube:resource("v1", "configmaps").get("cozy-system", "app-a")]],
      "get called with '.' on a resource of ctx.kube: call it with ':' (x:get(...))" },
  } do
    it("refuses " .. case[1] .. ", naming the call with ':'", function()
      local err = h:migrate_error(load(case[1]))
      assert.equal("migration", err.kind)
      assert.matches(case[2], err.message, 1, true)
      assert.matches("1-probe.lua:5:", err.message, 1, true)
    end)
  end
end)
