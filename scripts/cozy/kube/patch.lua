-- Local JSON values work for cozy.kube: deep copy and comparison, RFC 6901
-- pointers, RFC 6902 JSON patch and RFC 7386 merge patch applied in memory.
-- Used by dry_run = "client" (the result a write would have) and by the
-- create read-back rule (is what the server holds what we sent?).
local json = require "cozy.json"

local patch = {}

local null = json.null
local array_mt, object_mt = json.array_mt, json.object_mt

local function is_array(t)
  local mt = getmetatable(t)
  if mt ~= nil and mt == array_mt then return true end
  if mt ~= nil and mt == object_mt then return false end
  return rawget(t, 1) ~= nil
end
patch.is_array = is_array

-- json.copy: every change copies the whole object, so it is C (core/json_value.c)
local deepcopy = json.copy
patch.deepcopy = deepcopy

local function equal(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then
    -- 1 and 1.0 are the same JSON number
    return type(a) == "number" and type(b) == "number" and a == b
  end
  for k, v in pairs(a) do
    if not equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end
patch.equal = equal

-- Is every field of `want` present with the same value in `got`? (Arrays
-- compare whole.) Server-set metadata is not in `want` and so not compared.
local function contains(got, want)
  if type(want) ~= "table" or type(got) ~= "table" then return equal(got, want) end
  if is_array(want) then return equal(got, want) end
  for k, v in pairs(want) do
    if not contains(got[k], v) then return false end
  end
  return true
end
patch.contains = contains

local function unescape(token)
  -- (most tokens have no escape: no two substitutions for nothing)
  if not token:find("~", 1, true) then return token end
  return (token:gsub("~1", "/"):gsub("~0", "~"))
end

-- Splits an RFC 6901 pointer into tokens; "" is the whole document.
function patch.pointer(p)
  if p == "" then return {} end
  if p:sub(1, 1) ~= "/" then error(("invalid JSON pointer %q"):format(p), 0) end
  local tokens = {}
  for token in (p:sub(2) .. "/"):gmatch("(.-)/") do tokens[#tokens + 1] = unescape(token) end
  return tokens
end

local function index(container, token, path, allow_end)
  if is_array(container) then
    if allow_end and token == "-" then return #container + 1 end
    local i = token:match("^%d+$") and tonumber(token)
    if i == nil or (token ~= "0" and token:sub(1, 1) == "0") then
      error(("path %q: %q is not an array index"):format(path, token), 0)
    end
    return i + 1
  end
  return token
end

-- Parent container and key of the pointer's target.
local function locate(doc, path, allow_end)
  local tokens = patch.pointer(path)
  if #tokens == 0 then return nil, nil end
  local cur = doc
  for i = 1, #tokens - 1 do
    if type(cur) ~= "table" then error(("path %q does not exist"):format(path), 0) end
    cur = cur[index(cur, tokens[i], path)]
    if cur == nil then error(("path %q does not exist"):format(path), 0) end
  end
  if type(cur) ~= "table" then error(("path %q does not exist"):format(path), 0) end
  return cur, index(cur, tokens[#tokens], path, allow_end)
end

local function get(doc, path)
  local parent, key = locate(doc, path)
  if parent == nil then return doc end
  local v = parent[key]
  if v == nil then error(("path %q does not exist"):format(path), 0) end
  return v
end

local function remove(doc, path)
  local parent, key = locate(doc, path)
  if parent == nil then error("cannot remove the whole document", 0) end
  if parent[key] == nil then error(("path %q does not exist"):format(path), 0) end
  local v = parent[key]
  if is_array(parent) then table.remove(parent, key) else parent[key] = nil end
  return v
end

local function add(doc, path, value)
  local parent, key = locate(doc, path, true)
  if parent == nil then return value end
  if is_array(parent) then
    if key > #parent + 1 then error(("path %q: index out of range"):format(path), 0) end
    table.insert(parent, key, value)
  else
    parent[key] = value
  end
  return doc
end

-- A shallow copy of t (its metatable kept), marked in owned.
local function own(t, owned)
  local c = {}
  for k, v in next, t do c[k] = v end
  owned[c] = true
  return setmetatable(c, getmetatable(t))
end

-- Replaces each container on the way to path's parent that doc does not
-- own yet by a shallow copy of its own, walking as locate walks (so the
-- same bad token raises the same error first).
local function own_path(doc, path, owned)
  local tokens = patch.pointer(path)
  local cur = doc
  for i = 1, #tokens - 1 do
    if type(cur) ~= "table" then return end
    local key = index(cur, tokens[i], path)
    local child = cur[key]
    if type(child) ~= "table" then return end
    if not owned[child] then
      child = own(child, owned)
      cur[key] = child
    end
    cur = child
  end
end

-- Applies RFC 6902 ops to a copy of doc; raises { patch_error = message }
-- (a failed test has test_failed = true), as the server answers 422.
-- shared: the copy is made only of the containers the ops change (and
-- those on their paths); every other table of the result is doc's own, so
-- doc must not change while the result is in use (the plan's diff makes
-- each object's before from its after so, bench/README.md).
function patch.json_patch(doc, ops, shared)
  local owned
  if shared and type(doc) == "table" then
    owned = {}
    doc = own(doc, owned)
  else
    doc = deepcopy(doc)
  end
  for n, op in ipairs(ops) do
    local ok, err = pcall(function()
      local kind, path = op.op, op.path
      if type(path) ~= "string" then error("op has no path", 0) end
      if owned
        and (kind == "add" or kind == "remove" or kind == "replace" or kind == "move"
          or kind == "copy") then
        -- (an earlier op may have put another value at the root: a move to "")
        if type(doc) == "table" and not owned[doc] then doc = own(doc, owned) end
        if kind == "move" and type(op.from) == "string" then own_path(doc, op.from, owned) end
        own_path(doc, path, owned)
      end
      if kind == "add" then
        doc = add(doc, path, deepcopy(op.value))
      elseif kind == "remove" then
        remove(doc, path)
      elseif kind == "replace" then
        get(doc, path)
        local parent, key = locate(doc, path)
        if parent == nil then doc = deepcopy(op.value) else parent[key] = deepcopy(op.value) end
      elseif kind == "move" then
        local v = remove(doc, op.from)
        doc = add(doc, path, v)
      elseif kind == "copy" then
        doc = add(doc, path, deepcopy(get(doc, op.from)))
      elseif kind == "test" then
        local okget, v = pcall(get, doc, path)
        if not okget or not equal(v, op.value) then
          error({ test_failed = true, message = ("test operation at %q failed"):format(path) })
        end
      else
        error(("unknown op %q"):format(tostring(kind)), 0)
      end
    end)
    if not ok then
      if type(err) == "table" then
        err.patch_error = ("op %d: %s"):format(n, err.message)
        error(err, 0)
      end
      error({ patch_error = ("op %d (%s %s): %s"):format(n, tostring(op.op), tostring(op.path),
        tostring(err)) }, 0)
    end
  end
  return doc
end

-- The RFC 6902 ops that turn `a` into `b` (both decoded JSON values), as
-- narrow as the difference: a key added, removed or changed is one op; an
-- array that grew keeps its elements and gets `/-` adds, one that shrank
-- loses its last elements; a changed element is changed where it is. So a
-- list is never replaced wholesale, and a container `b` has that `a` lacks
-- is one add that creates it. Returns an array of ops (empty: no
-- difference). json.diff (core/json_value.c has the rules): every change
-- walks the whole object, and in Lua that was a tenth of a fleet run's CPU.
patch.diff = json.diff

-- RFC 7386 on a copy of target.
function patch.merge_patch(target, p)
  if type(p) ~= "table" or is_array(p) then return deepcopy(p) end
  if type(target) ~= "table" or is_array(target) then target = {} else target = deepcopy(target) end
  for k, v in pairs(p) do
    if v == null then
      target[k] = nil
    else
      target[k] = patch.merge_patch(target[k], v)
    end
  end
  return target
end

return patch
