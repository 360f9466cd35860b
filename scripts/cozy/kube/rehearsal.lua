-- The rehearsal mode of the client (dry_run = "rehearse";
-- docs/operations.md, "Rehearsals"): every write is sent to the live API
-- server with dryRun=All, so the server validates, defaults and admits it
-- and stores nothing, and the object it answers enters the overlay
-- (cozy.kube.overlay); reads are answered from the live server merged with
-- the overlay. So each write of a rehearsal sees what the earlier ones
-- wrote.
--
-- Client:prepare asks rehearsal.prepare what to do with each request:
-- answer it from the overlay (a read of an object it holds, a write it can
-- only apply itself), or send it, maybe rewritten (a write to an object the
-- overlay holds is applied here and the result sent for validation).
-- Client:finish hands the answer of a request sent for a rehearsal to
-- rehearsal.finish, which puts what the server answered into the overlay.
--
-- A write to an object the overlay holds: a JSON patch, merge patch or
-- update is applied here to the overlay's version (a resourceVersion
-- precondition judged against the overlay's version, as the run's server
-- would judge it), and the result sent as a dry-run PUT carrying the live
-- object's resourceVersion, or a dry-run POST when only the overlay holds
-- the object. A strategic merge or apply patch of a live object the
-- overlay changed is sent with dryRun=All to the live object, and the
-- server's answer merged three-way with the overlay's version
-- (cozy.kube.three_way; a conflict marks the object inexact), the result
-- validated as above. Of an object only the overlay holds, the server
-- cannot apply one: a strategic merge patch whose lists are the by-name
-- ones three_way knows is applied here (three_way.strategic) and validated
-- by a dry-run create; any other, and an apply patch, is applied as a
-- merge patch and the object marked inexact. A dry-run write
-- refused with 403 (credentials that may read but not write) is applied
-- here where it can be, and said "not validated by the server".
--
-- The overlay keeps the live object as the rehearsal first found it (its
-- before), for the plan's per-object diff (cozy.kube.changes). Of a
-- delete, the engine reads it first (its own GET). Of a patch or update,
-- it does not: the server's answer names the resourceVersion the write
-- was applied to, and the plan's report reads the objects at those
-- versions (rehearsal.befores), a namespace's many in a list (a read per
-- write was half a rehearsal's requests: bench/README.md).
local json = require "cozy.json"
local errors = require "cozy.kube.errors"
local overlay = require "cozy.kube.overlay"
local patch = require "cozy.kube.patch"
local projection = require "cozy.kube.projection"
local request = require "cozy.kube.request"
local three_way = require "cozy.kube.three_way"

local rehearsal = {}

local JSON_PATCH = "application/json-patch+json"
local MERGE_PATCH = "application/merge-patch+json"
local STRATEGIC_PATCH = "application/strategic-merge-patch+json"
local APPLY_PATCH = "application/apply-patch+yaml"

local urlescape = request.urlescape
local object_kind

-- The rehearsal of one client: its overlay, what it marked inexact, its
-- verdicts. stand_in: a namespace that exists live, for validating objects
-- whose own namespace exists only in the overlay.
function rehearsal.new(opts)
  opts = opts or {}
  return {
    overlay = overlay.new(),
    stand_in = opts.stand_in or "default",
    marks = {},  -- why a read or write was inexact, in order
    stats = { admitted = 0, refused = 0, not_validated = 0 },
  }
end

local function mark(state, why)
  state.marks[#state.marks + 1] = why
end
rehearsal.mark = mark

local function what(group, plural)
  return (group ~= nil and group ~= "") and (plural .. "." .. group) or plural
end

local function status(code, reason, message, details)
  return json.object { kind = "Status", apiVersion = "v1", metadata = json.object {},
    status = "Failure", message = message, reason = reason, details = json.object(details or {}),
    code = code }
end

-- The errors the run's server would answer, raised as its answers are.
local function refuse(method, shown, st)
  error(errors.from_response(method, shown, st.code, st, nil, {}), 0)
end

local function conflict(t, name)
  return status(409, "Conflict",
    ("Operation cannot be fulfilled on %s %q: the object has been modified; "
    .. "please apply your changes to the latest version and try again")
      :format(what(t.group, t.plural), name),
    { name = name, group = t.group ~= "" and t.group or nil, kind = t.plural })
end

local function exists(t, name)
  return status(409, "AlreadyExists",
    ("%s %q already exists"):format(what(t.group, t.plural), name),
    { name = name, group = t.group ~= "" and t.group or nil, kind = t.plural })
end

-- kube-apiserver's answer to a JSON patch whose op failed (a test included)
local PATCH_FAILED = "the server rejected our request due to an error in our request"

-- The request's target: group, version, plural, namespace (nil for
-- cluster-scoped ones and namespaces themselves), name, subresource.
local function target_of(method, path, query)
  local a = request.attributes(method, path, query)
  if a.unroutable or a.non_resource or a.resource == nil then return nil end
  local t = { group = a.group, version = a.version, plural = a.resource, ns = a.namespace,
    name = a.name, subresource = a.subresource, verb = a.verb }
  if t.plural == "namespaces" then t.ns = nil end
  return t
