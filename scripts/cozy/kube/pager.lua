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
local pager = {}

local Pager = {}
Pager.__index = Pager

local MAX_RESTARTS = 5

local function key_of(self, obj)
  local md = obj.metadata or {}
  if self.resource.namespaced and md.namespace then return md.namespace .. "/" .. (md.name or "") end
  return md.name or ""
end

-- a <= b in byte order (the API server's order), whatever the C locale
-- (Lua's string comparison uses strcoll).
local function le_bytes(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
pager._le_bytes = le_bytes

function pager.new(resource, opts)
  local self = setmetatable({
    resource = resource,
    namespace = opts.namespace,
    label_selector = opts.label_selector,
    field_selector = opts.field_selector,
    limit = opts.limit or resource.client.page_limit,
    on_restart = opts.on_restart,
    restarts = 0,
    pages = 0,
    count = 0,
    skipped = 0,
    resource_version = nil,  -- of the snapshot being read
    _items = nil, _i = 0, _continue = nil, _done = false, _last_key = nil, _skip_to = nil,
  }, Pager)
  return self
end

function Pager:_fetch()
  local r = self.resource
  local c = r.client
  local query = {
    { "labelSelector", self.label_selector },
    { "fieldSelector", self.field_selector },
    { "limit", self.limit and self.limit > 0 and tostring(math.tointeger(self.limit) or self.limit) or nil },
    { "continue", self._continue },
  }
  local ok, list = pcall(c.call, c, "GET", r:collection_path(self.namespace), { query = query })
  if not ok then
    local e = list
    if self._continue ~= nil and type(e) == "table" and e.code == 410 then
      self.restarts = self.restarts + 1
      c.stats.list_restarts = c.stats.list_restarts + 1
      if self.restarts > MAX_RESTARTS then
        e.message = ("%s (list restarted %d times)"):format(e.message, MAX_RESTARTS)
        error(e, 0)
      end
      local fields = { path = r:collection_path(self.namespace), restarts = self.restarts,
        yielded = self.count, resume_after = self._last_key }
      if c.log then
        c.log:warn("list continue token expired (410): restarting the list, skipping objects already yielded", fields)
      else
        io.stderr:write("cozy-migrate: warning: list continue token expired (410): restarting the list after ",
          tostring(self._last_key), "\n")
      end
      self._continue = nil
      self._skip_to = self._last_key
      if self.on_restart then self.on_restart(self) end
      return self:_fetch()
    end
    error(e, 0)
  end
  self.pages = self.pages + 1
  self.resource_version = list.metadata and list.metadata.resourceVersion
  local cont = list.metadata and list.metadata["continue"]
  self._continue = (cont ~= nil and cont ~= "") and cont or nil
  self._done = self._continue == nil
  self._items = list.items or {}
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
