-- cozy.kube: the Kubernetes client migrations and the runner use
-- (docs/engine-api.md is the contract, docs/transport.md the behaviour).
--
-- The C module cozy.transport owns configuration, TLS, auth, retries and the
-- rate limit; this module owns resources and paths, structured errors,
-- retry-safety of writes, pagination, the conflict-aware update loop and
-- dry runs.
local transport = require "cozy.transport"
local json = require "cozy.json"
local errors = require "cozy.kube.errors"
local patch = require "cozy.kube.patch"
local pager = require "cozy.kube.pager"
local request = require "cozy.kube.request"
local update = require "cozy.kube.update"
local base_errors = require "cozy.errors"

local kube = {
  Error = errors.Error,
  ConfigError = errors.ConfigError,
  is_error = errors.is_error,
  patch = patch,
}

-- Defaults, documented in docs/transport.md.
kube.defaults = {
  request_timeout = 30,
  qps = 1000,
  burst = 2000,
  page_limit = 500,
  -- changes of an update_each in flight at once (docs/transport.md, "Parallel writes")
  concurrency = 8,
  -- the update loop: client-go's DefaultBackoff is 4 steps of 10 ms x5
  -- (jitter 0.1); we allow more attempts, grow slower and cap the wait, so a
  -- busy object (a VM whose status virt-controller keeps writing) still gets
  -- its change in without multi-second sleeps.
  update = { attempts = 8, base_delay = 0.01, factor = 3, max_delay = 2, jitter = 0.5 },
}

local JSON_PATCH = "application/json-patch+json"
local MERGE_PATCH = "application/merge-patch+json"
local JSON = "application/json"

local Client = {}
Client.__index = Client

local Resource = {}
Resource.__index = Resource