end

local function api_base(t)
  return t.group == "" and ("/api/" .. t.version) or ("/apis/" .. t.group .. "/" .. t.version)
end

local function collection(t, ns)
  if ns ~= nil then return ("%s/namespaces/%s/%s"):format(api_base(t), urlescape(ns), t.plural) end
  return ("%s/%s"):format(api_base(t), t.plural)
end

local function object_path(t, ns, name)
  local p = collection(t, ns) .. "/" .. urlescape(name)
  if t.subresource then p = p .. "/" .. t.subresource end
  return p
end

-- The live object a write is about to change or delete, read whole (the
-- engine's own request) for the plan's before/after: the object, or nil
-- when absent, or nil and why it could not be read.
local function original_of(ok, obj)
  if ok then return type(obj) == "table" and obj or nil end
  -- a stop (a signal, a deadline, a lost lock) stops the rehearsal as any request's would
  if not errors.is_item_error(obj) then error(obj, 0) end
  if obj.code == 404 then return nil end
  return nil, "the live object could not be read: " .. obj.message
end

local function live_path(t)
  return object_path({ group = t.group, version = t.version, plural = t.plural }, t.ns, t.name)
end

-- (decoded without its managedFields, which the diff never shows: about
-- half of a typical object's bytes)
local function live_original(client, t)
  return original_of(pcall(client._internally, client, function()
    return (client:call("GET", live_path(t), { projection = overlay.WITHOUT_MANAGED_FIELDS }))
  end))
end

-- A view of client whose requests go to the live server as they are: not
-- through the overlay, not recorded, not bound (the engine's own requests
-- beside the rehearsal's).
local function live_view(client)
  return setmetatable({ dry_run = "server", record = false, binding = false, _internal = 0 },
    { __index = client })
end

-- The befores still to be read (an entry's before_due), read while the
-- plan's report is made, in its order (rehearsal.befores). The live server
-- holds each object at the resourceVersion the write's answer named,
-- unless something else wrote it since: then the version the rehearsal
-- started from is gone, and the object's before is not known (never a
-- later version shown as the one the plan changed). A namespace (or
-- cluster-scoped resource) with BEFORES_LISTED or more awaited is listed,
-- in the client's pages, for as long as at least one in LISTED_DENSITY of
-- what it has listed is awaited (a list page costs the server about what a
-- few dozen reads of one object do); the rest are read one by one, up to
-- the client's concurrency at once, ahead of the report. These are the
-- engine's own reads, to the live server as they are (not through the
-- overlay, not recorded, not bound); a list that fails (403, 410) leaves
-- its objects to be read one by one.
--
-- Read where the report needs it, a before is diffed and dropped: kept
-- until the end (as the JSON patch from the object's after back to it)
-- it cost a decode of every after and a patch each way (bench/README.md).
local BEFORES_LISTED, LISTED_DENSITY = 32, 16

local BEFORES_LIST_PROJECTION = { kind = true, apiVersion = true, metadata = true,
  items = { ["*"] = overlay.WITHOUT_MANAGED_FIELDS } }

-- The live object read for e (or nil, and why not), judged against the
-- version e's write was applied to.
local function judged(e, live, unknown)
  local md = type(live) == "table" and type(live.metadata) == "table" and live.metadata or nil
  if md and e.live_rv ~= nil and md.resourceVersion ~= e.live_rv then
    return nil, ("the live object changed during the rehearsal "
      .. "(resourceVersion %s when written, %s when read for the diff)")
      :format(e.live_rv, tostring(md.resourceVersion))
  elseif live == nil and unknown == nil then
    return nil, "the live object was deleted during the rehearsal"
  end
  return live, unknown
end

local Befores = {}
Befores.__index = Befores

-- The reader of the befores of `due` (entries, in the order they will be
-- taken: Befores:take), or nil outside a rehearsal. To-be-closed: its reads
-- in flight end with it.
function rehearsal.befores(client, due)
  if client.rehearsal == nil then return nil end
  local live = live_view(client)
  local r = setmetatable({ live = live, due = due, index = {}, group_of = {}, ahead = 1,
    concurrency = math.max(1, math.min(64, math.tointeger(live.concurrency) or 1)),
    held = {}, got = {}, n_got = 0 }, Befores)
  local groups = {}
  for i, e in ipairs(due) do
    local k = table.concat({ e.group, e.before_due, e.plural, e.ns or "" }, "\0")
    local g = groups[k]
    if g == nil then
      g = { t = { group = e.group, version = e.before_due, plural = e.plural }, ns = e.ns,
        due = {}, n = 0, found = {}, listed = 0, n_found = 0 }
      groups[k] = g
    end
    g.due[e.key], g.n = e, g.n + 1
    r.index[e], r.group_of[e] = i, g
  end
  for _, g in pairs(groups) do g.listing = g.n >= BEFORES_LISTED end
  r.m = live._t:multi { concurrency = r.concurrency }
  return r
end

function Befores:__close()
  self.m:close()
end

-- The next page of g's list: the awaited objects in it kept in g.found;
-- the listing stops at its end, when too few of it are awaited, or when
-- it fails.
function Befores:list_page(g)
  local live = self.live
  local query = { { "limit", tostring(live.page_limit) }, { "continue", g.continue } }
  local ok, page = pcall(live._internally, live, function()
    return (live:call("GET", collection(g.t, g.ns), { query = query,
      projection = BEFORES_LIST_PROJECTION }))
  end)
  if not ok then
    if not errors.is_item_error(page) then error(page, 0) end
    g.listing = false
    return
  end
  local items = type(page) == "table" and type(page.items) == "table" and page.items or {}
  -- a built-in kind's items name no kind: the list's does
  local kind = type(page.kind) == "string" and page.kind:match("^(.*)List$") or nil
  for _, o in ipairs(items) do
    local md = type(o) == "table" and o.metadata
    local e = type(md) == "table" and type(md.name) == "string"
      and g.due[overlay.list_key(md.namespace, md.name)] or nil
    if e ~= nil and g.found[e] == nil then
      if o.kind == nil then o.kind, o.apiVersion = kind, page.apiVersion end
      g.found[e], g.n_found = o, g.n_found + 1
    end
  end
  g.listed = g.listed + #items
  g.continue = type(page) == "table" and type(page.metadata) == "table"
    and page.metadata["continue"] or nil
  if g.continue == nil or g.continue == "" or g.n_found == g.n
      or g.n_found * LISTED_DENSITY < g.listed then
    g.listing = false
  end
end

-- Reads ahead, one by one, the befores to come that no list will find,
-- from the one taken (at) on, up to twice the concurrency read and not
-- yet taken; it stops at one whose namespace is still being listed.
function Befores:read_ahead(at)
  if self.ahead < at then self.ahead = at end
  local live = self.live
  while self.ahead <= #self.due and self.m:pending() + self.n_got < 2 * self.concurrency do
    local e = self.due[self.ahead]
    local g = self.group_of[e]
    if g.listing then return end
    if g.found[e] == nil then
      local t = { group = e.group, version = e.before_due, plural = e.plural, ns = e.ns,
        name = e.name }
      local req = live:_internally(function()
        return live:prepare("GET", live_path(t), { projection = overlay.WITHOUT_MANAGED_FIELDS })
      end)
      self.held[self.m:submit(req.method, req.path, req.options)] = { req = req, e = e }
      self.got[e] = false
    end
    self.ahead = self.ahead + 1
  end
end

-- e's before: the live object (decoded without managedFields, its
-- SERVER_SET metadata kept), or nil and why it is not known. The entries
-- are taken in the order `due` gives.
function Befores:take(e)
  local g, live = self.group_of[e], self.live
  while g.listing and g.found[e] == nil do self:list_page(g) end
  local o = g.found[e]
  if o ~= nil then
    g.found[e] = nil
    return judged(e, o)
  end
  self:read_ahead(self.index[e])
  while not self.got[e] do
    local id, code, body, attempts, warnings, decode_error = self.m:wait()
    if id == nil then break end -- (nothing in flight: never, as e is)
    local h = self.held[id]
    self.held[id] = nil
    self.got[h.e] = table.pack(original_of(pcall(live._internally, live, function()
      return (live:finish(h.req, code, body, attempts, warnings, decode_error))
    end)))
    self.n_got = self.n_got + 1
  end
  local r = self.got[e] or {}
  if self.got[e] then self.got[e], self.n_got = nil, self.n_got - 1 end
  self:read_ahead(self.index[e] + 1)
  return judged(e, r[1], r[2])
end

-- Where an object to be created in namespace ns is sent for validation:
-- its own namespace, or the stand-in when its own exists only in the
-- overlay (the live server would refuse it there: namespace not found).
-- Returns the namespace to send to, and why that is inexact.
local function namespace_for(state, t, ns, method, shown)
  if ns == nil then return nil end
  local nse = state.overlay:entry("", "namespaces", nil, ns)
  if nse == nil then return ns end
  if nse.state == "deleted" then
    refuse(method, shown, status(404, "NotFound", ("namespaces %q not found"):format(ns),
      { name = ns, kind = "namespaces" }))
  end
  if nse.live then return ns end
  return state.stand_in,
    ("%s %s/%s validated in namespace %s: its own namespace exists only in the rehearsal")
    :format(what(t.group, t.plural), ns, t.name or "", state.stand_in)
end

-- A create sent as it is, or, when its namespace exists only in the
-- overlay, sent to the stand-in namespace (marked inexact; the overlay
-- keeps the object in its own namespace: restore_namespace).
local function create_in_namespace(state, t, body, send, method, shown)
  local ns, why = namespace_for(state, t, t.ns, method, shown)
  if ns ~= t.ns then
    send.body = patch.deepcopy(body)
    send.body.metadata.namespace = ns
    send.path, send.restore_namespace, send.inexact = collection(t, ns), t.ns, why
  end
  return send
end

-- The request that validates `result` (an object the overlay holds, e.g.
-- after a patch applied here): a dry-run PUT carrying the live object's
-- resourceVersion, or, when only the overlay holds the object, a dry-run
-- POST of it (under a generated name when a live object of that name was
-- deleted in the rehearsal).
local function validation(state, t, e, result, send, method, shown)
  local body = patch.deepcopy(result)
  body.metadata = body.metadata or json.object {}
  send.ctype = nil -- the object itself, as JSON
  if e.live and not e.created then
    body.metadata.resourceVersion = e.live_rv
    send.method, send.path, send.body = "PUT", object_path(t, t.ns, t.name), body
    return send
  end
  if t.subresource then
    -- the status of an object only the overlay holds: nothing on the server to validate it against
    send.local_only = "the object exists only in the rehearsal"
    return send
  end
  body.metadata.resourceVersion, body.metadata.uid, body.metadata.creationTimestamp = nil, nil, nil
  if e.live then
    body.metadata.generateName, body.metadata.name = t.name .. "-", nil
    send.restore_name = t.name
  end
  local ns, why = namespace_for(state, t, t.ns, method, shown)
  if ns ~= t.ns then
    body.metadata.namespace = ns
    send.restore_namespace = t.ns
    send.inexact = why
  end
  send.method, send.path, send.body = "POST", collection(t, ns), body
  return send
end

-- A write's result computed here on the overlay's version `base`, as the
-- run's server would settle it: a resourceVersion precondition judged
-- against base's, name and namespace kept, a status write changing the
-- status only. Returns the result, or raises the run's server's answer.
local function settled(t, base, result, method, shown)
  if type(result) ~= "table" or type(result.metadata) ~= "table" then
    refuse(method, shown, status(422, "Invalid", PATCH_FAILED, {}))
  end
  local rv = result.metadata.resourceVersion
  if rv ~= nil and rv ~= base.metadata.resourceVersion then
    refuse(method, shown, conflict(t, t.name))
  end
  result.metadata.resourceVersion = base.metadata.resourceVersion
  result.metadata.name, result.metadata.namespace = base.metadata.name, base.metadata.namespace
  if t.subresource == "status" then
    -- a status write changes the status only
    local whole = patch.deepcopy(base)
    whole.status = result.status
    result = whole
  end
  return result
end

-- A patch or update applied here to the overlay's version `base`: the
-- result, or raises the run's server's answer (a failed op, a stale
-- resourceVersion). Returns the result and why it is inexact.
local function apply_here(t, base, method, ctype, body, shown, as_merge_why)
  local result, why
  if method == "PUT" then
    result = patch.deepcopy(body)
  elseif ctype == JSON_PATCH then
    local ok, res = pcall(patch.json_patch, base, body)
    if not ok then
      refuse(method, shown, status(422, "Invalid", PATCH_FAILED, {}))
    end
    result = res
  else
    result = patch.merge_patch(base, body)
    if ctype ~= MERGE_PATCH then
      why = ("%s %s: a %s applied as a merge patch to the rehearsal's version (%s)")
        :format(what(t.group, t.plural), t.ns and (t.ns .. "/" .. t.name) or t.name,
          tostring(ctype), as_merge_why or "no three-way merge")
    end
  end
  return settled(t, base, result, method, shown), why
end

local function query_value(query, name)
  for _, kv in ipairs(query or {}) do
    if kv[1] == name then return kv[2] end
  end
  return nil
end

-- A strategic merge or apply patch of an object the overlay holds
-- (cozy.kube.three_way): sent with dryRun=All to the live object L (the
-- engine's own requests, outside the overlay, L read first and named as
-- the patch's resourceVersion precondition), and the server's answer
-- merged three-way with the overlay's version. Returns the result and why
-- it is inexact (the conflicting fields), or nil and why it cannot be had
-- this way: the caller then applies the patch as a merge patch, inexact.
-- Raises the server's refusal of the patch, and the run's 409 for a
-- resourceVersion precondition on a version the overlay replaced.
local function merged_three_way(client, t, e, cur, path, query, body, ctype, shown)
  local apply = ctype == APPLY_PATCH
  local shown_obj = t.ns and (t.ns .. "/" .. t.name) or t.name
  if type(body) ~= "table" or patch.is_array(body) then return nil, "not an object" end
  if not e.live or e.created then
    -- the live server does not hold this object: it cannot apply the patch to it
    local only = "the object exists only in the rehearsal: the server cannot apply the patch to it"
    if apply then return nil, only end
    local result, cannot = three_way.strategic(cur, body, t.group)
    if result == nil then return nil, only .. ", nor the engine to " .. cannot end
    return settled(t, cur, result, "PATCH", shown)
  end
  local md = type(body.metadata) == "table" and body.metadata or nil
  if md and md.resourceVersion ~= nil and md.resourceVersion ~= cur.metadata.resourceVersion then
    refuse("PATCH", shown, conflict(t, t.name))
  end
  local live = live_view(client)
  local function call(...)
    local args = table.pack(...)
    return pcall(live._internally, live,
      function() return (live:call(table.unpack(args, 1, args.n))) end)
  end
  local ok, l = call("GET",
    object_path({ group = t.group, version = t.version, plural = t.plural }, t.ns, t.name))
  if not ok then
    if not errors.is_item_error(l) then error(l, 0) end
    return nil, "the live object could not be read: " .. l.message
  end
  if type(l) ~= "table" or type(l.metadata) ~= "table" then
    return nil, "the live object read is not an object"
  end
  local sent = patch.deepcopy(body)
  sent.metadata = type(sent.metadata) == "table" and sent.metadata or json.object {}
  sent.metadata.resourceVersion = l.metadata.resourceVersion
  local s
  ok, s = call("PATCH", path, { query = query, body = sent, content_type = ctype })
  if not ok then
    if not errors.is_item_error(s) then error(s, 0) end
    if s.code == 403 then return nil, "the dry-run patch of the live object was refused (403)" end
    s.judged_on = "the live object"
    error(s, 0)
  end
  if type(s) ~= "table" or type(s.metadata) ~= "table" then
    return nil, "the server's answer is not an object"
  end
  local merged, conflicts = three_way.merge(l, s, cur,
    { patch = body, apply = apply, group = t.group,
      field_manager = query_value(query, "fieldManager") })
  local why
  if #conflicts > 0 then
    why = ("%s %s: a %s of an object the rehearsal changed: both changed %s (three-way merge)")
      :format(what(t.group, t.plural), shown_obj,
        apply and "server-side apply" or "strategic merge patch", table.concat(conflicts, ", "))
  end
  merged.metadata = type(merged.metadata) == "table" and merged.metadata or json.object {}
  merged.metadata.resourceVersion = cur.metadata.resourceVersion
  merged.metadata.name, merged.metadata.namespace = cur.metadata.name, cur.metadata.namespace
  return merged, why
end

-- What Client:prepare does with a request in a rehearsal. Returns a table:
--   { answer = v }                  answered here (v may be nil: a write
--                                   applied only here answers its object)
--   { method, path, body, ... }     send this (a write with dryRun=All);
--                                   the table is the request's tag for finish
-- or nil: send the request as it is, untracked (discovery, a watch).
-- Raises what the run's server would answer (a 404 of a deleted object, a
-- failed JSON patch test, a stale resourceVersion).
local prepare
function rehearsal.prepare(client, method, path, query, body, ctype, spec, write, shown)
  if not write then return prepare(client, method, path, query, body, ctype, spec, write, shown) end
  local ok, res = pcall(prepare, client, method, path, query, body, ctype, spec, write, shown)
  if ok then return res end
  -- refused here as the run's server would refuse it: a verdict too
  if errors.is_error(res) then
    rehearsal.verdict(client, { method = method, path = path, body = body, content_type = ctype },
      "refused",
      res.message .. (" (judged on %s)"):format(res.judged_on or "the rehearsal's version"))
  end
  error(res, 0)
end

function prepare(client, method, path, query, body, ctype, spec, write, shown)
  local state = client.rehearsal
  local ov = state.overlay
  local t = target_of(method, path, query)
  if t == nil then
    if write then
      mark(state, ("%s %s: a write outside the resource tree is not tracked"):format(method, path))
      return { method = method, path = path, body = body, op = "untracked", shown = shown }
    end
    return nil
  end
  if not write then
    if t.verb == "watch" then
      if ov._entries and next(ov._entries) ~= nil then
        mark(state, ("watch of %s: the overlay's changes are not in it")
          :format(what(t.group, t.plural)))
      end
      return nil
    end
    if t.name == nil then
      local q = request.query_table(query)
      return { op = "list", t = t, method = method, path = path, label_selector = q.labelSelector,
        field_selector = q.fieldSelector, continue = q["continue"], projection = spec.projection }
    end
    if t.subresource ~= nil and t.subresource ~= "status" then
      if ov:entry(t.group, t.plural, t.ns, t.name) then
        mark(state, ("%s of %s %s: read from the live server")
          :format(t.subresource, what(t.group, t.plural), t.name))
      end
      return nil
    end
    local st, obj, why = ov:get(t.group, t.version, t.plural, t.ns, t.name)
    if st == "live" then return nil end
    if st == "deleted" then refuse(method, shown, obj) end
    if why then mark(state, why) end
    if type(spec.projection) == "table" then obj = projection.prune(obj, spec.projection) end
    return { answer = obj }
  end
  local send = { t = t, method = method, path = path, body = body, ctype = ctype, shown = shown,
    original = { method = method, path = path, body = body, content_type = ctype },
    projection = spec.projection }
  if method == "POST" and t.name == nil then
    -- a create: its name and namespace from the object
    local md = type(body) == "table" and type(body.metadata) == "table" and body.metadata or {}
    t.name = md.name
    t.ns = t.plural ~= "namespaces" and (t.ns or md.namespace) or nil
    send.op = "put"
    if t.name == nil then
      -- generateName: the server names it; its namespace may still need the stand-in
      return create_in_namespace(state, t, body, send, method, shown)
    end
    local e = ov:entry(t.group, t.plural, t.ns, t.name)
    if e and e.state == "present" then refuse(method, shown, exists(t, t.name)) end
    if e and e.state == "deleted" and e.live then
      send.created, send.live = true, true
      return validation(state, t, e, body, send, method, shown)
    end
    return create_in_namespace(state, t, body, send, method, shown)
  end
  if t.name == nil then
    mark(state, ("%s %s: a collection write is not tracked in the overlay"):format(method, path))
    send.op = "untracked"
    return send
  end
  local e = ov:entry(t.group, t.plural, t.ns, t.name)
  if t.subresource ~= nil and t.subresource ~= "status" then
    if e then mark(state, ("%s of %s %s: judged on the live object"):format(t.subresource,
      what(t.group, t.plural), t.name)) end
    send.op = "untracked"
    return send
  end
  if e and e.state == "deleted" then
    refuse(method, shown, overlay.not_found(t.group, t.plural, t.name))
  end
  if e == nil and method == "DELETE" then
    -- the first write of a live object: what it was, for the plan's diff
    send.before, send.before_unknown = live_original(client, t)
  end
  if method == "DELETE" then
    send.op = "delete"
    if e and (not e.live or e.created) then
      -- only the overlay holds this object: nothing on the server to delete
      send.local_only = "the object exists only in the rehearsal"
    end
    return send
  end
  if method ~= "PUT" and method ~= "PATCH" then
    send.op = "untracked"
    return send
  end
  send.op = "put"
  if e == nil then
    -- the live object is the base: the server applies the write to it,
    -- exactly; what it was is read for the plan's report (rehearsal.befores)
    send.live, send.from_live, send.before_due = true, true, t.version
    return send
  end
  local cur = ov:object(e)
  local result, why
  if method == "PATCH" and (ctype == STRATEGIC_PATCH or ctype == APPLY_PATCH) then
    local cannot
    result, why = merged_three_way(client, t, e, cur, path, query, body, ctype, shown)
    if result == nil then
      cannot = why
      result, why = apply_here(t, cur, method, ctype, body, shown, cannot)
    end
  else
    result, why = apply_here(t, cur, method, ctype, body, shown)
  end
  send.inexact = why
  send.result = result
  return validation(state, t, e, result, send, method, shown)
end

-- The write event of a rehearsal: the write as the step made it, the
-- server's verdict ("admitted", "refused", "not validated") and its message.
local function verdict(client, send, v, message)
  local state = client.rehearsal
  local key = v == "not validated" and "not_validated" or v
  send.method = send.method or "?"
  state.stats[key] = state.stats[key] + 1
  if send.inexact then mark(state, send.inexact) end
  local o = send.original or send
  client:record_write { method = o.method, path = o.path, query = { dryRun = "All" },
    content_type = o.content_type, body = o.body, verdict = v, message = message,
    inexact = send.inexact, kind = send.kind,
    validated_as = (send.method ~= o.method or send.path ~= o.path)
      and (send.method .. " " .. send.path) or nil }
end

rehearsal.verdict = function(...) return verdict(...) end

-- The projection a rehearsed write's answer is decoded with (its text is
-- kept too: Client:prepare, take): the step's own and what the overlay
-- needs of the object (kind, name, namespace, labels) for a put, else the
-- whole object (true).
local answer_projections = setmetatable({}, { __mode = "k" })
function rehearsal.answer_projection(send)
  local proj = send.op == "put" and send.projection or nil
  if type(proj) ~= "table" then return true end
  local u = answer_projections[proj]
  if u == nil then
    u = patch.deepcopy(proj)
    u.kind, u.apiVersion = true, true
    if type(u.metadata) ~= "table" and u.metadata ~= true then u.metadata = {} end
    if u.metadata ~= true then
      for _, k in ipairs { "name", "namespace", "labels", "resourceVersion" } do
        u.metadata[k] = true
      end
    end
    answer_projections[proj] = u
  end
  return u
end

-- The overlay's object after a write whose answer (or local result) is obj.
-- A write's answer comes with its text (send.text; obj decoded from it,
-- maybe projected: answer_projection), which the overlay keeps as it is
-- where it can: the first write of an object, which keeps its name and
-- namespace.
local function take(client, send, obj)
  local state, t = client.rehearsal, send.t
  if send.op ~= "put" or type(obj) ~= "table" or type(obj.metadata) ~= "table" then return obj end
  local text = send.text
  if text ~= nil and (send.restore_name or send.restore_namespace or send.before ~= nil
      or state.overlay:entry(t.group, t.plural, obj.metadata.namespace, obj.metadata.name)) then
    -- the object the overlay keeps is not the answer as it came: the whole of it, to change
    if type(send.projection) == "table" then obj = json.decode(text) end
    text = nil
  end
  if send.restore_name then
    obj.metadata.name, obj.metadata.generateName = send.restore_name, nil
  end
  if send.restore_namespace then obj.metadata.namespace = send.restore_namespace end
  local e = t.name and state.overlay:entry(t.group, t.plural, t.ns, t.name)
  if e and e.state == "present" and send.method == "POST" and not send.created then
    -- validated by a create: the object keeps the identity the overlay gave it
    local held = state.overlay:object(e).metadata
    obj.metadata.uid, obj.metadata.creationTimestamp = held.uid, held.creationTimestamp
  end
  local live_rv = send.from_live and obj.metadata.resourceVersion or nil
  if send.before_due and client.binding then
    -- the live object this write was applied to: read, as far as a saved plan is concerned
    client.binding:read_object(live_path(t), live_rv)
  end
  local kept = state.overlay:put(t.group, t.plural, obj, {
    live = send.live or (e and e.live) or false, created = send.created, live_rv = live_rv,
    api_version = t.group == "" and t.version or (t.group .. "/" .. t.version),
    inexact = send.inexact, before = send.before, before_unknown = send.before_unknown,
    before_due = send.before_due, text = text })
  if type(send.projection) == "table" then kept = projection.prune(kept, send.projection) end
  return kept
