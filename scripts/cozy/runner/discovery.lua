-- Finding and validating migrations. Everything here happens before the
-- engine talks to the cluster, so an invalid set is refused (exit 2) without
-- a single write.
--
-- A migration set is the binary's own (the shipped migrations/*.lua) plus
-- a directory's (--migrations DIR, $COZY_MIGRATE_MIGRATIONS, /migrations),
-- which holds legacy scripts (`NN` or `NN-name`, whatever their mode) and
-- may hold Lua files of numbers the binary does not have.
local errors = require "cozy.errors"
local sandbox = require "cozy.sandbox"
local sys = require "cozy.sys"
local parameters = require "cozy.runner.parameters"
local files = require "cozy.runner.files"
local validate = require "cozy.validate"
local tools = require "cozy.runner.tools"

local discovery = {}

-- An invalid migration set raises errors kind "invalid" (exit 2), naming the file.
local function invalid(file, message, fmt_args)
  if fmt_args then message = message:format(table.unpack(fmt_args)) end
  errors.raise("invalid", file and (file .. ": " .. message) or message, { file = file })
end

function discovery.is_invalid(e)
  return errors.is(e, "invalid")
end

-- What a migration table may hold. `permissions` lets `check` ask the API
-- server (SelfSubjectAccessReview) whether this runner may do what the
-- migration needs.
-- `tools` and `finally`: cozy.runner.tools and cozy.runner.finally.
local allowed_keys = { description = true, run = true, check = true, walk = true,
  permissions = true, timeout = true, parameters = true, files = true, tools = true,
  finally = true }

-- A declared permission: what `check` asks and `rbac` grants.
local permission_keys = { verb = true, group = true, resource = true, subresource = true,
  namespace = true, name = true }

-- A copy of what a migration file returned, read with next and rawget
-- only: a table with a metatable is refused, so validating the definition
-- calls nothing the file supplied (an __index or __pairs that loops would
-- run outside any watch, and one that answers differently each time could
-- pass validation and then change).
local function plain_copy(v, file, depth)
  if type(v) ~= "table" then return v end
  if debug.getmetatable(v) ~= nil then
    invalid(file, "the migration table must be plain data: a table in it has a metatable")
  end
  if depth > 4 then invalid(file, "the migration table is nested too deeply") end
  local c = {}
  for k, x in next, v do c[k] = plain_copy(x, file, depth + 1) end
  return c
end

