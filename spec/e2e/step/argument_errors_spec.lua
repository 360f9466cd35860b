-- A migration's wrong argument to the engine (docs/engine-api.md, "Argument
-- checks"): the step fails with kind "migration" and one line naming the
-- migration file's line that made the call, whichever way the call reached
-- the validator: a ctx function, a method of ctx.kube's tables (through the
-- facade's wrappers and the sealed proxies), a sandbox copy of cozy.obj or
-- cozy.match. Nothing is sent.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local runner = require "cozy.runner"

-- A migration whose walk makes `call` on its line 6.
local function migration(call)
  return ([[
local obj = require "cozy.obj"
local match = require "cozy.match"
return {
  description = "a wrong argument",
  permissions = { { verb = "get", group = "", resource = "configmaps" } },
  walk = function(ctx) local cms = ctx.kube:resource("v1", "configmaps"); %s end,
}
]]):format(call)
end

describe("a migration's wrong argument", function()
  local h = harness.fake { fixtures = { cli.fixture(1) } }

  local cases = {
    { 'ctx:finding("fatal", "x")', 'ctx:finding: severity must be "info", "warn" or "block", got "fatal"' },
    { 'ctx:outcome(5)', "ctx:outcome(fields): fields must be a table" },
    { 'ctx.kube:resource("v1", "configmaps", 5)', "resource(api_version, plural, opts): opts must be a table" },
    { 'cms:find("cozy-system", "x", 5)', "find: opts must be a table" },
    { 'cms:list(5)', "list(opts): opts must be a table" },
    { 'cms:merge_patch("cozy-system", "x", "p")', "merge_patch: the patch must be a table" },
    { 'ctx.kube:lookup("")', 'lookup(name): name must be a resource as kubectl names it ("pvc", "deployments.apps"), not ""' },
    { 'obj.walk({}, 5)', "obj.walk(v, fn): fn must be a function(value, path)" },
    { 'match.glob(5, "a")', "cozy.match: a glob must be a string, not a number" },
  }
  for _, case in ipairs(cases) do
    it(("%s: kind migration, at the migration's line"):format(case[1]), function()
      local dir = cli.migration_dir { ["1-bad.lua"] = migration(case[1]) }
      finally(function() files.rm_rf(dir) end)
      local err = h:migrate_error(runner.load_file(dir .. "/1-bad.lua"))
      assert.equal("migration", err.kind)
      assert.equal("1-bad", err.migration)
      local at, message = err.message:match("^(.-):(%d+: .*)$")
      assert.truthy(at, err.message)
      assert.matches("1%-bad%.lua$", at)
      assert.equal("6: " .. case[2], message)
      assert.no_writes()
    end)
  end
end)
