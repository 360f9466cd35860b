-- The list iterator of cozy.kube: pages of `limit` objects with continue
-- tokens; only one page is held at a time.
--
-- A 410 Expired on a continue request (the snapshot the token points into was
-- compacted away) restarts the list from the beginning. The API server
-- returns objects in key order ("namespace/name", as etcd stores them), so
-- the pager remembers only the last key it yielded and, after a restart,
-- skips every object up to and including that key: a consumer never sees an
-- object twice in one pass, and memory stays bounded by the page. What a
-- consumer sees then (docs/transport.md): objects after the last key come
-- from the newer snapshot; objects created or renamed before it meanwhile
-- are not seen in this pass. `pager.restarts` counts restarts, a warning is
-- logged for each, and opts.on_restart(pager) is called.
--
-- The pager trusts no page (docs/transport.md, "Lists"): a list answer must
-- be a JSON object of a *List kind whose items are objects with a name, and
-- pagination must move forward: a continue token already followed, a
-- continued page whose objects are not after the previous page's, or a run
-- of empty pages that still carry a token is an InvalidResponse error naming
-- the request, never a loop.
local errors = require "cozy.kube.errors"
local json = require "cozy.json"
local text = require "cozy.text"
local encode_query = require("cozy.kube.request").encode_query
local compare = require("cozy.sys").compare

local pager = {}

local Pager = {}
Pager.__index = Pager

local MAX_RESTARTS = 5
-- A real kube-apiserver fills every page it hands a continue token with;
-- a few empty ones are tolerated (an aggregated server may filter late), an
-- endless run of them is a server that never gets anywhere.
local MAX_EMPTY_PAGES = 16
pager.MAX_EMPTY_PAGES = MAX_EMPTY_PAGES

local function key_of(self, obj)
  local md = obj.metadata or {}
  if self.resource.namespaced and md.namespace then
    return md.namespace .. "/" .. (md.name or "")
  end
  return md.name or ""
end

