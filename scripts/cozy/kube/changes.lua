-- cozy.kube.changes: what a rehearsal would leave, object by object, for
-- the end of a plan (docs/operations.md, "What a plan shows"): each object
-- it created, changed or deleted, with its before (the live object as the
-- rehearsal first found it; none for a created one) and its after (the
-- overlay's final state; none for a deleted one), and the unified diff of
-- the two as YAML, as `kubectl diff` shows one.
--
-- Both sides are shown as kubectl diff shows them: without the fields the
-- server sets (SERVER_SET, from metadata; status is kept, as kubectl diff
-- keeps it), and with a Secret's values redacted as every other output
-- redacts them (cozy.kube.trace: data and stringData values, JSON
-- annotations). A value of a Secret that the rehearsal changed is shown
-- as "<redacted: changed>", so the diff says that it changed, not to what.
local diff = require "cozy.diff"
local json = require "cozy.json"
local overlay = require "cozy.kube.overlay"
local trace = require "cozy.kube.trace"
local yaml = require "cozy.yaml"

local changes = {}

-- metadata the API server sets, left out of before, after and the diff
-- (the overlay does not keep them in before)
changes.SERVER_SET = overlay.SERVER_SET

changes.CHANGED = "<redacted: changed>"

-- obj as shown. obj is the caller's own (a fresh decode), changed in place
-- where nothing in it is redacted: trace.redacted's copy, of every object
-- the plan changed, was a tenth of a plan's Lua (bench/README.md).
local function shown(obj, secret)
  if type(obj) ~= "table" then return nil end
  local c = obj
  if secret or json.holds(obj, "kind", "Secret", trace.MAX_DEPTH) then
    c = trace.redacted(obj, secret)
  end
  if type(c.metadata) == "table" then
    for _, k in ipairs(changes.SERVER_SET) do c.metadata[k] = nil end
  end
  return c
end

-- after's redacted values marked where the raw value differs from before's
local function mark_changed(before_raw, after_raw, after)
  for _, field in ipairs { "data", "stringData" } do
    local b, a, shown_a = before_raw and before_raw[field], after_raw and after_raw[field],
      after[field]
    if type(a) == "table" and type(shown_a) == "table" then
      for k, v in pairs(a) do
        if type(b) ~= "table" or b[k] ~= v then shown_a[k] = changes.CHANGED end
      end
    end
  end
end

-- kubectl diff's name of an object: group.version.Kind.namespace.name
local function label(api_version, kind, ns, name)
  local parts = { (api_version or ""):gsub("/", "."), kind }
  if ns ~= nil and ns ~= "" then parts[#parts + 1] = ns end
  parts[#parts + 1] = name
  return table.concat(parts, ".")
end

-- One object's report (the event `object` of a plan). befores: the
-- reader of the befores still to be read (rehearsal.befores), or nil.
local function report(ov, e, action, befores)
  local secret = e.group == "" and e.plural == "secrets"
  local after_raw = action ~= "deleted" and ov:object(e, overlay.WITHOUT_MANAGED_FIELDS) or nil
  -- (before shown changes it)
  local terminating = after_raw ~= nil and type(after_raw.metadata) == "table"
    and after_raw.metadata.deletionTimestamp ~= nil or nil
  local after = shown(after_raw, secret)
  local before_raw, before_unknown = nil, e.before_unknown
  if action ~= "created" and e.before_due ~= nil then
    -- read now, diffed and dropped
    before_unknown = "the live object was not read"
    if befores then before_raw, before_unknown = befores:take(e) end
    -- an after shown as it is: the before shares its tables, and their YAML
    if before_raw ~= nil and after ~= nil and after == after_raw then
      before_raw = overlay.shared_before(after, before_raw)
    end
  elseif action ~= "created" then
    if after ~= nil and after == after_raw then before_raw = ov:before_over(e,
      after) else before_raw = ov:before(e) end
  end
  local before = shown(before_raw, secret)
  local any = after_raw or before_raw or {}
  if secret or any.kind == "Secret" then
    if after ~= nil then mark_changed(before_raw, after_raw, after) end
  end
  local api_version = any.apiVersion
    or (e.group ~= "" and (e.group .. "/" .. (e.api_version or "")) or e.api_version)
  local kind = any.kind or e.plural
  local r = { type = "object", action = action, apiVersion = api_version, kind = kind,
    resource = e.plural, group = e.group ~= "" and e.group or nil, namespace = e.ns, name = e.name,
    before = before, after = after, inexact = e.inexact, terminating = terminating }
  if action ~= "created" and before_raw == nil then
    -- a live object the rehearsal could not read first: no diff to show
    r.before_unknown = before_unknown
      or "the live object was not read before the rehearsal's first write"
    return r
  end
  local name = label(api_version, kind, e.ns, e.name)
  -- (the before shares the after's tables: its YAML mostly the after's)
  local memo = yaml.memo()
  local after_lines = after and yaml.lines(after, memo) or {}
  r.diff = diff.unified(before and yaml.lines(before, memo) or {}, after_lines,
    "live/" .. name, "planned/" .. name)
  return r
end

-- Hands fn the report of every object the overlay created, changed or
-- deleted, one at a time (made when handed: at 10,000 objects, all of
-- them at once would hold every before and after decoded): created ones
-- first, then changed, then deleted, each in key order. read_befores
-- (optional): given the entries whose before is still to be read, in that
-- order, the reader that reads them (rehearsal.befores); without it their
-- befores are not known.
function changes.each(ov, fn, read_befores)
  local c = ov:changes()
  local due = {}
  for _, action in ipairs { "changed", "deleted" } do
    for _, e in ipairs(c[action]) do
      if e.before_due ~= nil then due[#due + 1] = e end
    end
  end
  local befores <close> = read_befores and #due > 0 and read_befores(due) or nil
  for _, action in ipairs { "created", "changed", "deleted" } do
    for _, e in ipairs(c[action]) do fn(report(ov, e, action, befores)) end
  end
end

-- The same reports, in an array.
function changes.report(ov)
  local out = {}
  changes.each(ov, function(r) out[#out + 1] = r end)
  return out
end

return changes
