-- Resources of cozy.kube: paths, reads, the writes (create with its
-- read-back, merge and JSON patches, delete), update and change through the
-- update engine (cozy.kube.update), update_each (cozy.kube.batch) and lists
-- (cozy.kube.pager). Every request goes through the client's Client:call
-- or, for the engine's changes, Client:prepare and Client:finish.
local json = require "cozy.json"
local batch = require "cozy.kube.batch"
local budget = require "cozy.kube.budget"
local errors = require "cozy.kube.errors"
local pager = require "cozy.kube.pager"
local patch = require "cozy.kube.patch"
local projection = require "cozy.kube.projection"
local request = require "cozy.kube.request"
local update = require "cozy.kube.update"
local validate = require "cozy.validate"

local resource = {}

local JSON_PATCH = "application/json-patch+json"
local MERGE_PATCH = "application/merge-patch+json"
-- server-side apply: the body is YAML, and JSON (what the client sends) is YAML
local APPLY_PATCH = "application/apply-patch+yaml"

local urlescape = request.urlescape

local Resource = {}
Resource.__index = Resource
resource.Resource = Resource

-- A resource of client c (Client:resource, whose caller an error names).
function resource.new(c, api_version, plural, opts)
  validate.args(3, "resource(api_version, plural [, opts])",
    { { "api_version", api_version, "string" }, { "plural", plural, "string" } })
  opts = opts or {}
  local base = api_version:find("/", 1, true) and ("/apis/" .. api_version)
    or ("/api/" .. api_version)
  return setmetatable({
    client = c,
    api_version = api_version,
    plural = plural,
    namespaced = opts.namespaced ~= false,
    kind = type(opts.kind) == "string" and opts.kind or nil,
    base = base,
  }, Resource)
end

function Resource:collection_path(ns)
  if self.namespaced and ns ~= nil then
    return ("%s/namespaces/%s/%s"):format(self.base, urlescape(ns), self.plural)
  end
  return ("%s/%s"):format(self.base, self.plural)
end

function Resource:path(ns, name)
  return self:collection_path(ns) .. "/" .. urlescape(name)
end

-- (ns, name, ...) for namespaced resources, (name, ...) for cluster-scoped.
local function target(self, level, ...)
  if self.namespaced then
    local ns, name = ...
    if type(ns) ~= "string" or type(name) ~= "string" then
      error(("%s is namespaced: expected (namespace, name, ...)"):format(self.plural), level + 1)
    end
    return ns, name, select(3, ...)
  end
  local name = ...
  if type(name) ~= "string" then
    error(("%s is cluster-scoped: expected (name, ...)"):format(self.plural), level + 1)
  end
  return nil, name, select(2, ...)
end

local function fill_type(self, obj, kind)
  if type(obj) == "table" then
    if obj.apiVersion == nil then obj.apiVersion = self.api_version end
    if obj.kind == nil and kind then obj.kind = kind end
  end
  return obj
end

-- A GET's answer must be the object asked for: an object of this
-- resource's apiVersion (and kind, when the resource knows it), with the
-- name and namespace asked; anything else is an InvalidResponse.
local function check_object(self, obj, ns, name, status, attempts)
  local why
  if type(obj) ~= "table" or patch.is_array(obj) then
    why = "the answer is not a JSON object"
  elseif obj.kind == "Status" or (type(obj.kind) == "string" and obj.kind:find("List$")) then
    why = ("the answer is a %s, not an object"):format(obj.kind)
  elseif obj.apiVersion ~= nil and obj.apiVersion ~= self.api_version then
    why = ("the answer has apiVersion %s, not %s")
      :format(tostring(obj.apiVersion), self.api_version)
  elseif self.kind and obj.kind ~= nil and obj.kind ~= self.kind then
    why = ("the answer is a %s, not a %s"):format(tostring(obj.kind), self.kind)
  elseif type(obj.metadata) ~= "table" or obj.metadata.name ~= name then
    why = ("the answer names %s, not %s"):format(tostring(type(obj.metadata) == "table"
      and obj.metadata.name), name)
  elseif ns ~= nil and obj.metadata.namespace ~= nil and obj.metadata.namespace ~= ns then
    why = ("the answer is in namespace %s, not %s"):format(tostring(obj.metadata.namespace), ns)
  end
  if why then
    error(errors.new { method = "GET", path = self:path(ns, name), code = status,
      reason = "InvalidResponse", message = why, attempts = attempts })
  end
  return obj
end

-- Does o name itself as an object of this resource: metadata.name, and
-- metadata.namespace when the resource is namespaced?
local function names_itself(self, o)
  local md = type(o) == "table" and o.metadata
  return type(md) == "table" and type(md.name) == "string"
    and (not self.namespaced or type(md.namespace) == "string")
