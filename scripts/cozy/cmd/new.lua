-- `cozy-migrate new NAME`: scaffolds migrations/NN-NAME.lua (the next free
-- number) and spec/migrations/NN-NAME_spec.lua, relative to the current
-- directory (the source tree), or next to --migrations DIR.
local runner = require "cozy.runner"
local discovery = require "cozy.runner.discovery"
local sys = require "cozy.sys"

local M = {}

-- The templates' placeholders: {{NUMBER}}, {{NEXT}}, {{NAME}}, {{FILE}}.
local migration_template = [==[
-- Migration {{NUMBER}}: {{NAME}}.
-- Moves the platform from version {{NUMBER}} to {{NEXT}}. TODO: why this migration
-- exists, in a sentence or two. It must be idempotent: a failed run is retried
-- from this step, so every write must be safe to repeat.
local rule = require "cozy.rule"

-- The change for one object, made on a copy of it: the engine sends the
-- difference when it returns true, nothing otherwise (so a second run changes
-- nothing). It decides from the object it is given: after a conflict the
-- engine re-reads it and hands over a fresh copy.
-- (The ---@ lines are LuaCATS types for editors: docs/authoring.md, "Editor completion".)
---@param obj cozy.Object
---@return boolean changed
local function change(obj)
  -- TODO: your change. To see the spec go green, uncomment this example:
  -- if not obj.metadata.labels.done then obj.metadata.labels.done = "yes"; return true end
  return false
end

return rule {
  description = "TODO: one line saying what this migration changes",

  -- TODO: what it reads and changes, by kubectl resource name. The engine derives
  -- the permissions (an edited selection: list, get, patch; `cozy-migrate rbac`
  -- grants exactly these) and owns the failure policy (writes = "stop" by default;
  -- "fail", "leave" or "warn"), the counts, the progress and the outcome record.
  select = { objects = { "configmaps", namespace = "cozy-system", edit = true } },

  -- One walk for run, plan and check: in check, every write it would make is a
  -- finding ("would patch ...") and nothing is sent. A risk is a
  -- ctx:finding("warn", ...), what must stop the upgrade ctx:finding("block", ...).
  walk = function(_, s) s.objects:each(change) end,
}
]==]

local spec_template = [==[
-- Spec for migration {{NUMBER}}-{{NAME}}, on the spec harness (spec/README.md):
-- the fake API server holds FIXTURE, reset before each test.
local harness = require "spec.helpers"

local MIGRATION = "{{FILE}}"

-- TODO: the objects this migration reads and changes, in full (as the API
-- server returns them), and objects it must leave alone.
local FIXTURE = {
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
  { apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = "example", namespace = "cozy-system",
      labels = { ["app.kubernetes.io/name"] = "example" } },
    data = { key = "value" } },
}

-- The objects whose stored state differs between two snapshots, as "Kind ns/name".
local function changed_objects(before, after)
  local function index(objects)
    local out = {}
    for _, o in ipairs(objects) do
      out[o.kind .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name] =
        o.metadata.resourceVersion
    end
    return out
  end
  local a, b, out = index(before), index(after), {}
  for k, rv in pairs(b) do
    if a[k] ~= rv then out[#out + 1] = k end
  end
  for k in pairs(a) do
    if b[k] == nil then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

describe("migration {{NUMBER}}-{{NAME}}", function()
  local h = harness.fake { fixtures = { FIXTURE } }

  it("changes what it must", function()
    local before = h:objects()
    h:migrate(MIGRATION)
    local changed = changed_objects(before, h:objects())
    assert(#changed > 0, "migration {{NUMBER}}-{{NAME}} changed no object of its fixture: "
      .. "write its first real change in " .. MIGRATION .. " (change(obj)), keep an object it "
      .. "applies to in FIXTURE, then assert here how each changed object must look afterwards")
    -- TODO: assert.same(...) on h:object(kind, namespace, name) for each object it changes,
    -- and that the objects it must leave alone are unchanged
  end)

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(MIGRATION)
  end)

  -- #fakeonly: it restricts the fake's identity to the declared rules, a
  -- control the real server has no counterpart for
  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(MIGRATION)
  end)

  it("check reports what run would change, and writes nothing", function()
    local res = h:migrate(MIGRATION, { mode = "check" })
    assert.no_writes()
    assert(#res.findings > 0, "check reported nothing about a fixture that run changes: "
      .. "check lists the writes walk would make; a risk is a ctx:finding")
  end)

  it("plan writes nothing", function()
    local res = h:migrate(MIGRATION, { mode = "plan" })
    assert.no_writes()
    assert.is_true(#res.writes > 0, "plan showed no write")
  end)

  -- TODO: a case per API failure it must survive or stop on (h:faults{...}, then
  -- assert that the fault fired: h:fired()), and per object it must leave alone.
end)
]==]