end

local function deleted(client, send, answer)
  local state, t = client.rehearsal, send.t
  local e = state.overlay:entry(t.group, t.plural, t.ns, t.name)
  local live = e == nil or e.live
  -- an object kept by its finalizers is terminating, not gone
  if type(answer) == "table" and answer.kind ~= "Status" and type(answer.metadata) == "table"
      and answer.metadata.deletionTimestamp ~= nil then
    local base = e and e.state == "present" and state.overlay:object(e) or patch.deepcopy(answer)
    base.metadata.deletionTimestamp = answer.metadata.deletionTimestamp
    state.overlay:put(t.group, t.plural, base,
      { live = live, live_rv = e == nil and answer.metadata.resourceVersion
      or nil, before = send.before, before_unknown = send.before_unknown })
    return answer
  end
  state.overlay:delete(t.group, t.plural, t.ns, t.name, live, send.before, send.before_unknown)
  return answer
end

-- A write applied here only: the object only the overlay holds, or a
-- dry-run write the server refused with 403.
function rehearsal.apply_locally(client, send, why)
  local t = send.t
  local o = send.original or send
  if send.op == "delete" then
    verdict(client, send, "not validated", why)
    return deleted(client, send, status(200, "Success", "", { name = t.name, kind = t.plural }))
  end
  if send.op ~= "put" then return nil end
  local result = send.result
  if result == nil then
    if o.method == "POST" or o.method == "PUT" then
      result = patch.deepcopy(o.body)
      if result.metadata and result.metadata.name == nil and result.metadata.generateName then
        mark(client.rehearsal,
          "a generated name cannot be known without the server: the object is left out")
        verdict(client, send, "not validated", why)
        return result
      end
    else
      -- the live object, read as the engine's own request
      local base = client:_internally(function()
        return (client:call("GET",
          object_path({ group = t.group, version = t.version, plural = t.plural }, t.ns, t.name)))
      end)
      if send.before == nil and send.before_unknown == nil then
        send.before, send.before_due = patch.deepcopy(base), nil
      end
      local r, inexact = apply_here(t, base, o.method, o.content_type, o.body, send.shown)
      result, send.inexact = r, send.inexact or inexact
    end
  end
  verdict(client, send, "not validated", why)
  return take(client, send, result)