end
Resource._names_itself = names_itself

-- lean: a projection tree (kube.projection) to decode the answer with, or nil
function Resource:_get(ns, name, lean)
  local obj, status, attempts = self.client:call("GET", self:path(ns, name), { projection = lean })
  return check_object(self, obj, ns, name, status, attempts)
end

-- opts of a single call: { absent = "skip" } makes an absent object (404
-- with details.name) return nil instead of raising; nil or "fail" raises.
local function with_absent(o)
  return type(o) == "table" and (o.absent == nil or o.absent == "skip" or o.absent == "fail")
end
local function absent_opts(opts, what)
  if opts == nil then return false end
  validate.arg(3, what, "opts", opts, with_absent,
    { says = 'a table whose absent is "skip" or "fail"' })
  return opts.absent == "skip"
end

-- The resource as a call given opts.retry (a retry budget, cozy.kube.budget)
-- sees it: the same resource on a client view whose requests, every one
-- the call makes, take their retry bounds from the budget.
local function budgeted(self, opts, level)
  local retry = type(opts) == "table" and opts.retry or nil
  if retry == nil then return self end
  return setmetatable({ client = self.client:with_budget(budget.new(retry, false, level + 1)) },
    { __index = self })
end
resource.budgeted = budgeted

-- fn(...), or with skip nil when it raised that its object is absent.
local function unless_absent(skip, fn, ...)
  if not skip then return fn(...) end
  local res = table.pack(pcall(fn, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  if errors.is_error(res[2]) and res[2].absent == "object" then return nil end
  error(res[2], 0)
end

function Resource:get(...)
  local ns, name, opts = target(self, 2, ...)
  local skip = absent_opts(opts, "get")
  self = budgeted(self, opts, 2)
  return unless_absent(skip, self._get, self, ns, name)
end

function Resource:find(...)
  local ns, name, opts = target(self, 2, ...)
  validate.arg(2, "find", "opts", opts, "table", true)
  self = budgeted(self, opts, 2)
  local ok, obj = pcall(self._get, self, ns, name)
  if ok then return obj end
  if errors.is_error(obj) and obj.absent == "object" then return nil end
  error(obj, 0)
end

-- Each write below hands Client:call a `simulate` function: what the write
-- would return, computed locally, for a client dry run. Whether the write is
-- sent, recorded or refused is Client:call's decision alone.

-- Returns the created object and true; with opts.exists = "skip" (create if
-- absent) an object of that name that exists already is returned as it is,
-- with false, instead of raising AlreadyExists.
local function with_exists(o)
  return type(o) == "table" and (o.exists == nil or o.exists == "skip" or o.exists == "fail")
end
function Resource:create(obj, opts)
  validate.arg(2, "create(obj)", "obj", obj, "table")
  validate.arg(2, "create(obj)", "obj.metadata", obj.metadata, "table")
  validate.arg(2, "create", "opts", opts, with_exists,
    { optional = true, says = 'a table whose exists is "skip" or "fail"' })
  local if_absent = opts ~= nil and opts.exists == "skip"
  if if_absent and obj.metadata.name == nil then
    error('create: { exists = "skip" } needs obj.metadata.name (a generateName never exists)', 2)
  end
  self = budgeted(self, opts, 2)
  local ns = obj.metadata.namespace
  if self.namespaced and ns == nil then
    error(("create(obj): %s is namespaced and obj.metadata.namespace is not set")
      :format(self.plural), 2)
  end
  if if_absent then
    -- a client dry run sends no POST to learn that the object exists: it
    -- reads it (a read the permissions of a create-if-absent declare: get)
    local existing = self.client.dry_run == "client" and self:find(ns, obj.metadata.name) or nil
    if existing then return existing, false end
    local ok, res = pcall(self.create, self, obj)
    if ok then return res, true end
    if errors.is_error(res) and res.code == 409 and res.reason == "AlreadyExists" then
      local current = self:find(ns, obj.metadata.name)
      if current then return current, false end
    end
    error(res, 0)
  end
  local path = self:collection_path(ns)
  fill_type(self, obj)
  local c = self.client
  -- A named create may be repeated: a second POST cannot create a second
  -- object, and an AlreadyExists after an uncertain attempt is resolved by
  -- reading the object back (docs/transport.md). generateName cannot.
  local named = obj.metadata.name ~= nil
  local ok, res = pcall(c.call, c, "POST", path, { body = obj, retry_safe = named,
    simulate = function() return patch.deepcopy(obj) end })
  if ok then return res, true end
  if errors.is_error(res) and res.code == 409 and res.reason == "AlreadyExists" and named
      and update.uncertain(res.attempts) and c.dry_run == nil then
    local current = self:find(ns, obj.metadata.name) or {}
    local sent = patch.deepcopy(obj)
    sent.metadata.resourceVersion = nil
    if patch.contains(current, sent) then
      c:_warn("create: an earlier attempt landed; the object read back matches what was sent",
        { path = path, name = obj.metadata.name, attempts = #res.attempts })
      return current, true
    end
    res.message = res.message
      .. " (an earlier attempt may have landed, but the object read back differs "
      .. "from what was sent)"
  end
  error(res, 0)
end

local function apply_options(o)
  return type(o) == "table" and type(o.field_manager) == "string" and o.field_manager ~= ""
    and #o.field_manager <= 128 and (o.force == nil or type(o.force) == "boolean")
end

-- Server-side apply: the fields obj sets become field_manager's, the object
-- is created when absent, and a field another manager owns with another
-- value is a 409 Conflict unless opts.force. One PATCH through Client:call,
-- so every dry-run mode, the gate (verb patch) and the rehearsal treat it as
-- they treat any patch. A replay is safe: the same manager applying the same
-- fields again changes nothing.
function Resource:apply(obj, opts)
  validate.arg(2, "apply(obj, opts)", "obj", obj, function(o)
    return type(o) == "table" and type(o.metadata) == "table" and type(o.metadata.name) == "string"
      and o.metadata.name ~= ""
  end, { says = "an object with metadata.name" })
  validate.arg(2, "apply(obj, opts)", "opts", opts, apply_options,
    { says = "a table { field_manager = a name of 1 to 128 bytes, force = nil or a boolean }" })
  local body = fill_type(self, patch.deepcopy(obj), self.kind)
  validate.arg(2, "apply(obj, opts)", "obj.kind", body.kind, "string",
    { says = ("a string (%s has no kind known to the client)"):format(self.plural) })
  local ns, name = body.metadata.namespace, body.metadata.name
  if self.namespaced and ns == nil then
    error(("apply(obj, opts): %s is namespaced and obj.metadata.namespace is not set")
      :format(self.plural), 2)
  end
  self = budgeted(self, opts, 2)
  local query = { { "fieldManager", opts.field_manager } }
  if opts.force then query[2] = { "force", "true" } end
  return (self.client:call("PATCH", self:path(ns, name),
    { body = body, content_type = APPLY_PATCH, query = query, retry_safe = true,
    -- a client dry run: the applied fields merged into the object as it is
    -- (maps key by key, anything else replaced), without the field managers
    simulate = function() return patch.merge_patch(self:find(ns, name) or {}, body) end }))
end

function Resource:_merge_patch(ns, name, p, base)
  local path = self:path(ns, name)
  -- Applying the same merge patch twice yields the same object, but a replay
  -- after an uncertain first attempt could overwrite another writer's change
  -- made in between; only a resourceVersion precondition makes it safe.
  local safe = type(p.metadata) == "table" and p.metadata.resourceVersion ~= nil
  return (self.client:call("PATCH", path, { body = p, content_type = MERGE_PATCH, retry_safe = safe,
    simulate = function() return patch.merge_patch(base or self:_get(ns, name), p) end }))
end

function Resource:merge_patch(...)
  local ns, name, p, opts = target(self, 2, ...)
  validate.arg(2, "merge_patch", "the patch", p, "table")
  local skip = absent_opts(opts, "merge_patch")
  self = budgeted(self, opts, 2)
  return unless_absent(skip, self._merge_patch, self, ns, name, p)
end

local function as_ops(ops)
  if getmetatable(ops) == nil then json.array(ops) end
  return ops
end

-- The PATCH a JSON patch sends, for Client:prepare (the update engine sends
-- it in a batch; _json_patch through Client:call): method, path, spec.
function Resource:_patch_request(ns, name, ops, base, lean)
  local path = self:path(ns, name)
  as_ops(ops)
  local function simulate()
    local ok, res = pcall(patch.json_patch, base or self:_get(ns, name), ops)
    if ok then return res end
    local msg = type(res) == "table" and res.patch_error or tostring(res)
    error(errors.new { method = "PATCH", path = path, code = 422, reason = "Invalid",
      message = "client dry run: " .. msg, details = { name = name }, attempts = {} })
  end
  -- a leading test makes a replay fail instead of applying twice
  local safe = type(ops[1]) == "table" and ops[1].op == "test"
  return "PATCH", path, { body = ops, content_type = JSON_PATCH, retry_safe = safe,
    simulate = simulate, projection = lean }
end

function Resource:_json_patch(ns, name, ops, base, lean)
  return (self.client:call(self:_patch_request(ns, name, ops, base, lean)))
end

function Resource:json_patch(...)
  local ns, name, ops, opts = target(self, 2, ...)
  validate.arg(2, "json_patch", "ops", ops, "table", { says = "an array of operations" })
  local skip = absent_opts(opts, "json_patch")
  self = budgeted(self, opts, 2)
  return unless_absent(skip, self._json_patch, self, ns, name, ops)
end

function Resource:delete(...)
  local ns, name, opts = target(self, 2, ...)
  local skip = absent_opts(opts, "delete")
  self = budgeted(self, opts, 2)
  -- an absent object raises in a client dry run too, as the real delete would
  unless_absent(skip, self.client.call, self.client, "DELETE", self:path(ns, name),
    { simulate = function() self:_get(ns, name) end })
  return nil
end

-- The object as a write left it: in a dry run (nothing was stored) the
-- write's answer itself, what it would have produced; otherwise a fresh
-- read of it, nil when it is gone since.
function Resource:read_back(written)
  if not names_itself(self, written) then
    error("read_back(obj): obj.metadata must name the object (the answer of a write)", 2)
  end
  if self.client.dry_run ~= nil then return written end
  return self:find(written.metadata.namespace, written.metadata.name)
end

-- (obj, fn) or (ns, name, fn) / (name, fn): the object to start from, its
-- namespace and name, and the function.
local function subject(self, level, what, a, ...)
  local obj, ns, name, fn, opts
  if type(a) == "table" then
    obj, fn, opts = a, ...
    if not names_itself(self, obj) then
      error(("%s(obj, fn): obj.metadata must name the object"):format(what), level + 1)
    end
    ns, name = obj.metadata.namespace, obj.metadata.name
  else
    ns, name, fn, opts = target(self, level + 1, a, ...)
  end
  validate.arg(level + 1, what, "the last argument", fn, "function")
  return obj, ns, name, fn, absent_opts(opts, what), budgeted(self, opts, level + 1)
end

-- One change driven by the update engine (cozy.kube.update): returns the
-- object, whether a write landed, and what compute's info was; raises
-- what ended it otherwise (an absent object's 404 included).
local function drive(self, ns, name, obj, compute, lean)
  local ch = update.one(update.new { resource = self, ns = ns, name = name, obj = obj,
    compute = compute, lean = lean })
  if ch.state == "done" then return ch.result, ch.changed, ch.info end
  error(ch.err, 0)
end

-- The conflict-aware update (docs/engine-api.md): mutate(copy) returns JSON
-- patch ops. Returns obj, changed.
function Resource:update(a, ...)
  local obj, ns, name, mutate, skip, res = subject(self, 2, "update", a, ...)
  self = res
  -- mutate gets its own copy: the object must stay intact as the base of a
  -- client dry run, and mutate must not be able to change it behind us
  return unless_absent(skip, function()
    local obj_after, changed = drive(self, ns, name, obj,
      function(current) return mutate(patch.deepcopy(current)) end)
    return obj_after, changed
  end)
end

-- Change by editing a copy (docs/engine-api.md): edit(copy) changes a copy of
-- the object in place; the engine sends the JSON patch of the difference
-- (appends as /- adds, created parents, removals), nothing when there is
-- none, and on a conflict re-reads and edits again. Returns obj, changed and
-- what the last call of edit returned.
function Resource:change(a, ...)
  local obj, ns, name, edit, skip, res = subject(self, 2, "change", a, ...)
  self = res
  return unless_absent(skip, drive, self, ns, name, obj, update.editing(edit))
end

-- Pagination hidden: see cozy.kube.pager.
function Resource:list(opts)
  opts = opts or {}
  self = budgeted(self, opts, 2)
  if self.namespaced == false and opts.namespace ~= nil then
    error(("%s is cluster-scoped: list takes no namespace"):format(self.plural), 2)
  end
  local project, decode_projection = opts.project, nil
  if type(project) == "table" then
    -- applied while decoding: what is left out is never built, and what is
    -- built is already the lean object prune would make
    -- (spec/unit/json_projection_spec.lua: decode with it = decode, then prune)
    decode_projection = { kind = true, apiVersion = true, metadata = true,
      items = { ["*"] = projection.new(project) } }
    project = nil
  else
    validate.arg(2, "list", "project", project, "function",
      { optional = true, says = "an array of dotted paths or a function" })
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.project, o.decode_projection = project, decode_projection
  return pager.new(self, o)
end

Resource.update_each = batch.update_each

return resource
