-- The overlay of a rehearsal (docs/operations.md, "Rehearsals"): the
-- objects that earlier writes of this rehearsal created, changed or
-- deleted, over the live cluster. Reads consult it first: an object it
-- holds is answered from it (a deleted one as the API server's 404), any
-- other is the live server's; a list page from the live server is merged
-- with it.
--
-- An object's identity is its API group, resource plural, namespace and
-- name, without the version: the same object reached under two versions
-- of a group is one object. The overlay keeps the object as the write left
-- it, under the version it was written at; a read under another version
-- gets that object unconverted, and the read is marked inexact.
--
-- Each write the overlay takes gives the object a resourceVersion of its
-- own ("rehearsal-N"), as each write of a run gives it a new one, so a
-- precondition on the version an earlier write replaced fails here as it
-- would in the run. The version the live server holds is kept beside it
-- (live_rv): the write sent to the server for validation carries that one.
--
-- For the plan's per-object diff, an entry keeps the live object as the
-- rehearsal first found it (before): only objects the rehearsal wrote are
-- kept, once each. A delete brings it along (the engine reads the object
-- first); a patch or update of a live object does not: the server's
-- answer names the live resourceVersion it was applied to (live_rv), and
-- the object at that version is read while the plan's report is made, many
-- at a time, and not kept (before_due: cozy.kube.rehearsal.befores).
--
-- What it keeps is text, not tables: a rehearsal of migration 59 at
-- 20,000 VMs writes 10,000 of them, and their decoded before and after
-- (about 30 KB each) would cost gigabytes and the collector's time on
-- them. An entry holds its object as JSON (text): the server's answer to
-- the write as it came, where the overlay holds nothing of the object yet
-- (a decode and an encode of the whole object per write, which a run does
-- not make, were a sixth of a rehearsal's steps), else the object as
-- encoded; its own resourceVersion (rv) is set in every decode. Beside
-- the text: the metadata its reads
-- select on (md: namespace, name, labels), and its before without the
-- metadata the server sets (SERVER_SET, which the plan never shows) as the
-- JSON patch that turns the object into it (before_ops): the few fields a
-- write changed. Where that patch would not give back exactly the before's
-- JSON (json.diff takes [] for {} and 1 for 1.0: its exact mode says so),
-- the before is kept as JSON whole (before_text). Every read decodes a fresh copy: what the
-- step gets is its own, as a run's answers are.
--
-- Pure data: no requests. Lookups by identity are O(1); a list page is
-- merged in O(page + the overlay's objects of that resource).
local json = require "cozy.json"
local patch = require "cozy.kube.patch"
local compare = require("cozy.sys").compare

local overlay = {}

-- metadata the API server sets: left out of the plan's before, after and
-- diff (as kubectl diff does), and so not kept in before
overlay.SERVER_SET = { "resourceVersion", "uid", "managedFields", "generation", "creationTimestamp",
  "deletionTimestamp", "selfLink" }

-- A decoder's projection (cozy.json): the object without its
-- managedFields, most of a typical object's bytes and tables (a VM of
-- migration 59: about half its JSON). For what only the plan's diff reads
-- (a write's live before, the end's report), which leaves every
-- SERVER_SET field out anyway; the others are scalars and kept, so that a
-- saved plan still records the resourceVersion it read.
overlay.WITHOUT_MANAGED_FIELDS = { ["*"] = true,
  metadata = { ["*"] = true, managedFields = false } }

-- obj's SERVER_SET metadata taken out in place; returns what was there,
-- for put_back.
local function take_server_set(obj)
  local md, held = type(obj) == "table" and obj.metadata, {}
  if type(md) ~= "table" then return held end
  for _, k in ipairs(overlay.SERVER_SET) do
    held[k], md[k] = md[k], nil
  end
  return held
end

local function put_back(obj, held)
  for k, v in pairs(held) do obj.metadata[k] = v end
end

local Overlay = {}
Overlay.__index = Overlay
overlay.Overlay = Overlay

function overlay.new()
  return setmetatable({
    _entries = {},      -- identity -> entry
    _by_resource = {},  -- group \0 plural -> { identity -> entry }
    _bounds = {},       -- continue token -> the greatest live key of the pages before it
    _serial = 0,
  }, Overlay)
end

-- The identity of an object: group, plural, namespace ("" when
-- cluster-scoped), name.
function overlay.identity(group, plural, ns, name)
  return table.concat({ group or "", plural, ns or "", name }, "\0")
end

local function resource_key(group, plural)
  return (group or "") .. "\0" .. plural
end

-- The key the API server lists in: "namespace/name", or the name (an
-- entry's key).
local function list_key(ns, name)
  if ns ~= nil and ns ~= "" then return ns .. "/" .. name end
  return name
end
overlay.list_key = list_key

local function le(a, b) return compare(a, b) <= 0 end
local function lt(a, b) return compare(a, b) < 0 end

-- entries by group, resource, then key
local function in_order(a, b)
  if a.group ~= b.group then return lt(a.group, b.group) end
  if a.plural ~= b.plural then return lt(a.plural, b.plural) end
  return lt(a.key, b.key)
end

-- The 404 the API server answers for an absent object.
function overlay.not_found(group, plural, name)
  local details = { name = name, kind = plural }
  if group ~= nil and group ~= "" then details.group = group end
  local what = (group ~= nil and group ~= "") and (plural .. "." .. group) or plural
  return json.object { kind = "Status", apiVersion = "v1", metadata = json.object {},
    status = "Failure", message = ("%s %q not found"):format(what, name), reason = "NotFound",
    details = json.object(details), code = 404 }
end

-- The entry the overlay holds for an object, or nil: { state = "present" |
-- "deleted", text (the object as JSON; Overlay:object decodes it), rv (its
-- resourceVersion in the overlay), md
-- (its namespace, name and labels), api_version, live (the live server
-- holds an object of that identity, the one this entry replaces), live_rv,
-- created (the entry's object is not the live one changed: created, or
-- re-created after a delete), inexact (why the overlay's version may not
-- be what the run would make), before_ops or before_text (the live object
-- as first found, without SERVER_SET; Overlay:before decodes it; neither
-- when absent or not known), before_unknown (why it is not known),
-- before_due (the API version to read the before at: it is read for the
-- plan's report, not kept) }.
function Overlay:entry(group, plural, ns, name)
  return self._entries[overlay.identity(group, plural, ns, name)]
end

-- A fresh copy of the object an entry holds, or nil when deleted; with a
-- decoder's projection (cozy.json), only those parts of it (and the
-- overlay's resourceVersion).
function Overlay.object(_, e, proj)
  if e.text == nil then return nil end
  local obj = json.decode(e.text, proj)
  if type(obj) == "table" and type(obj.metadata) == "table" then
    obj.metadata.resourceVersion = e.rv
  end
  return obj
end

-- A fresh copy of an entry's before (without SERVER_SET), or nil.
function Overlay:before(e)
  if e.before_text ~= nil then return json.decode(e.before_text) end
  if e.before_ops ~= nil then
    local obj = self:object(e, overlay.WITHOUT_MANAGED_FIELDS)
    take_server_set(obj)
    return patch.json_patch(obj, json.decode(e.before_ops), true)
  end
  return nil
end

-- The same before, made from after: the entry's object (Overlay:object)
-- with SERVER_SET removed, which the caller owns. It shares with after
-- every table the before's patch leaves alone (the plan's diff decodes
-- and copies none of them twice), so neither may change while both are in
-- use.
function Overlay.before_over(_, e, after)
  if e.before_text ~= nil then return json.decode(e.before_text) end
  if e.before_ops ~= nil then return patch.json_patch(after, json.decode(e.before_ops), true) end
  return nil
end

-- The before shown beside after (both the caller's, decoded without
-- managedFields, after without SERVER_SET): before, without SERVER_SET,
-- made from after by the patch between them where that gives it back
-- exactly (json.diff's exact mode), so that it shares every table the
-- writes left alone and the plan's YAML of the two is mostly made once;
-- else before itself. Neither may change while both are in use.
function overlay.shared_before(after, before)
  take_server_set(before)
  local ok, ops = pcall(json.diff, after, before, true)
  if ok and ops ~= nil then return patch.json_patch(after, ops, true) end
  return before
end

-- Keeps before (nil, or an object the caller gives away: its SERVER_SET
-- metadata is taken out) in e against its object now (after, a table the
-- caller keeps, or nil): the patch from after to it when that gives it
-- back exactly (json.diff's exact mode), else its JSON. Nothing is
-- copied: after's SERVER_SET metadata is set aside for the diff and put
-- back (a copy of each side, a patch back and two encodes to check it
-- were most of a write's cost in a rehearsal: bench/README.md).
local function keep_before(e, before, after)
  e.before_ops, e.before_text = nil, nil
  if before == nil then return end
  take_server_set(before)
  if after ~= nil then
    local held = take_server_set(after)
    local ok, ops = pcall(json.diff, after, before, true)
    put_back(after, held)
    if ok and ops ~= nil then
      e.before_ops = json.encode(ops)
      return
    end
  end
  e.before_text = json.encode(before)
end

-- the metadata the overlay's lists select on
local function keep_md(e, md)
  e.md = { namespace = md.namespace, name = md.name,
    labels = type(md.labels) == "table" and json.copy(md.labels) or nil }
end

local function place(self, group, plural, ns, name)
  local id = overlay.identity(group, plural, ns, name)
  local e = self._entries[id]
  if e == nil then
    e = { group = group or "", plural = plural, ns = ns ~= "" and ns or nil, name = name,
      key = list_key(ns, name) }
    self._entries[id] = e
    local rk = resource_key(group, plural)
    local set = self._by_resource[rk]
    if set == nil then
      set = {}
      self._by_resource[rk] = set
    end
    set[id] = e
  end
  return e
end

-- Puts the object a write left: o = { live = the live server holds an
-- object of this identity, live_rv = its resourceVersion, created = this
-- object is not that one changed, api_version =, inexact = why, before =
-- the live object as found before this first write, before_unknown = why
-- it could not be read, which put takes as its own, before_due = the API
-- version to read it at later instead (the live object at live_rv), text
-- = the server's answer as it came, which obj is decoded from (whole, or
-- projected but with its namespace, name and labels): only for an object
-- the overlay does not hold yet, without before }. The overlay keeps that
-- text, else obj's, with a resourceVersion of its own, set in obj, which
-- it returns: obj is the caller's, changed only there (no copy: each is a
-- whole object, and a rehearsal puts one per write).
function Overlay:put(group, plural, obj, o)
  o = o or {}
  local md = obj.metadata
  local e = place(self, group, plural, md.namespace, md.name)
  local before
  if e.state == nil then
    e.live, e.live_rv, e.created = o.live == true, o.live_rv, o.created == true
    before, e.before_unknown, e.before_due = o.before, o.before_unknown, o.before_due
  else
    -- a later write keeps what is known of the live object; a create after
    -- a delete makes the object a new one
    if o.created then e.created = true end
    if o.live_rv ~= nil and e.live_rv == nil then e.live_rv = o.live_rv end
    if o.live then e.live = true end
    before = self:before(e)
  end
  self._serial = self._serial + 1
  e.rv = ("rehearsal-%d"):format(self._serial)
  md.resourceVersion = e.rv
  keep_md(e, md)
  if o.text ~= nil then
    e.text = o.text
  else
    e.text = json.encode(obj)
    keep_before(e, before, obj)
  end
  e.state, e.api_version = "present", o.api_version or obj.apiVersion
  if o.inexact then e.inexact = o.inexact end
  -- the overlay keeps text: the table stays the caller's
  return obj
end

-- Marks an object deleted (live: the live server holds one of that
-- identity; before, before_unknown: as for put).
function Overlay:delete(group, plural, ns, name, live, before, before_unknown)
  local e = place(self, group, plural, ns, name)
  if e.state == nil then
    e.live, e.before_unknown = live == true, before_unknown
  else
    before = self:before(e)
  end
  keep_before(e, before, nil)
  e.state, e.text, e.md, e.rv = "deleted", nil, nil, nil
end

-- Marks an object the overlay holds inexact: its version may differ from
-- the run's.
function Overlay:mark_inexact(group, plural, ns, name, why)
  local e = self._entries[overlay.identity(group, plural, ns, name)]
  if e and e.inexact == nil then e.inexact = why end
end

-- A GET of one object: "live" (ask the live server); "present", a copy of
-- the overlay's object and, when it was written under another version than
-- the one asked, why the answer is inexact; or "deleted" and the 404 Status.
function Overlay:get(group, version, plural, ns, name)
  local e = self._entries[overlay.identity(group, plural, ns, name)]
  if e == nil then return "live" end
  if e.state == "deleted" then return "deleted", overlay.not_found(group, plural, name) end
  local why
  local asked = (group ~= nil and group ~= "") and (group .. "/" .. version) or version
  if version ~= nil and e.api_version ~= nil and e.api_version ~= asked then
    why = ("%s was written as %s and is read as %s: not converted")
      :format(e.key, e.api_version, asked)
  end
  return "present", self:object(e), why
end

-- Label selectors ---------------------------------------------------------

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Splits on the commas outside parentheses.
local function requirements(s)
  local out, depth, start = {}, 0, 1
  for i = 1, #s do
    local c = s:sub(i, i)
    if c == "(" then depth = depth + 1
    elseif c == ")" then depth = depth - 1
    elseif c == "," and depth == 0 then
      out[#out + 1] = s:sub(start, i - 1)
      start = i + 1
    end
  end
  out[#out + 1] = s:sub(start)
  return out
end

local function value_set(list)
  local set = {}
  for v in (list .. ","):gmatch("([^,]*),") do set[trim(v)] = true end
  return set
end

-- A label selector as the API server parses it: equality (=, ==, !=),
-- set-based (in, notin, exists, !exists) and the numeric gt/lt. Returns a
-- predicate on a labels table, or nil and why for a selector it cannot parse.
function overlay.label_selector(s)
  if s == nil or trim(s) == "" then return function() return true end end
  local tests = {}
  for _, raw in ipairs(requirements(s)) do
    local r = trim(raw)
    local key, op, rest
    key, op, rest = r:match("^([%w%._/%-]+)%s+(notin)%s*(%b())$")
    if not key then key, op, rest = r:match("^([%w%._/%-]+)%s+(in)%s*(%b())$") end
    if key then
      local set = value_set(rest:sub(2, -2))
      if op == "in" then
        tests[#tests + 1] = function(l) return l[key] ~= nil and set[l[key]] == true end
      else
        tests[#tests + 1] = function(l) return l[key] == nil or set[l[key]] == nil end
      end
    else
      local k, o, v = r:match("^([%w%._/%-]+)%s*([!=]?=)%s*([%w%._%-]*)$")
      if k then
        if o == "!=" then
          tests[#tests + 1] = function(l) return l[k] ~= v end
        else
          tests[#tests + 1] = function(l) return l[k] == v end
        end
      else
        local gk, go, gv = r:match("^([%w%._/%-]+)%s*([<>])%s*(%-?%d+)$")
        if gk then
          local n = tonumber(gv)
          tests[#tests + 1] = function(l)
            local x = l[gk] and tonumber(l[gk])
            if x == nil then return false end
            if go == ">" then return x > n end
            return x < n
          end
        else
          local neg, ek = r:match("^(!?)%s*([%w%._/%-]+)$")
          if not ek then return nil, ("label selector requirement %q"):format(r) end
          if neg == "!" then
            tests[#tests + 1] = function(l) return l[ek] == nil end
          else
            tests[#tests + 1] = function(l) return l[ek] ~= nil end
          end
        end
      end
    end
  end
  return function(l)
    l = type(l) == "table" and l or {}
    for i = 1, #tests do
      if not tests[i](l) then return false end
    end
    return true
  end
end

-- A field selector of metadata.name and metadata.namespace (=, ==, !=).
-- Returns a predicate on an object, or nil and why for a field it cannot
-- evaluate (the read is then inexact).
function overlay.field_selector(s)
  if s == nil or trim(s) == "" then return function() return true end end
  local tests = {}
  for _, raw in ipairs(requirements(s)) do
    local r = trim(raw)
    local f, o, v = r:match("^([%w%.]+)%s*([!=]?=)%s*(.-)$")
    if f ~= "metadata.name" and f ~= "metadata.namespace" then
      return nil, ("field selector %q is not evaluated in the overlay"):format(r)
    end
    local field = f:match("%.(%w+)$")
    if o == "!=" then
      tests[#tests + 1] = function(md) return (md[field] or "") ~= v end
    else
      tests[#tests + 1] = function(md) return (md[field] or "") == v end
    end
  end
  return function(obj)
    local md = type(obj.metadata) == "table" and obj.metadata or {}
    for i = 1, #tests do
      if not tests[i](md) then return false end
    end
    return true
  end
end

-- Lists --------------------------------------------------------------------

-- One page of a list from the live server, merged with the overlay, in
-- place. q: { group, plural, namespace (nil: all namespaces or
-- cluster-scoped), label_selector, field_selector, continue (the token the
-- page was asked with), project (a function making the lean copy of an
-- overlay object, or nil) }. An object the overlay holds replaces the live
-- one (and leaves the page when it no longer matches), a deleted one
-- leaves it, and one that appears only in the overlay joins the page
-- whose key range holds its key, in key order: each appears exactly once
-- over all the pages of a pass. Returns the list and, when the merge could
-- not be exact (a field selector it cannot evaluate), why.
function Overlay:merge_page(list, q)
  local set = self._by_resource[resource_key(q.group, q.plural)]
  local items = type(list.items) == "table" and list.items or nil
  local cont = list.metadata and list.metadata["continue"]
  if cont == "" then cont = nil end
  local lower = q.continue and self._bounds[q.continue] or nil
  -- the greatest live key of this page: the bound of the next page
  local greatest = lower
  for i = 1, items and #items or 0 do
    local md = items[i].metadata
    local k = type(md) == "table" and type(md.name) == "string" and list_key(md.namespace, md.name)
      or nil
    if k and (greatest == nil or lt(greatest, k)) then greatest = k end
  end
  if cont ~= nil then self._bounds[cont] = greatest end
  if set == nil then return list end
  local labels_ok, why = overlay.label_selector(q.label_selector)
  if labels_ok == nil then return list, why end
  local fields_ok
  fields_ok, why = overlay.field_selector(q.field_selector)
  -- without an evaluable field selector, what is known: namespace and labels
  -- on the entry's metadata: only an object that joins the page is decoded
  local function matches(e)
    if q.namespace ~= nil and e.md.namespace ~= q.namespace then return false end
    if not labels_ok(e.md.labels) then return false end
    return fields_ok == nil or fields_ok({ metadata = e.md })
  end
  local project = q.project or function(o) return o end
  local out, seen = json.array {}, {}
  for i = 1, items and #items or 0 do
    local obj = items[i]
    local md = obj.metadata
    local e = type(md) == "table"
      and set[overlay.identity(q.group, q.plural, md.namespace, md.name)] or nil
    if e == nil then
      out[#out + 1] = obj
    else
      seen[e] = true
      -- with a field selector it cannot evaluate, the live one's match of it stands
      if e.state == "present" and matches(e) then
        out[#out + 1] = project(self:object(e))
      end
    end
  end
  local joined = false
  if fields_ok ~= nil then
    -- this page's key range: (lower, greatest], or (lower, end) for the last page
    for _, e in pairs(set) do
      if not seen[e] and e.state == "present" and (lower == nil or lt(lower, e.key))
          and (cont == nil or (greatest ~= nil and le(e.key, greatest))) and matches(e) then
        out[#out + 1] = project(self:object(e))
        joined = true
      end
    end
  end
  if joined then
    local function key(o) return list_key(o.metadata.namespace, o.metadata.name) end
    table.sort(out, function(a, b) return lt(key(a), key(b)) end)
  end
  list.items = out
  return list, why
end

-- What the overlay holds, for the rehearsal's summary: the objects created
-- (only the overlay holds one), changed (it replaces a live one) and
-- deleted (a live one is gone), each an array of entries in key order.
function Overlay:changes()
  local created, changed, deleted = {}, {}, {}
  for _, e in pairs(self._entries) do
    if e.state == "present" and not e.live then
      created[#created + 1] = e
    elseif e.state == "present" then
      -- changed, or deleted and created anew: the live object is replaced
      changed[#changed + 1] = e
    elseif e.state == "deleted" and e.live then
      deleted[#deleted + 1] = e
    end
  end
  table.sort(created, in_order)
  table.sort(changed, in_order)
  table.sort(deleted, in_order)
  return { created = created, changed = changed, deleted = deleted }
end

return overlay
