-- A plan bound to the cluster (docs/operations.md, "A saved plan"): the
-- client's record of a rehearsal (`plan --save`) and the check of a run
-- against it (`run --plan`).
--
-- Recording: every read a step's code (or the engine on its behalf) made
-- of the live cluster, with the resourceVersion it answered (an object,
-- one that was absent, a list's items with its selectors), and every
-- write, in order, per step. Checking: each write of the run, in
-- Client:prepare before it is sent, must be one the plan holds for that
-- step, not yet matched; the first that is not stops the run there.
--
-- A write is compared by method, path with its query (without dryRun),
-- content type and the sha256 of its canonical JSON body (keys sorted),
-- normalised: a resourceVersion that an earlier write of the same plan
-- answered (the overlay's "rehearsal-N" in the plan, the server's in the
-- run) is replaced by the name of that write ("write:S.I": step S, the
-- plan's I-th write of it), in metadata.resourceVersion and in a JSON
-- patch op on /metadata/resourceVersion. A live resourceVersion stays as
-- it is: the run starts only when every object the plan read still has it.
-- The engine's own stamp write is compared by the version it sets only
-- (its history record holds times and the runner's identity).
--
-- A legacy script's writes come through the engine's endpoint (cozy.kube.
-- overlay_endpoint), which marks them (Binding.script) for the time of each
-- call: recorded with `script = true`, compared as any write. A script's
-- own write of the version ConfigMap is compared as the engine's are, by
-- the version it sets (a script may send the whole ConfigMap back, with the
-- history records the run wrote at its own times), but it stays the
-- script's: it matches only a planned script write, and a step that ends
-- with one of them unmatched (a script that did not stamp as planned) wrote
-- fewer than planned.
--
-- The plan keeps a write's body redacted as the -v=8 trace shows it (no
-- Secret value) for display, and its digest for comparison.
local json = require "cozy.json"
local errors = require "cozy.errors"
local patch = require "cozy.kube.patch"
local request = require "cozy.kube.request"
local trace = require "cozy.kube.trace"
local sha256 = require("cozy.sys").sha256

local binding = {}

local JSON_PATCH = "application/json-patch+json"

local Binding = {}
Binding.__index = Binding

-- mode "record" (a rehearsal that is saved) or "check" (a run bound to
-- `plan`, the loaded plan's steps). stamp_path: the version ConfigMap's path.
function binding.new(mode, stamp_path, plan)
  return setmetatable({ mode = mode, stamp_path = stamp_path, plan = plan, steps = {}, order = {},
    reads = {}, read_order = {}, lists = {}, list_order = {}, rvs = {}, step = nil, stopped = nil },
    Binding)
end

function Binding:begin_step(number)
  self.step = number
  if self.steps[number] == nil then
    self.steps[number] = { writes = {} }
    self.order[#self.order + 1] = number
  end
  if self.mode == "check" then
    local planned = self.plan[number]
    self.current = { planned = planned and planned.writes or {}, matched = {} }
  end
end

function Binding:end_step()
  self.step, self.current = nil, nil
end

-- The version a stamp write sets (nil: a history record only, or none
-- said): a JSON patch's op on it, else (merge, strategic merge or apply
-- patch, update, create) the body's data.version.
local function stamp_version(ctype, body)
  if type(body) ~= "table" then return nil end
  if ctype ~= JSON_PATCH then return type(body.data) == "table" and body.data.version or nil end
  for _, op in ipairs(body) do
    if type(op) == "table" and op.path == "/data/version" then return op.value end
    if type(op) == "table" and op.path == "/data" and type(op.value) == "table" then
      return op.value.version
    end
  end
  return nil
end

local function symbol(self, v)
  if type(v) == "string" and self.rvs[v] then return self.rvs[v] end
  return v
end

-- The write as compared: { method, path, content_type, digest, stamp, version }.
function Binding:key(method, path, qs, ctype, body)
  local shown = qs ~= "" and (path .. "?" .. qs) or path
  local script = self.script or nil
  if path == self.stamp_path and self.step ~= nil then
    return { method = method, path = shown, stamp = true, version = stamp_version(ctype, body),
      script = script }
  end
  local b = body
  if type(b) == "table" then
    b = patch.deepcopy(b)
    if type(b.metadata) == "table" then
      b.metadata.resourceVersion = symbol(self, b.metadata.resourceVersion)
    end
    if ctype == JSON_PATCH then
      for _, op in ipairs(b) do
        if type(op) == "table" and op.path == "/metadata/resourceVersion" then
          op.value = symbol(self, op.value)
        end
      end
    end
  end
  return { method = method, path = shown, content_type = ctype,
    digest = sha256(b == nil and "" or json.encode(b)), script = script }
end

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function same(a, b)
  if a.stamp or b.stamp then
    return a.stamp == b.stamp and a.method == b.method and a.path == b.path
      and a.version == b.version
      and (a.script or false) == (b.script or false)
  end
  return a.method == b.method and a.path == b.path and a.content_type == b.content_type
    and a.digest == b.digest
end

local function describe(w)
  if w == nil then return "no further write" end
  if w.stamp then
    return ("the %sstamp %s %s%s"):format(w.script and "script's " or "", w.method, w.path,
      w.version and (" (version " .. tostring(w.version) .. ")") or "")
  end
  return ("%s%s %s%s (body sha256 %s)"):format(w.script and "the script's " or "", w.method, w.path,
    w.content_type and ("  (" .. w.content_type .. ")") or "",
    w.digest and w.digest:sub(1, 12) or "-")
end
binding.describe = describe

local function differs(self, message)
  self.stopped = message
  errors.raise("failed", message)
end

-- A write about to be prepared (method, path, its encoded query, content
-- type and body as the step made them). Returns the token its answer is
-- given back with (Binding:answered), or nil; raises, in a checked run,
-- before a write the plan does not hold.
function Binding:write(method, path, qs, ctype, body)
  if self.step == nil then return nil end
  if self.stopped then
    errors.raise("failed",
      "the run differs from the plan (" .. self.stopped .. "): nothing more is sent")
  end
  local k = self:key(method, path, qs, ctype, body)
  local step = self.step
  if self.mode == "record" then
    local writes = self.steps[step].writes
    local w = { method = k.method, path = k.path, content_type = k.content_type, digest = k.digest,
      stamp = k.stamp or nil, version = k.version, script = k.script }
    if not k.stamp and body ~= nil then
      w.body = type(body) == "table" and trace.redacted(body, request.is_secrets(path))
        or (request.is_secrets(path) and "<redacted>" or body)
    end
    writes[#writes + 1] = w
    return ("write:%d.%d"):format(step, #writes)
  end
  local cur = self.current
  local first
  for i, w in ipairs(cur.planned) do
    if not cur.matched[i] then
      first = first or w
      if k.stamp and not w.stamp then
        differs(self,
          ("step %d wrote fewer than planned: the stamp comes before the planned write %s")
          :format(step, describe(w)))
      end
      if same(w, k) then
        cur.matched[i] = true
        return ("write:%d.%d"):format(step, i)
      end
    end
  end
  differs(self, ("step %d's write differs from the plan: expected %s, got %s; not sent")
    :format(step, describe(first), describe(k)))
end

-- The answer of a write (token from Binding:write): its resourceVersion
-- is known by the write's name from now on.
function Binding:answered(token, obj)
  if token == nil or type(obj) ~= "table" or type(obj.metadata) ~= "table" then return end
  local rv = obj.metadata.resourceVersion
  if type(rv) == "string" then self.rvs[rv] = token end
end

-- In a checked run, at a step's end (before the engine's stamp): every
-- write the plan holds for it was made, the script's stamp included.
-- Raises naming the first missing one.
function Binding:check_complete(number)
  if self.mode ~= "check" or self.current == nil then return end
  for i, w in ipairs(self.current.planned) do
    if not self.current.matched[i] and (not w.stamp or w.script) then
      differs(self, ("step %d wrote fewer than planned: the planned write %s was not made")
        :format(number, describe(w)))
    end
  end
end

-- The object at path read at resourceVersion rv (false: absent; nil: an
-- object that names none): the first read of it is the one bound. Also for
-- a rehearsed write, whose answer names the live version it was applied to
-- (the engine reads the object itself only at the plan's end).
function Binding:read_object(path, rv)
  if self.mode ~= "record" or self.step == nil or self.reads[path] ~= nil then return end
  self.reads[path] = rv
  self.read_order[#self.read_order + 1] = path
end

-- A read answered by the live server (a rehearsal's step under way):
-- method, path, encoded query, whether it succeeded and the answer.
function Binding:read(path, qs, ok, body)
  if self.mode ~= "record" or self.step == nil then return end
  local q = {}
  for k, v in (qs or ""):gmatch("([^&=]+)=([^&]*)") do q[unescape(k)] = unescape(v) end
  if q.watch == "true" then return end
  local a = request.attributes("GET", path, {})
  if a.unroutable or a.non_resource or a.resource == nil then return end
  -- an object, its status, or another subresource that answers with its
  -- object's resourceVersion (a Deployment's scale): what a step computed
  -- from it is bound as much as what it computed from the object; one that
  -- answers none (a pod's log, text) cannot be bound, nor a 404 of one
  local other = a.subresource ~= nil and a.subresource ~= "status"
  if a.name ~= nil then
    if ok and type(body) == "table" and type(body.metadata) == "table"
        and (not other or type(body.metadata.resourceVersion) == "string") then
      self:read_object(path, body.metadata.resourceVersion)
    elseif not ok and not other and type(body) == "table" and body.code == 404 then
      self:read_object(path, false) -- absent
    end
    return
  end
  if other or not ok or type(body) ~= "table" then return end
  local key = path .. "\0" .. (q.labelSelector or "") .. "\0" .. (q.fieldSelector or "")
  local l = self.lists[key]
  if l == nil then
    l = { path = path, label_selector = q.labelSelector, field_selector = q.fieldSelector,
      items = {}, complete = false }
    self.lists[key] = l
    self.list_order[#self.list_order + 1] = key
  end
  for _, o in ipairs(type(body.items) == "table" and body.items or {}) do
    local md = type(o) == "table" and o.metadata
    if type(md) == "table" and type(md.name) == "string" then
      l.items[(md.namespace and (md.namespace .. "/") or "") .. md.name] = md.resourceVersion or ""
    end
  end
  local cont = type(body.metadata) == "table" and body.metadata["continue"] or nil
  if q["continue"] == nil and (cont == nil or cont == "") then l.complete = true end
end

-- What was recorded, for the plan file: { steps = { [n] = writes }, reads, lists }.
function Binding:recorded()
  local reads = {}
  for _, p in ipairs(self.read_order) do
    reads[#reads + 1] = json.object { path = p, resourceVersion = self.reads[p] or json.null,
      absent = self.reads[p] == false or nil }
  end
  local lists = {}
  for _, key in ipairs(self.list_order) do
    local l = self.lists[key]
    lists[#lists + 1] = json.object { path = l.path, labelSelector = l.label_selector,
      fieldSelector = l.field_selector, complete = l.complete, items = json.object(l.items) }
  end
  return reads, lists
end

-- Pages through a list as the plan's reads did: its items' keys and versions.
local function relist(client, l)
  local items, cont = {}, nil
  repeat
    local query = { { "labelSelector", l.labelSelector }, { "fieldSelector", l.fieldSelector },
      { "limit", "500" }, { "continue", cont } }
    local page = client:call("GET", l.path, { query = query })
    for _, o in ipairs(type(page) == "table" and type(page.items) == "table" and page.items
      or {}) do
      local md = type(o) == "table" and o.metadata
      if type(md) == "table" and type(md.name) == "string" then
        items[(md.namespace and (md.namespace .. "/") or "") .. md.name] = md.resourceVersion or ""
      end
    end
    cont = type(page) == "table" and type(page.metadata) == "table" and page.metadata["continue"]
      or nil
    if cont == "" then cont = nil end
  until cont == nil
  return items
end

local function selectors(l)
  local s = {}
  if l.labelSelector then s[#s + 1] = "labelSelector=" .. l.labelSelector end
  if l.fieldSelector then s[#s + 1] = "fieldSelector=" .. l.fieldSelector end
  return #s > 0 and ("?" .. table.concat(s, "&")) or ""
end

-- Is the cluster still as the plan read it? Returns nil, or what changed.
function binding.changed(client, reads, lists)
  for _, r in ipairs(reads) do
    local ok, obj = pcall(client.call, client, "GET", r.path)
    if r.absent then
      if ok then
        return ("%s was absent when the plan read it and exists now (resourceVersion %s)")
          :format(r.path,
            tostring(type(obj) == "table" and obj.metadata and obj.metadata.resourceVersion))
      end
      if not (type(obj) == "table" and obj.code == 404) then error(obj, 0) end
    else
      if not ok then
        if type(obj) == "table" and obj.code == 404 then
          return ("%s (resourceVersion %s when planned) is gone")
            :format(r.path, tostring(r.resourceVersion))
        end
        error(obj, 0)
      end
      local rv = type(obj) == "table" and type(obj.metadata) == "table"
        and obj.metadata.resourceVersion
      if rv ~= r.resourceVersion then
        return ("%s changed since the plan read it: resourceVersion %s, planned %s")
          :format(r.path, tostring(rv), tostring(r.resourceVersion))
      end
    end
  end
  for _, l in ipairs(lists) do
    local now = relist(client, l)
    local what = l.path .. selectors(l)
    for key, rv in pairs(l.items) do
      if now[key] == nil then
        return ("%s: %s is gone since the plan listed it"):format(what, key)
      end
      if now[key] ~= rv then
        return ("%s: %s changed since the plan listed it: resourceVersion %s, planned %s")
          :format(what, key, now[key], rv)
      end
    end
    if l.complete then
      local extra = {}
      for key in pairs(now) do if l.items[key] == nil then extra[#extra + 1] = key end end
      table.sort(extra)
      if #extra > 0 then
        return ("%s: %s appeared since the plan listed it"):format(what, table.concat(extra, ", "))
      end
    end
  end
  return nil
end

return binding