local function urlescape(s)
  return (tostring(s):gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end
kube.urlescape = urlescape

-- Query parameters in a fixed order: a list of { key, value } pairs.
local function encode_query(pairs_)
  local out = {}
  for _, kv in ipairs(pairs_) do
    if kv[2] ~= nil then out[#out + 1] = urlescape(kv[1]) .. "=" .. urlescape(kv[2]) end
  end
  return table.concat(out, "&")
end

local function query_table(pairs_)
  local t = {}
  for _, kv in ipairs(pairs_) do
    if kv[2] ~= nil then t[kv[1]] = kv[2] end
  end
  return t
end

-- The connect options that are plain data (no functions): enough to open an
-- independent client in another Lua state (e.g. a lease renewer thread).
local plain_keys = { "kubeconfig", "context", "request_timeout", "connect_timeout", "qps", "burst",
  "token_refresh", "retry", "dry_run", "page_limit", "update", "max_response_bytes", "concurrency" }

local function warn(self, message, fields)
  if self.log then
    self.log:warn(message, fields)
  else
    local parts = { "cozy-migrate: warning: ", message }
    for k, v in pairs(fields or {}) do parts[#parts + 1] = (" %s=%s"):format(k, tostring(v)) end
    parts[#parts + 1] = "\n"
    io.stderr:write(table.concat(parts)) -- one write: other threads log too
  end
end

local function debug(self, message, fields)
  if self.log then self.log:debug(message, fields) end
end

function kube.connect(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("kube.connect: options must be a table", 2) end
  local dry = opts.dry_run
  if dry ~= nil and dry ~= "server" and dry ~= "client" then
    error(("kube.connect: dry_run must be nil, \"server\" or \"client\", got %q"):format(tostring(dry)), 2)
  end
  local t, cerr = transport.new {
    kubeconfig = opts.kubeconfig, context = opts.context,
    request_timeout = opts.request_timeout or kube.defaults.request_timeout,
    connect_timeout = opts.connect_timeout,
    qps = opts.qps or kube.defaults.qps, burst = opts.burst or kube.defaults.burst,
    token_refresh = opts.token_refresh, retry = opts.retry,
    max_response_bytes = opts.max_response_bytes,
  }
  if t == nil then
    error(errors.config { file = cerr.file, field = cerr.field ~= "" and cerr.field or nil, message = cerr.message })
  end
  local info = t:info()
  local options = {}
  for _, k in ipairs(plain_keys) do options[k] = opts[k] end
  local policy = {}
  for k, v in pairs(kube.defaults.update) do policy[k] = v end
  for k, v in pairs(opts.update or {}) do policy[k] = v end
  local self = setmetatable({
    namespace = info.namespace,
    server = info.server,
    info = info,
    options = options,
    dry_run = dry,
    record = opts.record,
    log = opts.log,
    page_limit = opts.page_limit or kube.defaults.page_limit,
    concurrency = math.tointeger(opts.concurrency) or kube.defaults.concurrency,
    update_policy = policy,
    stats = { requests = 0, writes = 0, retries = 0, conflicts = 0, list_restarts = 0, recorded = 0 },
    _t = t,
    _warned = {},
    _discovery = {},
  }, Client)
  if info.insecure then
    warn(self, "insecure-skip-tls-verify is set in the kubeconfig: the API server's certificate is NOT verified",
      { cluster = info.cluster, kubeconfig = info.source })
  end
  debug(self, "connected", { server = info.server, source = info.source, context = info.context,
    auth = info.auth, qps = info.qps, burst = info.burst })
  return self
end

function Client:close()
  if self._t then self._t:close() end
end

-- Views: the same connection, counters and dry-run mode under another gate.
-- The step executor gives each migration step a view whose gate carries the
-- step's rules (its declared permissions, read-only for check, the lock and
-- SIGTERM guard); the runner's own client carries the engine's gate.
function Client:view(gate)
  return setmetatable({ gate = gate, _internal = 0 }, { __index = self })
end

-- Runs fn with the gate's permission check off: the reads a client dry run
-- makes to compute what a write would return are the engine's, not the
-- migration's (the real write would not make them).
local function internally(self, fn)
  self._internal = (self._internal or 0) + 1
  local ok, res = pcall(fn)
  self._internal = self._internal - 1
  if not ok then error(res, 0) end
  return res
end

-- The choke point's decision: may this request be sent? Taken from the
-- request alone (its method and path); raises a cozy.errors error if not.
--   gate.permissions  the declared permissions (a migration's view): a
--                     request they do not cover is refused (kind "denied")
--   gate.read_only    a write is refused (kind "readonly"); the text says whose
--   gate.guard(method, path)  called before every write: raises to stop it
local function admit(self, method, path, query, write)
  local gate = self.gate
  if gate == nil then return end
  if gate.permissions and (self._internal or 0) == 0 then
    local a = request.attributes(method, path, query_table(query))
    if a.unroutable then
      base_errors.raise("denied", ("%s sent %s %s, which cannot be judged as the API server routes it (%s); nothing was sent")
        :format(gate.who or "a migration", method, path, a.unroutable),
        { migration = gate.who, method = method, path = path })
    end
    if not request.allowed(gate.permissions, a) then
      base_errors.raise("denied", ("%s sent %s %s, which its permissions do not declare; declare %s")
        :format(gate.who or "a migration", method, path, request.declaration(a)),
        { migration = gate.who, method = method, path = path })
    end
  end
  if write then
    if gate.read_only then
      base_errors.raise("readonly", ("%s attempted a write, %s %s: %s; nothing was sent")
        :format(gate.who or "a read-only caller", method, path, gate.read_only),
        { migration = gate.who, method = method, path = path })
    end
    if gate.guard then gate.guard(method, path) end
  end
end

local function record_write(self, method, path, query, ctype, body)
  if self.record then
    self.record { method = method, path = path, query = query_table(query), content_type = ctype, body = body }
  end
end

-- The request Client:call sends, prepared: the choke point's decision made
-- (admit), the query and body encoded, the gate's per-attempt guard bound.
-- Returns the prepared request, or (for a write a client dry run keeps back)
-- nil and the locally computed result. Split from sending so that a batch
-- of requests in flight at once takes exactly the same path.
function Client:prepare(method, path, spec)
  spec = spec or {}
  local query = spec.query or {}
  local body = spec.body
  local ctype = body ~= nil and (spec.content_type or JSON) or nil
  local write = request.is_write(method)
  admit(self, method, path, query, write)
  if write and self.dry_run == "client" then
    -- kept back: computed locally (a simulation that fails raises, as the
    -- real write would), then recorded exactly once
    local result
    if spec.simulate then result = internally(self, spec.simulate) end
    self.stats.recorded = self.stats.recorded + 1
    record_write(self, method, path, query, ctype, body)
    return nil, result
  end
  if write and self.dry_run == "server" then
    query = table.move(query, 1, #query, 1, {})
    query[#query + 1] = { "dryRun", "All" }
    -- sent for the server to judge, and shown on its way out, as a client
    -- dry run shows the writes it keeps back
    record_write(self, method, path, query, ctype, body)
  end
  local qs = encode_query(query)
  local shown = qs ~= "" and (path .. "?" .. qs) or path
  -- a write under a lock: every attempt (first and retried) is checked by
  -- the gate, and its time bounded so that "held until after the attempt"
  -- can be known (docs/transport.md, "The lock and retried writes")
  local gate = self.gate
  local before_attempt, timeout = nil, spec.timeout
  if write and gate and gate.before_attempt then
    before_attempt = function(info) return gate.before_attempt(info, method, path) end
    if timeout == nil and gate.write_timeout then timeout = gate.write_timeout() end
  end
  return {
    method = method, path = path, shown = shown, write = write,
    options = {
      -- a successful answer comes back decoded by the transport, straight
      -- from its buffer; only these parts of it with a projection
      decode = spec.projection or true,
      query = qs,
      body = body ~= nil and json.encode(body) or nil,
      content_type = ctype,
      retry_safe = spec.retry_safe,
      timeout = timeout,
      before_attempt = before_attempt,
      on_retry = function(a)
        warn(self, "retrying API request", { method = method, path = shown, code = a.code,
          reason = a.reason, after_s = a.after_s and ("%.2f"):format(a.after_s) or nil })
      end,
    },
  }
end

-- The answer to a prepared request (the transport's results): counted, its
-- warnings logged once, decoded; raises kube.Error for any non-2xx answer or
-- transport failure. A 2xx body arrives decoded (req.options.decode), or as
-- text with the decoder's message when it is not JSON.
function Client:finish(req, status, body, attempts, warnings, decode_error)
  -- attempts a watch stopped before they were sent are not requests
  local sent = 0
  for _, a in ipairs(attempts) do
    if a.sent ~= false then sent = sent + 1 end
  end
  local stats = self.stats
  stats.requests = stats.requests + sent
  stats.retries = stats.retries + math.max(0, sent - 1)
  if req.write then stats.writes = stats.writes + 1 end
  if status == 0 then error(errors.from_transport(req.method, req.shown, attempts)) end
  if warnings then
    -- the API server's Warning headers (deprecated APIs, ignored fields): once each per client
    for text in warnings:gmatch("[^\n]+") do
      if not self._warned[text] then
        self._warned[text] = true
        warn(self, "API server warning", { warning = text, method = req.method, path = req.path })
      end
    end
  end
  if status >= 200 and status < 300 then
    if decode_error ~= nil then
      error(errors.new { method = req.method, path = req.shown, code = status, reason = "InvalidResponse",
        message = "the server's answer is not JSON: " .. decode_error, attempts = attempts })
    end
    return body, status, attempts
  end
  local decoded -- a Status object, when the error body is one
  if body ~= nil and body ~= "" then
    local ok, v = pcall(json.decode, body)
    if ok then decoded = v end
  end
  error(errors.from_response(req.method, req.shown, status, decoded, body, attempts))
end

-- One API call: the one path every request of the engine, the runner and a
-- migration takes. Returns the decoded body (nil when empty), the status and
-- the attempts; raises kube.Error for any non-2xx answer or transport failure.
-- spec = { query = {{k,v},...}, body = lua value, content_type =, retry_safe =, timeout =,
--          simulate = function() -> the result a client dry run returns instead of sending }
-- Whether the request is a write is decided here, from its method.
function Client:call(method, path, spec)
  local req, kept_back = self:prepare(method, path, spec)
  if req == nil then return kept_back, 0, {} end
  return self:finish(req, self._t:request(method, path, req.options))
end

-- Resources ------------------------------------------------------------------

function Client:resource(api_version, plural, opts)
  if type(api_version) ~= "string" or type(plural) ~= "string" then
    error("resource(api_version, plural [, opts]) expects two strings", 2)
  end
  opts = opts or {}
  local base = api_version:find("/", 1, true) and ("/apis/" .. api_version) or ("/api/" .. api_version)
  return setmetatable({
    client = self,
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
    why = ("the answer has apiVersion %s, not %s"):format(tostring(obj.apiVersion), self.api_version)
  elseif self.kind and obj.kind ~= nil and obj.kind ~= self.kind then
    why = ("the answer is a %s, not a %s"):format(tostring(obj.kind), self.kind)
  elseif type(obj.metadata) ~= "table" or obj.metadata.name ~= name then
    why = ("the answer names %s, not %s"):format(tostring(type(obj.metadata) == "table" and obj.metadata.name), name)
  elseif ns ~= nil and obj.metadata.namespace ~= nil and obj.metadata.namespace ~= ns then
    why = ("the answer is in namespace %s, not %s"):format(tostring(obj.metadata.namespace), ns)
  end
  if why then
    error(errors.new { method = "GET", path = self:path(ns, name), code = status, reason = "InvalidResponse",
      message = why, attempts = attempts })
  end
  return obj
end

-- Does o name itself as an object of this resource: metadata.name, and
-- metadata.namespace when the resource is namespaced?
local function names_itself(self, o)
  local md = type(o) == "table" and o.metadata
  return type(md) == "table" and type(md.name) == "string" and (not self.namespaced or type(md.namespace) == "string")
end

-- lean: a projection tree (kube.projection) to decode the answer with, or nil
function Resource:_get(ns, name, lean)
  local obj, status, attempts = self.client:call("GET", self:path(ns, name), { projection = lean })
  return check_object(self, obj, ns, name, status, attempts)
end

-- opts of a single call: { absent = "skip" } makes an absent object (404
-- with details.name) return nil instead of raising; nil or "fail" raises.
local function absent_opts(opts, what)
  if opts == nil then return false end
  if type(opts) ~= "table" or (opts.absent ~= nil and opts.absent ~= "skip" and opts.absent ~= "fail") then
    error(("%s: opts must be a table whose absent is \"skip\" or \"fail\""):format(what), 3)
  end
  return opts.absent == "skip"
end

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
  return unless_absent(absent_opts(opts, "get"), self._get, self, ns, name)
end

function Resource:find(...)
  local ns, name = target(self, 2, ...)
  local ok, obj = pcall(self._get, self, ns, name)
  if ok then return obj end
  if errors.is_error(obj) and obj.absent == "object" then return nil end
  error(obj, 0)
end

-- Each write below hands Client:call a `simulate` function: what the write
-- would return, computed locally, for a client dry run. Whether the write is
-- sent, recorded or refused is Client:call's decision alone.

function Resource:create(obj)
  if type(obj) ~= "table" or type(obj.metadata) ~= "table" then
    error("create(obj): obj.metadata is required", 2)
  end
  local ns = obj.metadata.namespace
  if self.namespaced and ns == nil then
    error(("create(obj): %s is namespaced and obj.metadata.namespace is not set"):format(self.plural), 2)
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
  if ok then return res end
  if errors.is_error(res) and res.code == 409 and res.reason == "AlreadyExists" and named
      and update.uncertain(res.attempts) and c.dry_run == nil then
    local current = self:find(ns, obj.metadata.name) or {}
    local sent = patch.deepcopy(obj)
    sent.metadata.resourceVersion = nil
    if patch.contains(current, sent) then
      warn(c, "create: an earlier attempt landed; the object read back matches what was sent",
        { path = path, name = obj.metadata.name, attempts = #res.attempts })
      return current
    end
    res.message = res.message .. " (an earlier attempt may have landed, but the object read back differs from what was sent)"
  end
  error(res, 0)
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
  if type(p) ~= "table" then error("merge_patch: the patch must be a table", 2) end
  return unless_absent(absent_opts(opts, "merge_patch"), self._merge_patch, self, ns, name, p)
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
  if type(ops) ~= "table" then error("json_patch: ops must be an array of operations", 2) end
  return unless_absent(absent_opts(opts, "json_patch"), self._json_patch, self, ns, name, ops)
end

function Resource:delete(...)
  local ns, name, opts = target(self, 2, ...)
  -- an absent object raises in a client dry run too, as the real delete would
  unless_absent(absent_opts(opts, "delete"), self.client.call, self.client, "DELETE", self:path(ns, name),
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
  if type(fn) ~= "function" then error(("%s: the last argument must be a function"):format(what), level + 1) end
  return obj, ns, name, fn, absent_opts(opts, what)
end

-- One change driven by the update engine (cozy.kube.update): returns the
-- object, whether a write landed, and what compute's info was; raises
-- what ended it otherwise (an absent object's 404 included).
local function drive(self, ns, name, obj, compute, lean)
  local ch = update.one(update.new { resource = self, ns = ns, name = name, obj = obj, compute = compute,
    lean = lean })
  if ch.state == "done" then return ch.result, ch.changed, ch.info end
  error(ch.err, 0)
end

-- The conflict-aware update (docs/engine-api.md): mutate(copy) returns JSON
-- patch ops. Returns obj, changed.
function Resource:update(a, ...)
  local obj, ns, name, mutate, skip = subject(self, 2, "update", a, ...)
  -- mutate gets its own copy: the object must stay intact as the base of a
  -- client dry run, and mutate must not be able to change it behind us
  return unless_absent(skip, function()
    local obj_after, changed = drive(self, ns, name, obj, function(current) return mutate(patch.deepcopy(current)) end)
    return obj_after, changed
  end)
end

-- Change by editing a copy (docs/engine-api.md): edit(copy) changes a copy of
-- the object in place; the engine sends the JSON patch of the difference
-- (appends as /- adds, created parents, removals), nothing when there is
-- none, and on a conflict re-reads and edits again. Returns obj, changed and
-- what the last call of edit returned.
function Resource:change(a, ...)
  local obj, ns, name, edit, skip = subject(self, 2, "change", a, ...)
  return unless_absent(skip, drive, self, ns, name, obj, update.editing(edit))
end

-- update_each's argument checks; returns pull (the next item and its
-- value, nil: no more) and the projection tree of opts.project.
local function each_args(items, edit, opts)
  local pull = items
  if type(items) == "table" and (items[1] ~= nil or next(items) == nil) then
    local i = 0
    pull = function() i = i + 1 return items[i] end
  elseif type(items) == "table" and type(items.next) == "function" then
    pull = function() return items:next() end -- a list's pager, read as the batch goes
  elseif type(items) ~= "function" then
    error("update_each(items, edit, opts): items must be an array, a list or a function returning the next item", 3)
  end
  if type(edit) ~= "function" then error("update_each: edit must be a function", 3) end
  if opts.absent ~= nil and opts.absent ~= "skip" and opts.absent ~= "fail" then
    error("update_each: opts.absent must be \"skip\" or \"fail\"", 3)
  end
  if opts.project ~= nil and type(opts.project) ~= "table" then
    error("update_each: opts.project must be an array of dotted paths", 3)
  end
  return pull, opts.project and kube.projection(opts.project)
end

-- A batch of independent changes: change(item, edit) for each item (an
-- object), in no promised order (the items must not depend on each other).
-- items is an array; a list (a pager: its objects as they are read); or a
-- function returning the next item (nil: no more) and, optionally, a value
-- carried with it: edit(copy, item, value), and on_change and on_absent
-- after, are handed that value with the item, in every path (parallel,
-- serial, client dry run). The last two are pulled
-- only as the batch has room, so not all items need be held at once. opts:
--   absent = "skip"      an object deleted since the list is counted and
--                        skipped (on_absent(item, value) is told); else it raises
--   on_change(item, info, obj, value)  after each change that landed (or, in a
--                        client dry run, was recorded)
--   progress             an object with step(n), stepped after each item
--   project              dotted paths, as list's: the items are lean objects of
--                        that projection, and so are the re-reads after a
--                        conflict and the objects on_change is handed
-- Returns { total =, changed =, unchanged =, absent = }. The first other
-- error stops the batch and is raised.
function Resource:update_each(items, edit, opts)
  opts = opts or {}
  local pull, lean = each_args(items, edit, opts)
  local counts = { total = 0, changed = 0, unchanged = 0, absent = 0 }
  -- the next change, of an item that must be an object naming itself
  local function next_change()
    local item, value = pull()
    if item == nil then return nil end
    if not names_itself(self, item) then
      error(("update_each: an item is not an object whose metadata names it (got %s)"):format(type(item)), 0)
    end
    counts.total = counts.total + 1
    return update.new { resource = self, ns = item.metadata.namespace, name = item.metadata.name, obj = item,
      lean = lean, item = item, value = value,
      compute = update.editing(function(copy) return edit(copy, item, value) end) }
  end
  local done = 0
  local function ended(ch)
    done = done + 1
    if opts.progress then opts.progress:step(done) end
    if ch.state == "done" and ch.changed then
      counts.changed = counts.changed + 1
      if opts.on_change then opts.on_change(ch.item, ch.info, ch.result, ch.value) end
    elseif ch.state == "done" then
      counts.unchanged = counts.unchanged + 1
    elseif ch.state == "absent" and opts.absent == "skip" then
      counts.absent = counts.absent + 1
      if opts.on_absent then opts.on_absent(ch.item, ch.value) end
    else
      error(ch.err, 0)
    end
  end
  local concurrency = math.tointeger(opts.concurrency) or self.client.concurrency
  update.run(self.client, next_change, math.max(1, math.min(64, concurrency)), ended)
  return counts
end

-- A projection: dotted paths ("spec.template.spec.volumes"; "*" for every
-- element of an array) to the subtrees a lean list keeps, as a tree
-- { key = true | subtree, ["*"] = ... }. The object's identity (apiVersion,
-- kind, metadata name, namespace, uid, resourceVersion) is always kept, so
-- a lean object can be the base of an update or change.
function kube.projection(paths)
  local tree = { apiVersion = true, kind = true,
    metadata = { name = true, namespace = true, uid = true, resourceVersion = true } }
  for _, p in ipairs(paths) do
    if type(p) ~= "string" or p == "" then error("a projection is an array of dotted paths", 3) end
    local node, parts = tree, {}
    for part in p:gmatch("[^.]+") do parts[#parts + 1] = part end
    for i, part in ipairs(parts) do
      if node[part] == true then break end
      if i == #parts then node[part] = true else
        node[part] = node[part] or {}
        node = node[part]
      end
    end
  end
  return tree
end

-- The lean copy of v that a projection tree keeps: a kept path is present
-- exactly when it is present in v, with its parents (each holding only what
-- the projection names).
local function prune(v, tree)
  if tree == true or type(v) ~= "table" then return v end
  if patch.is_array(v) then
    if tree["*"] == nil then return v end
    local out = json.array {}
    for i = 1, #v do out[i] = prune(v[i], tree["*"]) end
    return out
  end
  local out = json.object {}
  for k, sub in pairs(tree) do
    if k ~= "*" and v[k] ~= nil then out[k] = prune(v[k], sub) end
  end
  return out
end
kube.prune = prune

-- Pagination hidden: see cozy.kube.pager.
function Resource:list(opts)
  opts = opts or {}
  if self.namespaced == false and opts.namespace ~= nil then
    error(("%s is cluster-scoped: list takes no namespace"):format(self.plural), 2)
  end
  local project, decode_projection = opts.project, nil
  if type(project) == "table" then
    -- applied while decoding: what is left out is never built, and what is
    -- built is already the lean object prune would make
    -- (spec/unit/json_projection_spec.lua: decode with it = decode, then prune)
    decode_projection = { kind = true, apiVersion = true, metadata = true,
      items = { ["*"] = kube.projection(project) } }
    project = nil
  elseif project ~= nil and type(project) ~= "function" then
    error("list: project must be an array of dotted paths or a function", 2)
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.project, o.decode_projection = project, decode_projection
  return pager.new(self, o)
end

-- Is `plural` of `api_version` served? Answered from discovery (the group
-- version's resource list), cached for the client's lifetime. A group
-- version the server does not know (404) is "not served"; any other error
-- raises: an unreachable server is never read as an absent API.
function Client:served(api_version, plural)
  if type(api_version) ~= "string" or type(plural) ~= "string" then
    error("served(api_version, plural) expects two strings", 2)
  end
  local cache = self._discovery
  local resources = cache[api_version]
  if resources == nil then
    local path = api_version:find("/", 1, true) and ("/apis/" .. api_version) or ("/api/" .. api_version)
    local ok, list = pcall(self.call, self, "GET", path)
    if ok then
      resources = {}
      for _, r in ipairs(type(list) == "table" and type(list.resources) == "table" and list.resources or {}) do
        if type(r) == "table" and type(r.name) == "string" then resources[r.name] = true end
      end
    elseif errors.is_error(list) and list.code == 404 then
      resources = {}
    else
      error(list, 0)
    end
    cache[api_version] = resources
  end
  return resources[plural] == true
end

-- Raw access for the runner (e.g. /version): decoded body, raises on failure.
function Client:get_path(path, query)
  return (self:call("GET", path, { query = query }))
end

kube.Client = Client
kube.Resource = Resource
kube._encode_query = encode_query
kube._fill_type = fill_type

return kube
