-- A migration's files (the table's `files`, docs/engine-api.md, "Files"):
-- read-only paths the image ships (a CRD directory), declared by name, and
-- the only part of the filesystem a migration reaches (the sandbox has no io
-- and no os).
--
--   files = { crds = "$ETCD_CRD_DIR" }     -- a declared parameter's value
--   files = { crds = "/etcd-operator-crds" } -- or a fixed absolute path
--
-- ctx.files:read(key [, relative]), .json(key [, relative]),
-- .list(key [, suffix]), .exists(key [, relative]). A relative path is
-- plain names joined by "/": no "..", ".", empty or absolute part; what it
-- names is resolved (symlinks followed) and must still lie inside the
-- declared path, itself resolved, so a symlink out of the directory is
-- refused too. What is read is the resolved file. A refusal is kind
-- "denied" (exit 1), as an undeclared request is.
local errors = require "cozy.errors"
local validate = require "cozy.validate"
local json = require "cozy.json"
local sys = require "cozy.sys"

local files = {}

-- Bounds: a file read whole into the step's memory, a listing.
files.MAX_BYTES = 16 * 1024 * 1024
files.MAX_ENTRIES = 10000

local KEY = "^[a-z][a-z0-9_]*$"

-- Checks def.files: key -> absolute path or "$PARAMETER" (a declared one).
function files.validate(map, params, invalid)
  if map == nil then return end
  local function checked(name, value, expected, says)
    local why = validate.why(name, value, expected, { says = says })
    if why then invalid(why) end
  end
  checked("files", map, "table", "a table { name = path or \"$PARAMETER\" }")
  local declared = {}
  for _, p in ipairs(type(params) == "table" and params or {}) do
    if type(p) == "table" and p.name then declared[p.name] = p end
  end
  for k, v in next, map do
    checked("files: key " .. errors.safe_text(k), k,
      function(x) return type(x) == "string" and x:find(KEY) end, ("a name (%s)"):format(KEY))
    checked("files." .. k, v, "string", "a path or \"$PARAMETER\"")
    local param = v:match("^%$([A-Z_][A-Z0-9_]*)$")
    if param then
      if not declared[param] then
        invalid(("files.%s names parameter %s, which `parameters` does not declare")
          :format(k, param))
      end
    elseif v:sub(1, 1) ~= "/" or v:find("%c") then
      invalid(("files.%s must be an absolute path or \"$PARAMETER\", got %q"):format(k, v))
    end
  end
end

-- Migration m's declared paths: key -> absolute path (a parameter's value
-- put in), given its parameters' values. Raises kind "usage" for a
-- parameter whose value is not an absolute path.
function files.resolve(m, values)
  local roots = {}
  for k, v in next, (m.definition and m.definition.files or {}) do
    local param = v:match("^%$([A-Z_][A-Z0-9_]*)$")
    local path = param and values[param] or v
    if param and (path == nil or path:sub(1, 1) ~= "/") then
      errors.raise("usage",
        ("migration %s: files.%s comes from parameter %s, whose value %s is not an absolute path")
        :format(m.name, k, param, path == nil and "(unset, no default)" or ("%q"):format(path)),
        { migration = m.name, parameter = param })
    end
    roots[k] = path
  end
  return roots
end

