-- `cozy-migrate new NAME`: scaffolds migrations/NN-NAME.lua (the next free
-- number) and spec/migrations/NN-NAME_spec.lua, relative to the current
-- directory (the source tree), or next to --migrations DIR.
local runner = require "cozy.runner"
local discovery = require "cozy.runner.discovery"
local sys = require "cozy.sys"

local M = {}

local migration_template = [==[
-- Migration %d: %s.
-- Moves the platform from version %d to %d. It must be idempotent: a failed
-- run is retried from this step, so every write must be safe to repeat.
return {
  description = "TODO: one line saying what this migration changes",

  -- What the runner's service account must be allowed to do (checked by
  -- `cozy-migrate check` with SelfSubjectAccessReview).
  permissions = {
    -- { verb = "patch", group = "apps", resource = "deployments" },
  },

  -- Optional, read-only: report what run() would do and what could go wrong.
  check = function(ctx)
    -- ctx.finding("info", "nothing to report")
  end,

  run = function(ctx)
    -- local deployments = ctx.kube:resource("apps/v1", "deployments")
    -- for d in deployments:list{ namespace = ctx.namespace } do
    --   -- mutate decides from the object it is given (a fresh read after a
    --   -- conflict) and returns JSON patch ops, or nil for "nothing to do"
    --   local _, changed = deployments:update(d, function(obj)
    --     local labels = obj.metadata.labels
    --     if labels == nil then
    --       return { { op = "add", path = "/metadata/labels", value = { example = "yes" } } }
    --     elseif labels.example ~= "yes" then
    --       return { { op = "add", path = "/metadata/labels/example", value = "yes" } }
    --     end
    --   end)
    --   if changed then
    --     ctx.log:info(("Deployment %%s/%%s: labelled"):format(d.metadata.namespace, d.metadata.name))
    --   end
    -- end
  end,
}
]==]

local spec_template = [==[
-- Spec for migration %d (%s): runs it against the fake API server, twice.
local fake = require "spec.support.fake"
local runner = require "cozy.runner"

describe("migration %d-%s", function()
  local srv
  before_each(function()
    srv = fake.start{ fixtures = { {
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
      -- TODO: the objects this migration reads and changes, in full
    } } }
  end)
  after_each(function() srv:stop() end)

  it("changes what it must and is idempotent", function()
    local m = runner.load_file("%s")
    runner.run_migration(m, { kubeconfig = srv.kubeconfig, namespace = "cozy-system" })
    local first = srv:objects()
    -- TODO: assert on first
    runner.run_migration(m, { kubeconfig = srv.kubeconfig, namespace = "cozy-system" })
    assert.same(first, srv:objects())   -- a second run changes nothing
  end)

  it("reports what it would do in check", function()
    local m = runner.load_file("%s")
    local res = runner.run_migration(m, { kubeconfig = srv.kubeconfig, namespace = "cozy-system", mode = "check" })
    assert.is_table(res.findings)
  end)
end)
]==]

local function exists(path)
  return sys.stat(path) ~= nil
end

local function write_new(path, text)
  if exists(path) then return nil, path .. " already exists" end
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  f:write(text)
  f:close()
  return true
end

function M.run(opts, args)
  return runner.protect(opts, function(log)
    local name = args[1]
    if name == nil or args[2] ~= nil then
      io.stderr:write("usage: cozy-migrate new NAME (lowercase words joined by '-')\n")
      return 2
    end
    if not name:match("^[a-z0-9][a-z0-9-]*$") or name:match("%-%-") or name:match("%-$") then
      io.stderr:write(("cozy-migrate: invalid migration name %q: use lowercase letters, digits and single '-'\n")
        :format(name))
      return 2
    end
    local dir = (opts.migrations or "migrations"):gsub("/+$", "")
    if sys.stat(dir) ~= "directory" then
      io.stderr:write(("cozy-migrate: %s is not a directory (run from the source tree or give --migrations)\n")
        :format(dir))
      return 2
    end
    -- the next number after everything known: the directory, and this
    -- build's migrations unless --migrations names another set
    local highest = 0
    for _, filename in ipairs(assert(sys.listdir(dir))) do
      local n = discovery.classify(filename)
      if n and n > highest then highest = n end
    end
    if not opts.migrations then
      for _, b in ipairs(sys.builtin_migrations()) do
        local n = discovery.classify(b.name)
        if n and n > highest then highest = n end
      end
    end
    local number = highest + 1
    local base = ("%d-%s"):format(number, name)
    local file = dir .. "/" .. base .. ".lua"
    local root = dir:match("^(.*)/[^/]+$") or "."
    local spec_dir = root == "." and "spec/migrations" or (root .. "/spec/migrations")
    local ok, err = write_new(file, migration_template:format(number, name, number, number + 1))
    if not ok then
      io.stderr:write("cozy-migrate: ", err, "\n")
      return 1
    end
    log:info("created migration", { file = file })
    if sys.stat(spec_dir) ~= "directory" then os.execute("mkdir -p '" .. spec_dir:gsub("'", "'\\''") .. "'") end
    local spec = spec_dir .. "/" .. base .. "_spec.lua"
    ok, err = write_new(spec, spec_template:format(number, name, number, name, file, file))
    if not ok then
      io.stderr:write("cozy-migrate: ", err, "\n")
      return 1
    end
    log:info("created spec", { file = spec })
    io.stdout:write(file, "\n", spec, "\n")
    return 0
  end)
end

return M
