-- cozy.obj: reading Kubernetes objects as plain decoded tables, for
-- migrations (docs/engine-api.md, "cozy.obj"). Every function takes what the
-- API server sends and never raises on a missing or mistyped field: a
-- migration's rule reads like the description it implements.
local json = require "cozy.json"
local validate = require "cozy.validate"

---@class cozy.Object: table a decoded Kubernetes object (cozy.json tables)
---@field apiVersion? string
---@field kind? string
---@field metadata? cozy.ObjectMeta
---@field spec? table
---@field status? table

---@class cozy.ObjectMeta: table
---@field name? string
---@field namespace? string
---@field uid? string
---@field labels? table<string, string>
---@field annotations? table<string, string>

--- a dotted path ("spec.template.spec") or an array of steps
---@alias cozy.Path string|(string|integer)[]

---@class cozy.obj
local obj = {}

local null = json.null

-- A dotted path split into its steps (digits as array indices), cached:
-- migrations read the same few paths once per object of a fleet. Bounded,
-- since a path may also be built per object. An array of steps is taken as
-- it is: a key with dots in it ("apps.cozystack.io/application.name") can
-- only be reached that way.
local steps_of = {}
local cached = 0
local function steps(path)
  if type(path) == "table" then return path end
  local s = steps_of[path]
  if s == nil then
    s = {}
    path = tostring(path) -- a non-string path is read as its text, and not cached under itself
    for part in path:gmatch("[^.]+") do
      s[#s + 1] = part:match("^%d+$") and tonumber(part) or part
    end
    if cached >= 512 then steps_of, cached = {}, 0 end
    steps_of[path], cached = s, cached + 1
  end
  return s
end

--- The value at a dotted path ("spec.template.spec"), or nil as soon as a
--- step is missing or not a table (JSON null included). Array elements are
--- reached with numbers: get(vm, "spec.template.spec.volumes.1.name"). The
--- path may be an array of steps instead, each a key or an index as it is:
--- get(o, { "metadata", "labels", "apps.cozystack.io/application.name" }).
---@param o any an object (or any value: nil when it is not a table)
---@param path cozy.Path
---@return any|nil value the value, nil when absent or JSON null
function obj.get(o, path)
  local s = steps(path)
  for i = 1, #s do
    if type(o) ~= "table" then return nil end
    o = o[s[i]]
  end
  if o == null then return nil end
  return o
end

--- The array at a dotted path, or an empty one: `for _, v in ipairs(obj.list(vm, "..."))`;
--- with `keep`, a new array of only the items keep(item) is true of, in order.
---@param o any
---@param path cozy.Path
---@param keep? fun(item: any): any which items to keep
---@return any[] array the array there, or a new empty one
function obj.list(o, path, keep)
  local v = obj.get(o, path)
  if type(v) ~= "table" then return {} end
  if keep == nil then return v end
  local out = {}
  for _, item in ipairs(v) do
    if keep(item) then out[#out + 1] = item end
  end
  return out
end

--- "namespace/name" (or "name" for a cluster-scoped object).
---@param o cozy.Object
---@return string key "namespace/name" or "name"
function obj.key(o)
  local md = type(o) == "table" and type(o.metadata) == "table" and o.metadata or {}
  local name = tostring(md.name)
  if type(md.namespace) == "string" then return md.namespace .. "/" .. name end
  return name
end

--- Just what names o (apiVersion, kind, metadata name, namespace, uid): to keep
--- for a finding or a log line without holding the whole object.
---@param o cozy.Object
---@return cozy.Object identity apiVersion, kind and metadata's name, namespace and uid
function obj.identity(o)
  local md = type(o) == "table" and type(o.metadata) == "table" and o.metadata or {}
  return { apiVersion = o and o.apiVersion, kind = o and o.kind,
           metadata = { name = md.name, namespace = md.namespace, uid = md.uid } }
end

--- The controller ownerReference of o, optionally only of `kind` (and of an
--- apiVersion in `group`): { apiVersion, kind, name, uid, ... } or nil.
---@param o cozy.Object
---@param kind? string the owner's kind
---@param group? string the owner's API group
---@return table|nil ref the ownerReference
function obj.controller_of(o, kind, group)
  for _, ref in ipairs(obj.list(o, "metadata.ownerReferences")) do
    if type(ref) == "table" and ref.controller == true and (kind == nil or ref.kind == kind)
        and (group == nil
          or (type(ref.apiVersion) == "string"
            and ref.apiVersion:find(group .. "/", 1, true) == 1)) then
      return ref
    end
  end
  return nil
end

--- The controller ownerReference of o that names owner's kind (and API group) with
--- another uid than owner's, or nil: an owner recreated under the same name does not
--- own what the earlier one did. nil too when either uid is unknown.
---@param owner cozy.Object the would-be owner (its apiVersion, kind and uid)
---@param o cozy.Object
---@return table|nil ref the ownerReference naming the other uid
function obj.uid_conflict(owner, o)
  local group = type(owner.apiVersion) == "string" and owner.apiVersion:match("^(.*)/") or nil
  local ref, uid = obj.controller_of(o, owner.kind, group), obj.get(owner, "metadata.uid")
  if ref and ref.uid ~= nil and uid ~= nil and ref.uid ~= uid then return ref end
  return nil
end

--- A table of the items by fn(item) (default: obj.key), for joins; fn may be
--- a path instead (`"name"`, `"metadata.uid"`). A later item with the same key
--- replaces an earlier one.
---@param items any[]
---@param fn? string|fun(item: any): any a path, or the key of an item (default obj.key)
---@return table<any, any> index
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

--- Equality as Kubernetes compares API objects: an absent scalar equals its
--- zero value (false, "", 0, null), so `hotpluggable: false` written out
--- equals it left out; tables compare member by member.
---@param a any
---@param b any
---@return boolean
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

--- Two arrays of named items compared by a key path (as `kubectl diff` pairs list
--- entries by their merge key): the items of `theirs` whose key `mine` lacks, and
--- those `mine` holds otherwise (not obj.equal), as { mine, theirs } pairs; both in
--- the order of `theirs`.
---@param mine any[]
---@param theirs any[]
---@param key string a dotted path of an item ("name")
---@return any[] lacking items of theirs with no counterpart in mine
---@return any[][] differing { mine_item, theirs_item } pairs that are not equal
function obj.compare(mine, theirs, key)
  local by_key, lacking, differing = obj.index_by(mine, key), {}, {}
  for _, item in ipairs(theirs) do
    local own = by_key[obj.get(item, key)]
    if own == nil then lacking[#lacking + 1] = item
    elseif not obj.equal(own, item) then differing[#differing + 1] = { own, item } end
  end
  return lacking, differing
end

--- Appends items to the array at a dotted path (or an array of steps) of o (a copy being edited),
--- creating the array and any object above it that is absent (or null); no items: o is left
--- as it is (nothing created). Returns the array (nil when none is there and nothing was added).
---@param o cozy.Object a copy being edited
---@param path cozy.Path
---@param items any[]
---@return any[]|nil array the array, items appended
function obj.append(o, path, items)
  if #items == 0 then return obj.get(o, path) end
  local parts = {}
  if type(path) == "table" then
    parts = path -- an array of steps, as obj.get takes
  else
    for part in tostring(path):gmatch("[^.]+") do parts[#parts + 1] = part end
  end
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

-- Label and annotation keys and label values, checked as the API server
-- checks them (k8s.io/apimachinery's IsQualifiedName and IsValidLabelValue),
-- so that a bad key is an error of the migration that set it, before
-- anything is sent, and not a 422 in the middle of a batch.
local NAME_MAX, PREFIX_MAX = 63, 253
local NAME_CHARS = "alphanumeric characters, '-', '_' or '.', and must start and end with an "
  .. "alphanumeric character"

-- Is s a run of [A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9] (or one alphanumeric)?
local function name_part_ok(s)
  return s:find("^%w[%w%-_.]*$") ~= nil and s:find("%w$") ~= nil
end

-- A DNS-1123 subdomain: lowercase labels of [a-z0-9-], each starting and
-- ending alphanumeric, joined by dots.
local function subdomain_ok(s)
  if #s == 0 or #s > PREFIX_MAX then return false end
  for label in (s .. "."):gmatch("([^.]*)%.") do
    if not label:find("^[a-z0-9]$") and not label:find("^[a-z0-9][a-z0-9%-]*[a-z0-9]$") then
      return false
    end
  end
  return true
end

--- nil when key is a valid qualified name, else why not.
---@param key any a label or annotation key
---@return string|nil why nil when the key is valid
function obj.key_error(key)
  local not_string = validate.why("a key", key, "string", { show = "not" })
  if not_string then return not_string end
  local prefix, name = key:match("^([^/]*)/(.*)$")
  if prefix == nil then
    name = key
  elseif name:find("/", 1, true) then
    return ("%q: a qualified name must consist of a name and an optional prefix "
      .. "separated by one '/'"):format(key)
  elseif prefix == "" then
    return ("%q: prefix part must be non-empty"):format(key)
  elseif #prefix > PREFIX_MAX then
    return ("%q: prefix part must be no more than %d characters"):format(key, PREFIX_MAX)
  elseif not subdomain_ok(prefix) then
    return ("%q: prefix part must be a lowercase RFC 1123 subdomain (e.g. 'example.com')")
      :format(key)
  end
  if name == "" then return ("%q: name part must be non-empty"):format(key) end
  if #name > NAME_MAX then
    return ("%q: name part must be no more than %d characters"):format(key, NAME_MAX)
  end
  if not name_part_ok(name) then
    return ("%q: name part must consist of %s"):format(key, NAME_CHARS)
  end
  return nil
end

--- nil when v is a valid label value ("" included), else why not.
---@param v any a label value
---@return string|nil why nil when the value is valid
function obj.label_value_error(v)
  local not_string = validate.why("a label value", v, "string", { show = "not" })
  if not_string then return not_string end
  if v == "" then return nil end
  if #v > NAME_MAX then
    return ("%q: a label value must be no more than %d characters"):format(v, NAME_MAX)
  end
  if not name_part_ok(v) then
    return ("%q: a label value must be empty or consist of %s"):format(v, NAME_CHARS)
  end
  return nil
end

-- The API server checks an annotation key lowercased: "Example.COM/X" is a
-- valid annotation key and an invalid label key.
local function checked_key(what, key)
  local why = obj.key_error(what == "annotation" and type(key) == "string" and key:lower() or key)
  if why then error(("cozy.obj: invalid %s key %s"):format(what, why), 3) end
end

local function value_of(o, field, key)
  local md = type(o) == "table" and o.metadata
  local map = type(md) == "table" and md[field]
  if type(map) ~= "table" then return nil end
  local v = map[key]
  if v == null then return nil end
  return v
end

-- The map metadata[field] of o (a copy being edited), created when absent.
local function map_of(o, field)
  validate.arg(3, "cozy.obj", "the object", o, "table")
  if type(o.metadata) ~= "table" then o.metadata = json.object {} end
  if type(o.metadata[field]) ~= "table" then o.metadata[field] = json.object {} end
  return o.metadata[field]
end

--- Labels and annotations of an object: read as they are, written on a copy
--- being edited (change, update_each), keys and label values checked first.
--- set_* returns true when it changed the value; remove_* when there was one.
--- The value of label `key` of o, or nil.
---@param o cozy.Object
---@param key string
---@return string|nil
function obj.label(o, key) return value_of(o, "labels", key) end
--- The value of annotation `key` of o, or nil.
---@param o cozy.Object
---@param key string
---@return string|nil
function obj.annotation(o, key) return value_of(o, "annotations", key) end

--- Sets label `key` of o (a copy being edited); raises on a key or value the API server
--- would refuse.
---@param o cozy.Object
---@param key string
---@param value string
---@return boolean changed
function obj.set_label(o, key, value)
  checked_key("label", key)
  local why = obj.label_value_error(value)
  if why then error("cozy.obj: invalid label value " .. why, 2) end
  local map = map_of(o, "labels")
  if map[key] == value then return false end
  map[key] = value
  return true
end

--- Sets the labels of o (a copy being edited) from a map key = value, all or none, as
--- one `kubectl label` the API server refuses whole: when a key or value is invalid no
--- label is set and it returns false and why (the first such key, in key order) — what
--- a rule's edit returns to refuse the object (docs/engine-api.md, "Rules").
---@param o cozy.Object
---@param labels table<string, string>
---@return boolean changed
---@return string|nil why the invalid key or value, when nothing was set
function obj.set_labels(o, labels)
  validate.arg(2, "cozy.obj", "labels", labels, "table", { says = "a map key = value" })
  local keys = {}
  for key in pairs(labels) do keys[#keys + 1] = tostring(key) end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local why = obj.key_error(key) or obj.label_value_error(labels[key])
    if why then return false, why end
  end
  local changed = false
  for _, key in ipairs(keys) do changed = obj.set_label(o, key, labels[key]) or changed end
  return changed
end

--- Sets annotation `key` of o (a copy being edited); raises on a key the API server would refuse.
---@param o cozy.Object
---@param key string
---@param value string
---@return boolean changed
function obj.set_annotation(o, key, value)
  checked_key("annotation", key)
  validate.arg(2, "cozy.obj", "an annotation value", value, "string", { show = "not" })
  local map = map_of(o, "annotations")
  if map[key] == value then return false end
  map[key] = value
  return true
end

local function remove(o, field, key)
  local map = type(o) == "table" and type(o.metadata) == "table" and o.metadata[field]
  if type(map) ~= "table" or map[key] == nil then return false end
  map[key] = nil
  return true
end

--- Removes label `key` of o (a copy being edited).
---@param o cozy.Object
---@param key string
---@return boolean removed whether there was one
function obj.remove_label(o, key)
  checked_key("label", key)
  return remove(o, "labels", key)
end

--- Removes annotation `key` of o (a copy being edited).
---@param o cozy.Object
---@param key string
---@return boolean removed whether there was one
function obj.remove_annotation(o, key)
  checked_key("annotation", key)
  return remove(o, "annotations", key)
end

-- The metadata fields the API server sets and owns: a copy that is to be
-- created as a new object, or compared with another, leaves them out.
obj.SERVER_SET_METADATA = { "resourceVersion", "uid", "generation", "creationTimestamp",
  "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink" }

--- A deep copy of o without what the API server sets: the metadata above and,
--- unless opts.keep_status, `status` (a create ignores it; its controller
--- writes it). What remains is what a create of the copy would send: a new
--- name or namespace is the caller's to set. o itself is not changed.
---@param o cozy.Object
---@param opts? { keep_status?: boolean }
---@return cozy.Object copy
function obj.clean(o, opts)
  validate.args(2, "obj.clean(o, opts)", {
    { "o", o, "table", { says = "an object (a table)", show = "got" } },
    { "opts", opts, "table", true },
  })
  local c = json.copy(o)
  if type(c.metadata) == "table" then
    for _, k in ipairs(obj.SERVER_SET_METADATA) do c.metadata[k] = nil end
  end
  if not (opts and opts.keep_status) then c.status = nil end
  return c
end

-- jq's walk(f): a new document in which every value of v, innermost first,
-- is replaced by fn(value, path) (path: the array of steps from the root,
-- keys and 1-based indices; a fresh table each call). fn returning nil keeps
-- the value as it is (already walked); returning json.null makes a JSON null.
-- Arrays stay arrays and objects objects (their cozy.json markers kept); v
-- itself is not changed.
local function walk(v, fn, path)
  if type(v) == "table" then
    local c = {}
    local depth = #path + 1
    for k, x in next, v do
      path[depth] = k
      c[k] = walk(x, fn, path)
    end
    path[depth] = nil
    local mt = getmetatable(v)
    if mt == json.array_mt or mt == json.object_mt then setmetatable(c, mt) end
    v = c
  end
  local replaced = fn(v, table.move(path, 1, #path, 1, {}))
  if replaced == nil then return v end
  return replaced
end

--- jq's walk(f) over v (see walk above): a new document; v is not changed.
---@param v any
---@param fn fun(value: any, path: (string|integer)[]): any nil keeps the value
---@return any document
function obj.walk(v, fn)
  validate.arg(2, "obj.walk(v, fn)", "fn", fn, "function", { says = "a function(value, path)" })
  return walk(v, fn, {})
end

--- Each item of an array through fn, in order: { fn(items[1]), fn(items[2]), ... }.
---@param items any[]
---@param fn fun(item: any): any
---@return any[] mapped
function obj.map(items, fn)
  validate.arg(2, "obj.map(items, fn)", "fn", fn, "function")
  local out = {}
  for i, item in ipairs(items) do out[i] = fn(item) end
  return out
end

--- The names of the items ("a,b,c"), for log lines.
---@param items any[] objects or names
---@return string names "a,b,c"
function obj.names(items)
  local names = {}
  for i, item in ipairs(items) do
    names[i] = tostring(type(item) == "table" and item.name or item)
  end
  return table.concat(names, ",")
end

return obj
