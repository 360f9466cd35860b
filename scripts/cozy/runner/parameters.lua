-- A migration's parameters (the table's `parameters`, docs/engine-api.md,
-- "Parameters"): the input a migration takes, each read from the runner's
-- environment, as the platform's scripts read theirs (${NAME:-default}).
--
--   parameters = {
--     { name = "ETCD_ADOPT_SKIP_BACKUP", default = "0", allowed = { "0", "1" },
--       description = "adopt etcd without the pre-adoption snapshot" },
--   }
--
-- Declarations are checked when the migration is loaded (an invalid set,
-- exit 2); values when a run or plan has decided its steps, before the lock
-- and before any step starts (a bad value: kind "usage", exit 2, nothing
-- run), and again by the step executor (check, the spec harness). A value is
-- a string; set but empty reads as unset (the shell's `:-`).
local errors = require "cozy.errors"
local validate = require "cozy.validate"

local parameters = {}

local NAME = "^[A-Z_][A-Z0-9_]*$"
local MAX_NAME, MAX_VALUE = 63, 4096
local declaration_keys = { name = true, default = true, allowed = true, description = true }

-- The engine's own environment: a parameter cannot take it over, or a
-- value meant for the engine would also be a migration's input.
local ENGINE = { NAMESPACE = true, TARGET_VERSION = true, CURRENT_VERSION = true, KUBECONFIG = true,
  POD_NAME = true, POD_NAMESPACE = true, HOME = true, PATH = true, HTTPS_PROXY = true,
  HTTP_PROXY = true, NO_PROXY = true }
local ENGINE_PREFIXES = { "COZY_MIGRATE_", "KUBERNETES_" }

local function engine_name(name)
  if ENGINE[name] then return true end
  for _, p in ipairs(ENGINE_PREFIXES) do
    if name:sub(1, #p) == p then return true end
  end
  return false
end

local function one_line(v)
  return type(v) == "string" and #v <= MAX_VALUE and not v:find("[%c]")
end

-- Checks def.parameters; `invalid(message)` raises (discovery's, naming the
-- file). Returns nothing.
function parameters.validate(list, invalid)
  if list == nil then return end
  local function checked(name, value, expected, says)
    local why = validate.why(name, value, expected, says and { says = says })
    if why then invalid(why) end
  end
  checked("parameters", list, "table", "an array of { name =, description =, ... }")
  local seen, n = {}, 0
  for _ in next, list do n = n + 1 end
  checked("parameters", n, function(v) return v == #list end, "an array (keys 1..n)")
  for i, p in ipairs(list) do
    local at = ("parameters[%d]"):format(i)
    checked(at, p, "table", "a table { name =, description =, default =, allowed = }")
    for k in next, p do
      if not declaration_keys[k] then
        invalid(("%s: unexpected field %q (allowed: name, description, default, allowed)")
          :format(at, tostring(k)))
      end
    end
    checked(at .. ": name", p.name,
      function(v) return type(v) == "string" and v:find(NAME) and #v <= MAX_NAME end,
      ("an environment variable name (%s, at most %d characters)"):format(NAME, MAX_NAME))
    at = ("parameter %s"):format(p.name)
    if engine_name(p.name) then
      invalid(("%s: the name is the engine's own (its environment, COZY_MIGRATE_*, KUBERNETES_*)")
        :format(at))
    end
    if seen[p.name] then invalid(("%s is declared twice"):format(at)) end
    seen[p.name] = true
    checked(at .. ": description", p.description,
      function(v) return type(v) == "string" and v:find("%S") and not v:find("\n") end,
      "a non-empty line")
    if p.default ~= nil then
      checked(at .. ": default", p.default, one_line, ("a string of one line (at most %d bytes)")
        :format(MAX_VALUE))
    end
    if p.allowed ~= nil then
      checked(at .. ": allowed", p.allowed, function(v)
        if type(v) ~= "table" or #v == 0 then return false end
        local count = 0
        for _ in next, v do count = count + 1 end
        for _, a in ipairs(v) do if not one_line(a) then return false end end
        return count == #v
      end, "a non-empty array of strings")
      if p.default ~= nil then
        local found = false
        for _, v in ipairs(p.allowed) do found = found or v == p.default end
        if not found then
          invalid(("%s: default %q is not one of allowed"):format(at, p.default))
        end
      end
    end
  end
end

local function allowed_text(p)
  local quoted = {}
  for i, v in ipairs(p.allowed) do quoted[i] = ("%q"):format(v) end
  return table.concat(quoted, ", ")
end

-- The values of migration m's parameters: name -> value (a parameter with
-- no default, unset, is absent), and name -> where it came from ("env" or
-- "default"). getenv defaults to os.getenv. Raises kind "usage" for a value
-- its declaration does not allow, naming the migration, the parameter and
-- what is allowed.
function parameters.resolve(m, getenv)
  getenv = getenv or os.getenv
  local values, sources = {}, {}
  for _, p in ipairs(m.definition and m.definition.parameters or {}) do
    local v = getenv(p.name)
    local source = "env"
    if v == nil or v == "" then v, source = p.default, "default" end
    if v ~= nil and source == "env" then
      if #v > MAX_VALUE or v:find("[%c]") then
        errors.raise("usage", ("migration %s: parameter %s must be one line of at most %d bytes")
          :format(m.name, p.name, MAX_VALUE), { migration = m.name, parameter = p.name })
      end
      if p.allowed then
        local found = false
        for _, a in ipairs(p.allowed) do found = found or a == v end
        if not found then
          errors.raise("usage", ("migration %s: parameter %s=%q is not allowed (allowed: %s)")
            :format(m.name, p.name, v, allowed_text(p)), { migration = m.name, parameter = p.name })
        end
      end
    end
    if v ~= nil then values[p.name], sources[p.name] = v, source end
  end
  return values, sources
end

-- The declarations as list and check show them (plain data), with the
-- value and its source when `values` are given.
function parameters.describe(m, values, sources)
  local out = {}
  for _, p in ipairs(m.definition and m.definition.parameters or {}) do
    local allowed = nil
    if p.allowed then allowed = table.move(p.allowed, 1, #p.allowed, 1, {}) end
    out[#out + 1] = { name = p.name, default = p.default, allowed = allowed,
      description = p.description, value = values and values[p.name] or nil,
      source = sources and sources[p.name] or nil }
  end
  return out
end

-- One line per parameter, for text output.
function parameters.text(p)
  local parts = { p.name }
  if p.value ~= nil then parts[#parts + 1] = ("= %q (%s)"):format(p.value, p.source) end
  if p.default ~= nil then parts[#parts + 1] = ("default %q"):format(p.default) end
  if p.allowed then parts[#parts + 1] = "allowed " .. allowed_text(p) end
  parts[#parts + 1] = "- " .. p.description
  return table.concat(parts, " ")
end

-- Every Lua step's parameters (and the files paths they give), before a
-- run or plan starts its first step.
function parameters.check_steps(steps)
  local files = require "cozy.runner.files"
  for _, m in ipairs(steps) do
    if m.kind == "lua" then files.resolve(m, (parameters.resolve(m))) end
  end
end

return parameters
