-- cozy.obj: reading Kubernetes objects as plain decoded tables, for
-- migrations (docs/engine-api.md, "cozy.obj"). Every function takes what the
-- API server sends and never raises on a missing or mistyped field: a
-- migration's rule reads like the description it implements.
local json = require "cozy.json"

local obj = {}

local null = json.null

-- A dotted path split into its steps (digits as array indices), cached:
-- migrations read the same few paths once per object of a fleet. Bounded,
-- since a path may also be built per object.
local steps_of = {}
local cached = 0
local function steps(path)
  local s = steps_of[path]
  if s == nil then
    s = {}
    path = tostring(path) -- a non-string path is read as its text, and not cached under itself
    for part in path:gmatch("[^.]+") do s[#s + 1] = part:match("^%d+$") and tonumber(part) or part end
    if cached >= 512 then steps_of, cached = {}, 0 end
    steps_of[path], cached = s, cached + 1
  end
  return s
end

-- The value at a dotted path ("spec.template.spec"), or nil as soon as a
-- step is missing or not a table (JSON null included). Array elements are
-- reached with numbers: get(vm, "spec.template.spec.volumes.1.name").
function obj.get(o, path)
  local s = steps(path)
  for i = 1, #s do
    if type(o) ~= "table" then return nil end
    o = o[s[i]]
  end
  if o == null then return nil end
  return o
end

-- The array at a dotted path, or an empty one: `for _, v in ipairs(obj.list(vm, "..."))`.
function obj.list(o, path)
  local v = obj.get(o, path)
  if type(v) ~= "table" then return {} end
  return v
end

-- "namespace/name" (or "name" for a cluster-scoped object).
function obj.key(o)
  local md = type(o) == "table" and type(o.metadata) == "table" and o.metadata or {}
  local name = tostring(md.name)
  if type(md.namespace) == "string" then return md.namespace .. "/" .. name end
  return name
end

-- Just what names o (apiVersion, kind, metadata name, namespace, uid): to keep
-- for a finding or a log line without holding the whole object.
function obj.identity(o)
  local md = type(o) == "table" and type(o.metadata) == "table" and o.metadata or {}
  return { apiVersion = o and o.apiVersion, kind = o and o.kind,
           metadata = { name = md.name, namespace = md.namespace, uid = md.uid } }
end

-- The controller ownerReference of o, optionally only of `kind` (and of an
-- apiVersion in `group`): { apiVersion, kind, name, uid, ... } or nil.
function obj.controller_of(o, kind, group)
  for _, ref in ipairs(obj.list(o, "metadata.ownerReferences")) do
    if type(ref) == "table" and ref.controller == true and (kind == nil or ref.kind == kind)
        and (group == nil or (type(ref.apiVersion) == "string" and ref.apiVersion:find(group .. "/", 1, true) == 1)) then
      return ref
    end
  end
  return nil
end

-- A table of the items by fn(item) (default: obj.key), for joins; fn may be
-- a path instead (`"name"`, `"metadata.uid"`). A later item with the same key
-- replaces an earlier one.
function obj.index_by(items, fn)
  if type(fn) == "string" then
    local path = fn
    fn = function(item) return obj.get(item, path) end
  end
  fn = fn or obj.key
  local out = {}
  for _, item in ipairs(items) do
    local k = fn(item)
    if k ~= nil then out[k] = item end
  end
  return out
end

local function is_zero(v)
  return v == nil or v == false or v == "" or v == 0 or v == null
end

-- Equality as Kubernetes compares API objects: an absent scalar equals its
-- zero value (false, "", 0, null), so `hotpluggable: false` written out
-- equals it left out; tables compare member by member.
function obj.equal(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then
    if is_zero(a) and is_zero(b) then return true end
    return a == b
  end
  for k, v in pairs(a) do
    if not obj.equal(v, b[k]) then return false end
  end
  for k, v in pairs(b) do
    if a[k] == nil and not obj.equal(nil, v) then return false end
  end
  return true
end

-- Appends items to the array at a dotted path of o (a copy being edited),
-- creating the array and any object above it that is absent (or null).
-- Returns the array.
function obj.append(o, path, items)
  local parts = {}
  for part in tostring(path):gmatch("[^.]+") do parts[#parts + 1] = part end
  local node = o
  for i = 1, #parts - 1 do
    if type(node[parts[i]]) ~= "table" then node[parts[i]] = json.object {} end
    node = node[parts[i]]
  end
  local last = parts[#parts]
  if type(node[last]) ~= "table" then node[last] = json.array {} end
  for _, item in ipairs(items) do table.insert(node[last], item) end
  return node[last]
end

-- The names of the items ("a,b,c"), for log lines.
function obj.names(items)
  local names = {}
  for i, item in ipairs(items) do names[i] = tostring(type(item) == "table" and item.name or item) end
  return table.concat(names, ",")
end

return obj