-- Validates the table a migration file returned; raises "invalid" naming
-- the file. Returns the validated copy, which is what the engine uses.
function discovery.validate_definition(def, file)
  if type(def) ~= "table" then
    invalid(file, "must return a table { description = ..., run = function(ctx) ... end }, got %s",
      { type(def) })
  end
  def = plain_copy(def, file, 1)
  for k in pairs(def) do
    if not allowed_keys[k] then
      invalid(file,
        "unexpected field %q in the migration table (allowed: description, run, check, "
        .. "walk, permissions, "
        .. "timeout, parameters, files, tools, finally)",
        { tostring(k) })
    end
  end
  local function checked(name, expected, more)
    local why = validate.why(name, def[name], expected, more)
    if why then invalid(file, why) end
  end
  checked("description", function(v) return type(v) == "string" and v:find("%S") end,
    { says = "a non-empty string" })
  if def.description:find("\n") then invalid(file, "description must be one line") end
  if def.walk ~= nil then
    -- one walk for run and check (docs/engine-api.md, "One walk for check and run")
    checked("walk", "function", { says = "a function(ctx)" })
    -- (a rule, cozy.rule, names its walk as its run and check too)
    if (def.run ~= nil and def.run ~= def.walk) or (def.check ~= nil and def.check ~= def.walk) then
      invalid(file, "walk is run and check at once: give walk alone, or run (and check)")
    end
  else
    checked("run", "function", { says = "a function(ctx) (or walk, for run and check at once)" })
  end
  checked("finally", "function", { optional = true, says = "a function(ctx) or absent" })
  local tool_access = tools.validate(def, function(message) invalid(file, message) end)
  checked("check", "function", { optional = true, says = "a function(ctx) or absent" })
  checked("timeout", function(v) return type(v) == "number" and v > 0 and v < math.huge end,
    { optional = true, says = "a positive number of seconds" })
  if def.permissions ~= nil then
    checked("permissions", "table", { says = "an array" })
    for i, p in ipairs(def.permissions) do
      local ok = type(p) == "table" and type(p.verb) == "string" and type(p.resource) == "string"
      if ok then
        for k, v in pairs(p) do
          if k == "check_only" then
            if v ~= true then ok = false end
          elseif not permission_keys[k] or type(v) ~= "string" then
            ok = false
          end
        end
      end
      if not ok then
        invalid(file,
          "permissions[%d] must be { verb = string, resource = string, group = string or nil, "
          .. "subresource, namespace, name = string or nil, check_only = true or nil }", { i })
      end
    end
  end
  -- what the declared tools do on the cluster is the migration's to ask for
  -- too: the gate judges a rehearsed tool's requests by them, `rbac` grants
  -- them, `check` reviews them
  if #tool_access > 0 then
    def.permissions = def.permissions or {}
    for _, p in ipairs(tool_access) do def.permissions[#def.permissions + 1] = p end
  end
  -- parameters and files (cozy.runner.parameters, cozy.runner.files)
  local function invalid_here(message) invalid(file, message) end
  parameters.validate(def.parameters, invalid_here)
  files.validate(def.files, def.parameters, invalid_here)
  return def
end

-- The permissions a mode needs: `run` (and plan) all but those marked
-- check_only (what only check() reads), `check` every one. The step's gate,
-- `rbac` (the hook's Role against the preflight's) and `check` take them here.
function discovery.permissions_for(def, mode)
  local out = {}
  for _, p in ipairs(def and def.permissions or {}) do
    if mode == "check" or not p.check_only then out[#out + 1] = p end
  end
  return out
end

-- Parses a file name. Returns number, kind ("lua" | "legacy"), or nil for
-- files that are not migrations (README, dot files, ...).
-- A number that does not fit an integer (or is absurdly large) raises
-- "invalid": a file that looks like a migration is never silently skipped.
local MAX_NUMBER = 1000000

local function number_of(filename, digits)
  local n = #digits <= 7 and math.tointeger(tonumber(digits))
  if not n or n > MAX_NUMBER then
    invalid(filename, "migration number %s is out of range (0..%d)", { digits, MAX_NUMBER })
  end
  return n
end

function discovery.classify(filename)
  if filename:sub(1, 1) == "." then return nil end
  local n = filename:match("^(%d+)%-[^/]+%.lua$")
  if n then return number_of(filename, n:gsub("^0+(%d)", "%1")), "lua" end
  if filename:match("%.lua$") then return nil end
  n = filename:match("^(%d+)$") or filename:match("^(%d+)%-[^/]+$")
  if n then return number_of(filename, n:gsub("^0+(%d)", "%1")), "legacy" end
  return nil
end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local data = f:read("a")
  f:close()
  return data
end

-- Loads a Lua migration's source into the sandbox and validates it.
local function load_lua(m)
  local def, err, stopped = sandbox.load(m.source, m.file, nil, m.compiled)
  if stopped == "signal" then
    errors.raise("interrupted", m.file .. ": " .. err, { file = m.file })
  end
  if stopped then errors.raise("invalid", m.file .. ": " .. err, { file = m.file }) end
  if def == nil then
    if err == nil then
      invalid(m.file,
        "returned nothing: must return a table { description = ..., run = function(ctx) ... end }")
    end
    -- syntax errors already read "file:line: message"
    errors.raise("invalid", tostring(err), { file = m.file })
  end
  m.definition = discovery.validate_definition(def, m.file)
  m.description = m.definition.description
  -- its declared tools, found on PATH now: a missing one is its defect
  tools.resolve(m)
end

-- sha256: the source's, when known already (a built-in migration's is
-- computed at build time; hashing here would cost a start OpenSSL's setup).
local function entry(filename, number, kind, file, source, path, sha256)
  return {
    number = number,
    name = (filename:gsub("%.lua$", "")),
    filename = filename,
    kind = kind,
    file = file,        -- as shown to people: migrations/59-x.lua or DIR/59-x.lua
    path = path,        -- on disk (legacy scripts are executed from it); nil when built in
    source = source,
    sha256 = sha256 or sys.sha256(source),
  }
end

-- The legacy directory: --migrations DIR, else $COZY_MIGRATE_MIGRATIONS
-- (set but empty: none), else /migrations when it exists (the image's
-- place for today's shell scripts), else none.
discovery.DEFAULT_DIRECTORY = "/migrations"

function discovery.directory(opts)
  if opts.migrations then return opts.migrations end
  local env = os.getenv("COZY_MIGRATE_MIGRATIONS")
  if env ~= nil then return env ~= "" and env or nil end
  if sys.stat(discovery.DEFAULT_DIRECTORY) == "directory" then
    return discovery.DEFAULT_DIRECTORY
  end
  return nil
end

-- What the command line asks for: { migrations = DIR or nil, builtin = bool }.
function discovery.options(opts)
  return { migrations = discovery.directory(opts), builtin = not opts.no_builtin }
end

local function from_directory(dir, found)
  local kind_of_dir = sys.stat(dir)
  if kind_of_dir ~= "directory" then invalid(dir, "not a directory") end
  local names = assert(sys.listdir(dir))
  table.sort(names)
  for _, filename in ipairs(names) do
    local number, kind = discovery.classify(filename)
    local path = dir .. "/" .. filename
    if number then
      local what, executable = sys.stat(path)
      if what ~= "file" then
        -- a legacy script outside the pending range must not refuse the
        -- set (see discovery.pending); a Lua file is checked whole, as before
        if kind == "lua" then invalid(path, "is not a regular file") end
        local m = entry(filename, number, kind, path, "", path)
        m.defect = "is not a regular file"
        found[#found + 1] = m
      else
        -- a legacy script runs whatever its mode (legacy.command)
        local source, err = read_file(path)
        if source == nil and kind == "lua" then invalid(path, "cannot be read: %s", { err }) end
        local m = entry(filename, number, kind, path, source or "", path)
        m.executable = executable
        if source == nil then m.defect = "cannot be read: " .. tostring(err) end
        found[#found + 1] = m
      end
    end
  end
end

-- Discovers the migration set: the built-in migrations (unless
-- opts.builtin == false) plus the files of directory opts.migrations, which
-- add to them and never replace one. A directory's legacy script whose number
-- is built in is the shell original of a port: the built-in runs in its place,
-- and the script is left out (kept in `replaced` as { file =, by = }), so that
-- the platform's whole directory can be dropped in as it is. A directory's
-- .lua whose number or name is built in is refused, naming both files: two Lua
-- migrations of one number are an authoring mistake. Returns { migrations =
-- {sorted}, by_number = {}, origin =, replaced = {} }, raising errors kind
-- "invalid" for a duplicate number or a Lua file that does not load or does
-- not return a valid table.
-- A legacy entry that is not a regular file is kept with its `defect`,
-- refused only when a run reaches it (discovery.pending).
function discovery.discover(opts)
  opts = opts or {}
  local found = {}
  local origins = {}
  local builtin_by_number, builtin_by_name, replaced = {}, {}, {}
  if opts.builtin ~= false then
    origins[#origins + 1] = "built-in"
    for _, b in ipairs(sys.builtin_migrations()) do
      local number, kind = discovery.classify(b.name)
      if number and kind == "lua" then
        local m = entry(b.name, number, kind, b.path, b.source, nil, b.sha256)
        m.builtin = true
        m.compiled = b.load -- its chunk compiled at build time (sandbox.load)
        found[#found + 1] = m
        builtin_by_number[number] = m
        builtin_by_name[b.name] = m
      end
    end
  end
  if opts.migrations then
    local dir = opts.migrations:gsub("/+$", "")
    origins[#origins + 1] = dir
    local listed = {}
    from_directory(dir, listed)
    for _, m in ipairs(listed) do
      local same = builtin_by_name[m.filename]
      if same then
        invalid(m.file,
          "shadows the built-in %s: a directory adds migrations to the built-in set and cannot "
          .. "replace one (--no-builtin runs the directory's set alone)", { same.file })
      end
      local other = builtin_by_number[m.number]
      if other and m.kind == "lua" then
        invalid(m.file,
          "migration number %d is also built in (%s): a directory adds migrations to the "
          .. "built-in set and cannot replace one (--no-builtin runs the directory's set alone)",
          { m.number, other.file })
      elseif other then
        replaced[#replaced + 1] = { file = m.file, by = other.file }
      else
        found[#found + 1] = m
      end
    end
  end
  local origin = #origins > 0 and table.concat(origins, " + ") or "none"
  table.sort(found, function(a, b)
    if a.number ~= b.number then return a.number < b.number end
    return a.filename < b.filename
  end)
  local by_number = {}
  for _, m in ipairs(found) do
    local other = by_number[m.number]
    if other then
      invalid(m.file, "duplicate migration number %d (also %s)", { m.number, other.file })
    end
    by_number[m.number] = m
  end
  for _, m in ipairs(found) do
    if m.kind == "lua" then
      load_lua(m)
    else
      m.description = "legacy script"
    end
  end
  return { migrations = found, by_number = by_number, origin = origin, replaced = replaced }
end

-- Highest migration number + 1 (the default target), or nil for an empty set.
function discovery.default_target(set)
  local last = set.migrations[#set.migrations]
  return last and last.number + 1 or nil
end

-- The versions [from, to) as the set covers them, in order: { migration = m }
-- for each version with a migration and { gap = first, through = last } for
-- each run of versions without one. Its work is proportional to the number of
-- migrations, never to the width of the range: a target of 2^31 costs what
-- a target of 60 does.
function discovery.span(set, from, to)
  local out, next_version = {}, from
  for _, m in ipairs(set.migrations) do
    if m.number >= to then break end
    if m.number >= from then
      if m.number > next_version then
        out[#out + 1] = { gap = next_version, through = m.number - 1 }
      end
      out[#out + 1] = { migration = m }
      next_version = m.number + 1
    end
  end
  if next_version < to then out[#out + 1] = { gap = next_version, through = to - 1 } end
  return out
end

-- The migrations that move `current` to `target`, in order; raises
-- "invalid" for a gap or for a migration in the range with a defect (a
-- legacy entry that is not a regular file). Only the pending range is held
-- to that: a defect outside it is for discovery.defects to report.
function discovery.pending(set, current, target)
  local steps = {}
  for _, e in ipairs(discovery.span(set, current, target)) do
    if e.gap then
      invalid(set.origin, "no migration for version %d: a gap inside [%d, %d) (have: %s)",
        { e.gap, current, target, discovery.numbers(set) })
    end
    if e.migration.defect then invalid(e.migration.file, e.migration.defect) end
    steps[#steps + 1] = e.migration
  end
  return steps
end

-- The defects of migrations outside [current, target): "file: defect" each,
-- for a warning; they never refuse a run that does not reach them.
function discovery.defects(set, current, target)
  local out = {}
  for _, m in ipairs(set.migrations) do
    if m.defect and (m.number < current or m.number >= target) then
      out[#out + 1] = ("%s: %s"):format(m.file, m.defect)
    end
  end
  return out
end

function discovery.numbers(set)
  local parts = {}
  for _, m in ipairs(set.migrations) do parts[#parts + 1] = tostring(m.number) end
  return #parts > 0 and table.concat(parts, ",") or "none"
end

return discovery
