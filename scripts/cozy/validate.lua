-- cozy.validate: the one argument validator of the engine's Lua API, in the
-- spirit of Neovim's vim.validate.
--
-- A check is a tuple: the argument's name as the message says it, its value,
-- what it must be (a type name, a list of them, or a predicate) and whether
-- it may be absent. What it must be is a type name (type()'s, or "integer",
-- "non-empty string"), a list of them (any one), { one_of = { values } } (one
-- of these values), or a predicate (a function returning true when it is).
-- A value that is not what it must be raises
--
--   <where>: <name> must be <what>[, not <value> | , got <value>]
--
-- positioned at the line that called the checked function (as Lua's own
-- argument errors are), never at the engine's: `level` counts as error()'s
-- does from the function that calls the validator (2, its caller, is the
-- usual), and frames of the engine's own above it are passed over (a
-- migration's call through ctx's wrappers names the migration's line). In a
-- step, such a message is what the step executor turns into the engine's one
-- error shape (cozy.errors, kind "migration", naming the migration), as any
-- error("...") a migration raises.
--
-- Reporting never runs the value's code: only type() is asked of it, and a
-- string value is quoted, cut at 60 bytes.
---@class cozy.validate
local validate = {}

-- What a type name says in a message.
local articles = {
  table = "a table", string = "a string", ["function"] = "a function", number = "a number",
  boolean = "a boolean", integer = "an integer", ["non-empty string"] = "a non-empty string",
}

-- The pseudo-types beyond type()'s names.
local special = {
  integer = function(v) return math.type(v) == "integer" end,
  ["non-empty string"] = function(v) return type(v) == "string" and v ~= "" end,
}

local function is_type(v, name)
  local test = special[name]
  if test then return test(v) end
  return type(v) == name
end

local function quoted_list(values)
  local words = {}
  for i, v in ipairs(values) do words[i] = ("%q"):format(v) end
  if #words == 1 then return words[1] end
  return table.concat(words, ", ", 1, #words - 1) .. " or " .. words[#words]
end

local function says_of(expected)
  if type(expected) == "string" then return articles[expected] or ("a " .. expected) end
  if expected.one_of then return quoted_list(expected.one_of) end
  local words = {}
  for i, name in ipairs(expected) do words[i] = articles[name] or ("a " .. name) end
  if #words == 1 then return words[1] end
  return table.concat(words, ", ", 1, #words - 1) .. " or " .. words[#words]
end

--- How a value is shown after "not"/"got": a string quoted (cut), else its type.
---@param v any
---@return string
function validate.shown(v)
  if type(v) == "string" then
    return #v > 60 and ("%q..."):format(v:sub(1, 60)) or ("%q"):format(v)
  end
  return "a " .. type(v)
end
local shown = validate.shown

local function accepts(value, expected)
  local t = type(expected)
  if t == "function" then return expected(value) and true or false end
  if t == "string" then return is_type(value, expected) end
  if expected.one_of then
    for _, v in ipairs(expected.one_of) do
      if rawequal(value, v) then return true end
    end
    return false
  end
  for _, name in ipairs(expected) do
    if is_type(value, name) then return true end
  end
  return false
end

local shows = { ["not"] = ", not ", got = ", got " }

-- Raises message at `level` (counted from the validator's caller, as
-- error()'s), moved up past the engine's own frames (chunks of scripts/cozy/,
-- and C functions between them): the line named is the first outside the
-- engine that led to the call, a migration's through ctx's wrappers and
-- proxies, however many engine frames lie between. When every frame above
-- is the engine's (engine code calling engine code), `level` stands.
local function raise(message, level)
  local at = level + 2 -- from here: 1 raise, 2 the validator, 3 its caller
  local probe = at
  while true do
    local info = debug.getinfo(probe, "S")
    if info == nil then
      probe = at
      break
    end
    if info.what ~= "C" and not info.source:find("^@scripts/cozy/") then break end
    probe = probe + 1
  end
  error(message, probe)
end

-- The message for a value `name` that is not `expected` (more: see validate.arg).
local function message(where, name, value, expected, more)
  local says = more.says or (type(expected) ~= "function" and says_of(expected)) or "valid"
  local tail = more.show and (shows[more.show] .. shown(value)) or ""
  return ("%s%s must be %s%s"):format(where and (where .. ": ") or "", name, says, tail)
end

local function normalized(more)
  if more == nil or more == false then return {} end
  if more == true then return { optional = true } end
  return more
end

---@alias cozy.validate.expected string|string[]|{ one_of: any[] }|fun(value: any): any

---@class cozy.validate.more
---@field optional? boolean nil is accepted
---@field says? string what the value must be, in words ("a function(value, path)")
---@field show? "not"|"got" add ", not <value>" or ", got <value>" to the message

--- Checks one argument; raises, positioned `level` frames above the function
--- that calls it (error()'s counting), when it is not what it must be.
---   validate.arg(2, "list(opts)", "opts", opts, "table", true)
---   validate.arg(2, "obj.walk(v, fn)", "fn", fn, "function", { says = "a function(value, path)" })
---@param level integer error()'s level, counted from the caller of validate.arg
---@param where string|nil what is checked ("update_each(items, edit, opts)"), the message's prefix
---@param name string the argument as the message names it
---@param value any
---@param expected cozy.validate.expected a type name ("table", "integer", "non-empty string", ...),
--- a list of them, { one_of = { values } }, or a predicate
---@param more? boolean|cozy.validate.more true: optional
---@return any value the value, checked
function validate.arg(level, where, name, value, expected, more)
  more = normalized(more)
  if value == nil and more.optional then return value end
  if accepts(value, expected) then return value end
  raise(message(where, name, value, expected, more), level)
end

--- Why a value is not what it must be ("<name> must be <what>..."), or nil
--- when it is: for a check whose failure is not an argument error (a
--- migration file's fields, refused as kind "invalid" naming the file).
---@param name string
---@param value any
---@param expected cozy.validate.expected
---@param more? boolean|cozy.validate.more
---@return string|nil why
function validate.why(name, value, expected, more)
  more = normalized(more)
  if value == nil and more.optional then return nil end
  if accepts(value, expected) then return nil end
  return message(nil, name, value, expected, more)
end

--- Checks several arguments, in order: each tuple is { name, value, expected [, more] }
--- as validate.arg takes them (a tuple's value may be nil, so it is read by index).
---   validate.args(2, "join(left, right, opts)", { { "opts.key", opts.key, "function" } })
---@param level integer
---@param where string|nil
---@param tuples table[]
function validate.args(level, where, tuples)
  for _, tuple in ipairs(tuples) do
    local more = normalized(tuple[4])
    local value = tuple[2]
    if not (value == nil and more.optional) and not accepts(value, tuple[3]) then
      raise(message(where, tuple[1], value, tuple[3], more), level)
    end
  end
end

return validate