-- The declarations as list and check show them: { name =, path =, from = }.
function files.describe(m, roots)
  local out = {}
  for k, v in next, (m.definition and m.definition.files or {}) do
    out[#out + 1] = { name = k, declared = v, path = roots and roots[k] or nil }
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function denied(message) errors.raise("denied", "ctx.files: " .. message) end

local function checked_relative(rel)
  if rel == nil then return nil end
  if type(rel) ~= "string" or rel == "" or #rel > 4096 then
    denied("a relative path must be a non-empty string")
  end
  if rel:find("%z") or rel:find("%c") then
    denied(("%q: control characters in a path"):format(rel))
  end
  if rel:sub(1, 1) == "/" then
    denied(("%q is absolute: paths are relative to a declared one"):format(rel))
  end
  for part in (rel .. "/"):gmatch("([^/]*)/") do
    if part == "" or part == "." or part == ".." then
      denied(("%q: %q is not allowed in a path (plain names joined by /)"):format(rel,
        part == "" and "//" or part))
    end
  end
  return rel
end

-- The facade a migration gets as ctx.files: closures over the resolved
-- declared paths. `seal` seals it (sandbox.seal), `method` makes a function
-- callable with `:` or `.` (context.lua's); log is the step's logger.
function files.facade(roots, seal, method, log)
  local f = {}
  -- key's path with relative under it, resolved; what exists there ("file",
  -- "directory", ...) or nil when nothing does
  local function locate(key, rel)
    if type(key) ~= "string" or roots[key] == nil then
      denied(("%s is not a declared file (the migration table's `files`)")
        :format(errors.safe_text(key)))
    end
    rel = checked_relative(rel)
    local root = roots[key]
    local real_root = sys.realpath(root)
    if real_root == nil then return nil, root end
    local wanted = rel and (root .. "/" .. rel) or root
    local real = sys.realpath(wanted)
    if real == nil then return nil, wanted end
    if rel and real:sub(1, #real_root + 1) ~= real_root .. "/" then
      denied(("%s resolves to %s, outside the declared %s (%s)")
        :format(wanted, real, key, real_root))
    end
    return sys.stat(real), real
  end
  local function read(key, rel)
    local what, path = locate(key, rel)
    if what ~= "file" then
      errors.raise("migration",
        ("ctx.files: %s is %s"):format(path, what and ("a " .. what .. ", not a file")
        or "absent"))
    end
    local fh, err = io.open(path, "rb")
    if fh == nil then errors.raise("migration", "ctx.files: cannot read " .. tostring(err)) end
    local data = fh:read(files.MAX_BYTES + 1)
    fh:close()
    data = data or ""
    if #data > files.MAX_BYTES then
      errors.raise("migration", ("ctx.files: %s is larger than %d bytes")
        :format(path, files.MAX_BYTES))
    end
    log:write("debug", ("read %s (%d bytes)"):format(path, #data))
    return data, path
  end
  -- what is at key (and relative under it): "file", "directory", ... or nil
  f.exists = method(f, function(key, rel) return (locate(key, rel)) end)
  f.read = method(f, function(key, rel) return (read(key, rel)) end)
  f.json = method(f, function(key, rel)
    local data, path = read(key, rel)
    local ok, v = pcall(json.decode, data)
    if not ok then
      errors.raise("migration", ("ctx.files: %s is not JSON: %s"):format(path, errors.safe_text(v)))
    end
    return v
  end)
  -- the names of the regular files directly in the declared directory
  -- (those ending in suffix when given), sorted; symlinks leading out are left out
  f.list = method(f, function(key, suffix)
    local why = validate.why("suffix", suffix, "string", true)
    if why then denied("list(key, suffix): " .. why) end
    local what, dir = locate(key, nil)
    if what ~= "directory" then
      errors.raise("migration",
        ("ctx.files: %s is %s"):format(dir, what and ("a " .. what .. ", not a directory")
        or "absent"))
    end
    local names = assert(sys.listdir(dir))
    if #names > files.MAX_ENTRIES then
      errors.raise("migration", ("ctx.files: %s holds more than %d entries")
        :format(dir, files.MAX_ENTRIES))
    end
    table.sort(names)
    local out = {}
    for _, name in ipairs(names) do
      if name:sub(1, 1) ~= "." and (suffix == nil or name:sub(-#suffix) == suffix)
        and not name:find("%c") then
        local real = sys.realpath(dir .. "/" .. name)
        if real and real:sub(1, #dir + 1) == dir .. "/" and sys.stat(real) == "file" then
          out[#out + 1] = name
        end
      end
    end
    return out
  end)
  return seal(f, "ctx.files")
end

return files