-- a <= b in byte order (the API server's order), whatever the C locale
-- (Lua's string comparison uses strcoll).
local function le_bytes(a, b)
  return compare(a, b) <= 0
end
pager._le_bytes = le_bytes

-- What a JSON value is, for messages.
local function what(v)
  if v == nil then return "absent" end
  if v == json.null then return "null" end
  local t = type(v)
  if t == "table" then
    local mt = getmetatable(v)
    if mt == json.array_mt then return "an array" end
    if mt == json.object_mt then return "an object" end
    return "a table"
  end
  if t == "string" then return ("the string %q"):format(#v > 40 and v:sub(1, 40) .. "..." or v) end
  return ("a %s (%s)"):format(t, tostring(v))
end

local function is_object(v) return type(v) == "table" and getmetatable(v) == json.object_mt end
local function is_array(v) return type(v) == "table" and getmetatable(v) == json.array_mt end

local function short(token)
  return #token > 24 and token:sub(1, 24) .. "..." or token
end

-- The request as the error names it: path and query, as kube errors do.
local function shown(path, query)
  local qs = encode_query(query)
  return qs ~= "" and (path .. "?" .. qs) or path
end

local function invalid(request, status, attempts, fmt, ...)
  error(errors.new { method = "GET", path = request, code = status, reason = "InvalidResponse",
    message = fmt:format(...), attempts = attempts }, 0)
end

-- Checks one list answer; returns its items (an array, maybe empty) and the
-- greatest key among them.
local function check_page(self, list, request, status, attempts)
  if not is_object(list) then
    invalid(request, status, attempts, "a list answer must be a JSON object, got %s", what(list))
  end
  local kind = list.kind
  if kind ~= nil and not (type(kind) == "string" and kind:sub(-4) == "List") then
    invalid(request, status, attempts, "the answer's kind is %s, not a list kind (...List)",
      what(kind))
  end
  local md = list.metadata
  if md ~= nil and not is_object(md) then
    invalid(request, status, attempts, "the list's metadata is %s, not an object", what(md))
  end
  local cont = md and md["continue"]
  if cont ~= nil and type(cont) ~= "string" then
    invalid(request, status, attempts, "the list's metadata.continue is %s, not a string",
      what(cont))
  end
  local items = list.items
  if items == nil then
    -- an empty list whose items were omitted (omitempty): a list only if it says so
    if kind == nil then
      invalid(request, status, attempts, "the answer has neither items nor a kind: not a list")
    end
    return {}, nil
  end
  if not is_array(items) then
    invalid(request, status, attempts, "the list's items is %s, not an array", what(items))
  end
  local greatest
  for i = 1, #items do
    local obj = items[i]
    if not is_object(obj) then
      invalid(request, status, attempts, "items[%d] is %s, not an object", i - 1, what(obj))
    end
    local m = obj.metadata
    if not is_object(m) then
      invalid(request, status, attempts, "items[%d].metadata is %s, not an object", i - 1, what(m))
    end
    if type(m.name) ~= "string" or m.name == "" then
      invalid(request, status, attempts, "items[%d].metadata.name is %s, not a name", i - 1,
        what(m.name))
    end
    if m.namespace ~= nil and type(m.namespace) ~= "string" then
      invalid(request, status, attempts, "items[%d].metadata.namespace is %s, not a string", i - 1,
        what(m.namespace))
    end
    local k = key_of(self, obj)
    if greatest == nil or not le_bytes(k, greatest) then greatest = k end
  end
  return items, greatest
end

function pager.new(resource, opts)
  local self = setmetatable({
    resource = resource,
    namespace = opts.namespace,
    label_selector = opts.label_selector,
    field_selector = opts.field_selector,
    limit = opts.limit or resource.client.page_limit,
    on_restart = opts.on_restart,
    project = opts.project,  -- function(obj) -> the lean object yielded (Resource:list builds it)
    decode_projection = opts.decode_projection,  -- and what of each page json.decode builds
    restarts = 0,
    pages = 0,
    count = 0,
    skipped = 0,
    resource_version = nil,  -- of the snapshot being read
    _items = nil, _i = 0, _continue = nil, _done = false, _last_key = nil, _skip_to = nil,
    _followed = {},       -- every continue token handed out in this pass: one seen again is a loop
    _page_last = nil,     -- the greatest key of the previous page of this snapshot
    _empty_run = 0,       -- empty pages in a row that still carried a continue token
  }, Pager)
  return self
end

-- A 410 Expired on a continue request: the list restarts from the
-- beginning, skipping what was yielded (see the top of this file); raises
-- after MAX_RESTARTS.
function Pager:_restart(e)
  local r = self.resource
  local c = r.client
  self.restarts = self.restarts + 1
  c.stats.list_restarts = c.stats.list_restarts + 1
  if self.restarts > MAX_RESTARTS then
    e.message = ("%s (list restarted %d times)"):format(e.message, MAX_RESTARTS)
    error(e, 0)
  end
  local fields = { path = r:collection_path(self.namespace), restarts = self.restarts,
    yielded = self.count, resume_after = self._last_key }
  if c.log then
    c.log:warn("list continue token expired (410): restarting the list, skipping objects "
      .. "already yielded", fields)
  else
    io.stderr:write("cozy-migrate: warning: list continue token expired (410): restarting "
      .. "the list after ",
      text.line(tostring(self._last_key)), "\n")
  end
  self._continue = nil
  self._skip_to = self._last_key
  -- a new pass over a new snapshot: its tokens may repeat the old ones
  -- (same revision, same start), and that is no loop
  self._followed = {}
  self._page_last = nil
  self._empty_run = 0
  if self.on_restart then self.on_restart(self) end
end

-- Pagination must move forward: a continued page starts after the previous
-- one in key order, a continue token is never one already followed, and a
-- run of empty pages ends. Returns the page's continue token (nil: last).
function Pager:_check_progress(list, items, request, status, attempts)
  local sent = self._continue
  if sent ~= nil and self._page_last ~= nil then
    for i = 1, #items do
      local k = key_of(self, items[i])
      if le_bytes(k, self._page_last) then
        invalid(request, status, attempts,
          "page %d does not move forward: items[%d] %q is not after %q, "
          .. "the last object of the previous page", self.pages + 1, i - 1, k, self._page_last)
      end
    end
  end
  local cont = list.metadata and list.metadata["continue"]
  cont = (cont ~= nil and cont ~= "") and cont or nil
  if cont == nil then return nil end
  if cont == sent then
    invalid(request, status, attempts,
      "page %d answered the continue token it was asked with (%s): "
      .. "the list does not move forward", self.pages + 1, short(cont))
  elseif self._followed[cont] then
    invalid(request, status, attempts,
      "page %d answered a continue token already followed in this list "
      .. "(%s): the list does not move forward", self.pages + 1, short(cont))
  end
  self._followed[cont] = true
  self._empty_run = #items == 0 and self._empty_run + 1 or 0
  if self._empty_run > MAX_EMPTY_PAGES then
    invalid(request, status, attempts, "%d empty pages in a row, each with a new continue token: "
      .. "the list does not move forward", self._empty_run)
  end
  return cont
end

function Pager:_fetch()
  local r = self.resource
  local c = r.client
  local query = {
    { "labelSelector", self.label_selector },
    { "fieldSelector", self.field_selector },
    { "limit",
      self.limit and self.limit > 0 and tostring(math.tointeger(self.limit) or self.limit) or nil },
    { "continue", self._continue },
  }
  local path = r:collection_path(self.namespace)
  local ok, list, status, attempts = pcall(c.call, c, "GET", path, { query = query,
    projection = self.decode_projection })
  if not ok then
    if self._continue ~= nil and type(list) == "table" and list.code == 410 then
      self:_restart(list)
      return self:_fetch()
    end
    error(list, 0)
  end
  local request = shown(path, query)
  local items, greatest = check_page(self, list, request, status, attempts)
  local cont = self:_check_progress(list, items, request, status, attempts)
  self.pages = self.pages + 1
  self.resource_version = list.metadata and list.metadata.resourceVersion
  self._continue = cont
  self._done = cont == nil
  self._items = items
  if greatest ~= nil then self._page_last = greatest end
  self._i = 0
  self._kind = type(list.kind) == "string" and list.kind:gsub("List$", "") or nil
end

-- Next object, or nil at the end. Also the generic-for iterator: `for obj in pager`.
function Pager:next()
  while true do
    if self._items == nil then
      self:_fetch()
    end
    self._i = self._i + 1
    local obj = self._items[self._i]
    if obj == nil then
      if self._done then
        self._items = {}
        self._i = 0
        return nil
      end
      self._items = nil
    else
      local k = key_of(self, obj)
      if self._skip_to ~= nil and le_bytes(k, self._skip_to) then
        self.skipped = self.skipped + 1
      else
        self._skip_to = nil
        self._last_key = k
        self.count = self.count + 1
        self._items[self._i] = nil -- the page is released as it is consumed
        if obj.apiVersion == nil then obj.apiVersion = self.resource.api_version end
        if obj.kind == nil then obj.kind = self._kind end
        if self.project then obj = self.project(obj) end
        return obj
      end
    end
  end
end

Pager.__call = Pager.next

-- All remaining objects in a table (memory: the whole result; for small sets).
function Pager:collect()
  local out = {}
  for obj in self do out[#out + 1] = obj end
  return out
end

return pager