end

-- The kind of an object (for the write event: the object a write names),
-- not of a Status.
function object_kind(obj)
  if type(obj) == "table" and type(obj.kind) == "string" and obj.kind ~= "Status" then
    return obj.kind
  end
  return nil
end

-- The answer to a request Client:prepare sent for a rehearsal (send, its
-- tag): ok and body as Client:finish judged it. Returns what the step gets.
function rehearsal.finish(client, send, ok, body, st, attempts)
  local state = client.rehearsal
  if send.op == "list" then
    if not ok then error(body, 0) end
    local tree = type(send.projection) == "table" and send.projection.items
      and send.projection.items["*"]
    local t = send.t
    local _, why = state.overlay:merge_page(body,
      { group = t.group, plural = t.plural, namespace = t.ns, label_selector = send.label_selector,
        field_selector = send.field_selector, continue = send.continue,
      project = tree and function(o) return projection.prune(o, tree) end or nil })
    if why then mark(state, why) end
    return body, st, attempts
  end
  if not ok then
    if errors.is_error(body) and body.code == 403 then
      return rehearsal.apply_locally(client, send,
        "the dry-run write was refused (403): " .. body.message), 200, attempts or {}
    end
    if send.before_due then
      -- what the refused write names: its kind (the object was not read before it)
      send.before, send.before_unknown = live_original(client, send.t)
    end
    send.kind = object_kind(send.before)
    verdict(client, send, "refused", errors.is_error(body) and body.message or tostring(body))
    error(body, 0)
  end
  send.kind = object_kind(body) or object_kind(send.before)
  verdict(client, send, "admitted")
  if send.op == "delete" then return deleted(client, send, body), st, attempts end
  return take(client, send, body), st, attempts
end

return rehearsal