local function fill(template, values)
  return (template:gsub("{{(%u+)}}", function(k) return assert(values[k], k) end))
end

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

-- The new migration's number: `given` (from `new NN-NAME`) unless it is out
-- of range or taken, else the next after every number taken: the
-- directory's, and this build's migrations unless --migrations names
-- another set. Returns the number, or nil and why.
local function number_for(given, dir, opts)
  local taken, highest = {}, 0
  local function take(filename)
    local ok, n = pcall(discovery.classify, filename)
    if ok and n then
      taken[n] = taken[n] or filename
      if n > highest then highest = n end
    end
  end
  for _, filename in ipairs(assert(sys.listdir(dir))) do take(filename) end
  if not opts.migrations then
    for _, b in ipairs(sys.builtin_migrations()) do take(b.name) end
  end
  if given == nil then return highest + 1 end
  local number = math.tointeger(tonumber(given))
  if number == nil or number > 1000000 then
    return nil, ("migration number %s is out of range (0..1000000)"):format(given)
  end
  if taken[number] then
    return nil, ("migration number %d is taken (%s)"):format(number, taken[number])
  end
  return number
end

function M.run(opts, args)
  return runner.protect(opts, function(log)
    local name = args[1]
    if name == nil or args[2] ~= nil then
      io.stderr:write("usage: cozy-migrate new [--number NN] [NN-]NAME (lowercase words joined by "
        .. "'-'; NN: its number)\n")
      return 2
    end
    -- `new 49-tenant-labels` (or `new --number 49 tenant-labels`) ports the
    -- platform's script 49 under its own number
    local given = name:match("^(%d+)%-")
    if given then name = name:sub(#given + 2) end
    if opts.number ~= nil then
      if given and math.tointeger(tonumber(given)) ~= opts.number then
        io.stderr:write(("cozy-migrate: --number %d and %s-%s name two numbers\n")
          :format(opts.number, given, name))
        return 2
      end
      given = tostring(opts.number)
    end
    if not name:match("^[a-z0-9][a-z0-9-]*$") or name:match("%-%-") or name:match("%-$") then
      io.stderr:write(("cozy-migrate: invalid migration name %q: use lowercase letters, digits "
        .. "and single '-'\n")
        :format(name))
      return 2
    end
    local dir = (opts.migrations or "migrations"):gsub("/+$", "")
    if sys.stat(dir) ~= "directory" then
      io.stderr:write(("cozy-migrate: %s is not a directory (run from the source tree or give "
        .. "--migrations)\n")
        :format(dir))
      return 2
    end
    local number, why = number_for(given, dir, opts)
    if number == nil then
      io.stderr:write("cozy-migrate: ", why, "\n")
      return 2
    end
    local base = ("%d-%s"):format(number, name)
    local file = dir .. "/" .. base .. ".lua"
    local root = dir:match("^(.*)/[^/]+$") or "."
    local spec_dir = root == "." and "spec/migrations" or (root .. "/spec/migrations")
    local spec = spec_dir .. "/" .. base .. "_spec.lua"
    -- the spec runs from the tree's root (the directory above the migrations)
    local from_root = root == "." and file or file:sub(#root + 2)
    local values = { NUMBER = tostring(number), NEXT = tostring(number + 1), NAME = name,
      FILE = from_root }
    -- both or neither: check both before writing either
    for _, path in ipairs { file, spec } do
      if exists(path) then
        io.stderr:write("cozy-migrate: ", path, " already exists\n")
        return 1
      end
    end
    local ok, err = write_new(file, fill(migration_template, values))
    if not ok then
      io.stderr:write("cozy-migrate: ", err, "\n")
      return 1
    end
    if sys.stat(spec_dir) ~= "directory" then
      os.execute("mkdir -p '" .. spec_dir:gsub("'", "'\\''") .. "'")
    end
    ok, err = write_new(spec, fill(spec_template, values))
    if not ok then
      os.remove(file)
      io.stderr:write("cozy-migrate: ", err, " (", file, " not created either)\n")
      return 1
    end
    log:info("created migration", { file = file })
    log:info("created spec", { file = spec })
    io.stdout:write(file, "\n", spec, "\n")
    return 0
  end)
end

return M
