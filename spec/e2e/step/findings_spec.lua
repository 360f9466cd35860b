-- ctx.finding in every mode (docs/engine-api.md, "The migration context"):
-- a finding in check, a log line at its severity in run and plan, and a
-- blocking finding stops the step before its first write, naming it.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local runner = require "cozy.runner"

local function load(source)
  local dir = cli.migration_dir { ["1-probe.lua"] = source }
  finally(function() files.rm_rf(dir) end)
  return runner.load_file(dir .. "/1-probe.lua")
end

-- A walk that finds what `severity` says of ConfigMap app-a, then labels it.
local function probe(severity, write_first)
  return load(([[
return {
  description = "finding probe",
  permissions = { { verb = "get", group = "", resource = "configmaps" },
                  { verb = "patch", group = "", resource = "configmaps" } },
  walk = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local write = function(name) cms:merge_patch("cozy-system", name, { metadata = { labels = { seen = "yes" } } }) end
    if %s then write("app-b") end
    local cm = cms:get("cozy-system", "app-a")
    ctx:finding(%q, "app-a is odd", { name = cm })
    ctx:finding("info", "more to say")
    write("app-a")
  end,
}]]):format(write_first and "true" or "false", severity))
end

local function nothing_to_write()
  return load([[
return {
  description = "blocks and writes nothing",
  permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx) ctx:finding("block", "the cluster is not ready") end,
}]])
end

describe("ctx:finding", function()
  local h = harness.fake { fixtures = { cli.fixture(1, { cli.configmap("app-a", {}), cli.configmap("app-b", {}) }) } }

  it("in run, logs info and warn findings at their level and goes on", function()
    local res = h:migrate(probe("warn"))
    assert.matches("WARN%s.-finding: app%-a is odd", res.log)
    assert.matches("INFO%s.-finding: more to say", res.log)
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "app-a").metadata.labels.seen)
  end)

  it("in run, a blocking finding stops the step before its first write, naming it", function()
    local err, res = h:migrate_error(probe("block"))
    assert.equal("migration", err.kind)
    assert.matches("blocked by 1 finding%(s%): app%-a is odd", err.message)
    assert.matches("ERROR%s.-finding: app%-a is odd", res.log)
    assert.no_writes()
  end)

  it("in plan, a blocking finding stops the step too; in check it is a finding and the walk goes on", function()
    local err = h:migrate_error(probe("block"), { mode = "plan" })
    assert.matches("blocked by 1 finding%(s%): app%-a is odd", err.message)
    assert.no_writes()
    local checked = h:migrate(probe("block"), { mode = "check" })
    local severities = {}
    for _, f in ipairs(checked.findings) do severities[#severities + 1] = f.severity .. ": " .. f.message end
    assert.same({ "block: app-a is odd", "info: more to say", "info: would patch configmaps cozy-system/app-a" },
      severities)
    assert.no_writes()
  end)

  it("a step that blocks and writes nothing fails at its end", function()
    local err = h:migrate_error(nothing_to_write())
    assert.matches("blocked by 1 finding%(s%): the cluster is not ready", err.message)
  end)

  it("a blocking finding after a write stops the next write", function()
    local err = h:migrate_error(probe("block", true))
    assert.matches("blocked by 1 finding", err.message)
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "app-b").metadata.labels.seen)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "app-a").metadata.labels)
  end)

  it("a refused write names every blocking finding so far, those found after an earlier refusal too", function()
    local err = h:migrate_error(load([[
return {
  description = "blocks twice",
  permissions = { { verb = "patch", group = "", resource = "configmaps" } },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local write = function(name) cms:merge_patch("cozy-system", name, { metadata = { labels = { seen = "yes" } } }) end
    write("app-b")
    ctx:finding("block", "first reason")
    ctx:finding("info", "by the way")
    local refused, first = pcall(write, "app-a")
    assert(not refused and tostring(first):find("blocked by 1 finding(s): first reason", 1, true), tostring(first))
    ctx:finding("block", "second reason")
    write("app-a")
  end,
}]]))
    assert.matches("blocked by 2 finding%(s%): first reason; second reason", err.message)
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "app-b").metadata.labels.seen)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "app-a").metadata.labels)
  end)
end)
