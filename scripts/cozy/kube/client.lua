-- The client of cozy.kube: the connection, the gate every request passes
-- (Client:prepare), the one place answers are judged (Client:finish), the
-- one function that sends a single request (Client:call), and the
-- discovery cache (Client:served). Batches (cozy.kube.update) send through
-- Client:prepare and Client:finish too.
local transport = require "cozy.transport"
local budget = require "cozy.kube.budget"
local json = require "cozy.json"
local labels = require "cozy.kube.labels"
local names = require "cozy.kube.names"
local errors = require "cozy.kube.errors"
local request = require "cozy.kube.request"
local rehearsal = require "cozy.kube.rehearsal"
local resource = require "cozy.kube.resource"
local trace = require "cozy.kube.trace"
local text = require "cozy.text"
local validate = require "cozy.validate"

local client = {}

-- Defaults, documented in docs/transport.md.
client.defaults = {
  request_timeout = 30,
  qps = 1000,
  burst = 2000,
  page_limit = 500,
  -- changes of an update_each in flight at once (docs/transport.md, "Parallel writes")
  concurrency = 8,
}

local JSON = "application/json"

local encode_query, query_table = request.encode_query, request.query_table

local Client = {}
Client.__index = Client
client.Client = Client

-- The connect options that are plain data (no functions): enough to open an
-- independent client in another Lua state (e.g. a lease renewer thread).
local plain_keys = { "kubeconfig", "context", "request_timeout", "connect_timeout", "qps", "burst",
  "token_refresh", "retry", "dry_run", "page_limit", "update", "max_response_bytes", "concurrency",
  "exec_timeout" }

local function warn(self, message, fields)
  if self.log then
    self.log:warn(message, fields)
  else
    local parts = { "cozy-migrate: warning: ", text.line(message) }
    for k, v in pairs(fields or {}) do
      parts[#parts + 1] = (" %s=%s"):format(text.line(k), text.line(tostring(v)))
    end
    parts[#parts + 1] = "\n"
    io.stderr:write(table.concat(parts)) -- one write: other threads log too
  end
end

local function debug(self, message, fields)
  if self.log then self.log:debug(message, fields) end
end

function client.connect(opts)
  opts = opts or {}
  validate.arg(2, "kube.connect", "options", opts, "table")
  local dry = opts.dry_run
  validate.arg(2, "kube.connect", "dry_run", dry, { one_of = { "server", "client", "rehearse" } },
    { optional = true, says = 'nil, "server", "client" or "rehearse"', show = "got" })
  local t, cerr = transport.new {
    kubeconfig = opts.kubeconfig, context = opts.context,
    request_timeout = opts.request_timeout or client.defaults.request_timeout,
    connect_timeout = opts.connect_timeout,
    qps = opts.qps or client.defaults.qps, burst = opts.burst or client.defaults.burst,
    token_refresh = opts.token_refresh, retry = opts.retry,
    max_response_bytes = opts.max_response_bytes, exec_timeout = opts.exec_timeout,
  }
  if t == nil then
    error(errors.config { file = cerr.file, field = cerr.field ~= "" and cerr.field or nil,
      message = cerr.message })
  end
  local info = t:info()
  local options = {}
  for _, k in ipairs(plain_keys) do options[k] = opts[k] end
  -- the update engine's conflicts: the "conflict" retry policy (core/retry_policy.c)
  local policy = transport.retry_policy("conflict", opts.update)
  local self = setmetatable({
    namespace = info.namespace,
    server = info.server,
    info = info,
    options = options,
    dry_run = dry,
    record = opts.record,
    log = opts.log,
    page_limit = opts.page_limit or client.defaults.page_limit,
    concurrency = math.tointeger(opts.concurrency) or client.defaults.concurrency,
    update_policy = policy,
    stats = { requests = 0, writes = 0, retries = 0, conflicts = 0, list_restarts = 0,
      recorded = 0 },
    _t = t,
    _warned = {},
    _discovery = {},
    _names = {}, -- cozy.kube.names: resources by kubectl name, resolved
    -- a rehearsal's overlay and verdicts (cozy.kube.rehearsal), shared by every view
    rehearsal = dry == "rehearse" and rehearsal.new { stand_in = opts.stand_in } or nil,
  }, Client)
  if info.insecure then
    warn(self,
      "insecure-skip-tls-verify is set in the kubeconfig: the certificates of the "
      .. "API server and of "
      .. "an https proxy are NOT verified",
      { cluster = info.cluster, kubeconfig = info.source })
  end
  debug(self, "connected", { server = info.server, source = info.source, context = info.context,
    auth = info.auth, impersonate = info.impersonate, qps = info.qps, burst = info.burst })
  return self
end

-- For the client's modules (a resource's create read-back): a warning
-- through the client's logger.
function Client:_warn(message, fields)
  warn(self, message, fields)
end

-- A resource of this client (cozy.kube.resource).
function Client:resource(api_version, plural, opts)
  return resource.new(self, api_version, plural, opts)
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

-- The same view under a retry budget (cozy.kube.budget): every request
-- sent through it (a resource's reads, writes, list pages and the update
-- engine's, all of a batch's) takes its bounds from `b`.
function Client:with_budget(b)
  if b == nil then return self end
  return setmetatable({ retry_budget = b }, { __index = self })
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

function Client:_internally(fn)
  return internally(self, fn)
end

-- The choke point's decision (cozy.kube.gate): may this request be sent?
local function admit(self, method, path, query, write)
  if self.gate then self.gate:admit(method, path, query, write, (self._internal or 0) > 0) end
end

-- A write made a dry run for the server: dryRun=All in its query and, for a
-- DELETE that carries DeleteOptions (kubectl always sends one), in the body
-- too: kube-apiserver reads a delete's options from its body when it has
-- one and then ignores the query, so a query alone would delete for real.
-- Returns the new query and body; the caller's are left as they were.
local function dry_run_request(method, query, body)
  query = table.move(query, 1, #query, 1, {})
  query[#query + 1] = { "dryRun", "All" }
  if method == "DELETE" and type(body) == "table" then
    local options = {}
    for k, v in pairs(body) do options[k] = v end
    options.dryRun = json.array { "All" }
    body = setmetatable(options, getmetatable(body))
  end
  return query, body
end

-- Every write a dry run shows (kept back, judged by the server, or
-- rehearsed) reaches the observer here, once, with its body redacted as the
-- -v=8 trace shows it (the write itself keeps the body it was given): no
-- mode of a plan, nor check's findings, prints a Secret's values.
function Client:record_write(event)
  if not self.record then return end
  local body, path = event.body, event.path
  if type(body) == "table" then event.body = trace.redacted(body, request.is_secrets(path))
  elseif body ~= nil and request.is_secrets(path) then event.body = "<redacted>" end
  self.record(event)
end

local function record_write(self, method, path, query, ctype, body)
  self:record_write { method = method, path = path, query = query_table(query),
    content_type = ctype, body = body }
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
  -- a label or annotation the server would refuse is refused here, unsent
  -- (in a plan too, where the write would otherwise look fine)
  if write then labels.check(method, path, body, ctype) end
  -- a plan being saved records the write as the step made it; a run bound
  -- to a plan refuses here, unsent, a write the plan does not hold
  -- (cozy.kube.binding)
  local bound
  if write and self.binding then
    bound = self.binding:write(method, path, encode_query(query), ctype, body)
  end
  if write and self.dry_run == "client" then
    -- kept back: computed locally (a simulation that fails raises, as the
    -- real write would), then recorded exactly once
    local result
    if spec.simulate then result = internally(self, spec.simulate) end
    self.stats.recorded = self.stats.recorded + 1
    record_write(self, method, path, query, ctype, body)
    return nil, result
  end
  local rehearsed
  if self.dry_run == "rehearse" then
    -- answered from the overlay, or sent (maybe rewritten: a write to an
    -- object the overlay holds is applied here and its result validated)
    local qs0 = encode_query(query)
    rehearsed = rehearsal.prepare(self, method, path, query, body, ctype, spec, write,
      qs0 ~= "" and (path .. "?" .. qs0) or path)
    if rehearsed ~= nil and rehearsed.local_only then
      local result = rehearsal.apply_locally(self, rehearsed, rehearsed.local_only)
      if bound then self.binding:answered(bound, result) end
      return nil, result
    end
    if rehearsed ~= nil and rehearsed.method == nil then return nil, rehearsed.answer end
    if rehearsed ~= nil then
      method, path, body = rehearsed.method, rehearsed.path, rehearsed.body
      ctype = body ~= nil and (rehearsed.ctype or JSON) or nil
    end
    if write then query, body = dry_run_request(method, query, body) end
  end
  if write and self.dry_run == "server" then
    query, body = dry_run_request(method, query, body)
    -- sent for the server to judge, and shown on its way out, as a client
    -- dry run shows the writes it keeps back
    record_write(self, method, path, query, ctype, body)
  end
  local qs = encode_query(query)
  local shown = qs ~= "" and (path .. "?" .. qs) or path
  -- a write under a lock: every attempt (first and retried) is checked by
  -- the gate, and its time bounded so that "held until after the attempt"
  -- can be known (docs/transport.md, "The lock and retried writes")
  local before_attempt, timeout = nil, spec.timeout
  if write and self.gate then before_attempt, timeout = self.gate:attempts(timeout) end
  -- a retry budget (the call's own, else the view's) lowers the client's bounds
  local b = spec.retry and budget.new(spec.retry, false, 3) or self.retry_budget
  local max_attempts, max_time, reserved
  if b then max_attempts, max_time, reserved = b:take(self.info) end
  return {
    method = method, path = path, shown = shown, write = write, budget = b, reserved = reserved,
    rehearse = rehearsed, bound = bound,
    -- a rehearsed write's answer comes as text, which the overlay keeps as
    -- it came, and is decoded in judge with this projection
    -- (cozy.kube.rehearsal.answer_projection)
    decode_text = rehearsed ~= nil and rehearsed.op ~= "list"
      and rehearsal.answer_projection(rehearsed) or nil,
    options = {
      -- a successful answer comes back decoded by the transport, straight
      -- from its buffer; only these parts of it with a projection (a
      -- rehearsed write's as text: decode_text)
      decode = not spec.first_line and (rehearsed == nil or rehearsed.op == "list")
        and (spec.projection or true) or nil,
      -- a watch (cozy.kube.wait): its stream's first event, as text
      first_line = spec.first_line,
      query = qs,
      body = body ~= nil and json.encode(body) or nil,
      content_type = ctype,
      retry_safe = spec.retry_safe,
      timeout = timeout,
      max_attempts = max_attempts,
      max_time = max_time,
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
-- text with the decoder's message when it is not JSON; a rehearsed write's
-- arrives as text and is decoded here (req.decode_text).
local function judge(self, req, status, body, attempts, warnings, decode_error)
  -- kubectl's -v=6 request trace: here, where every request's result is known
  if self.log then trace.request(self.log, req, body, attempts) end
  -- attempts a watch stopped before they were sent are not requests
  local sent = 0
  for _, a in ipairs(attempts) do
    if a.sent ~= false then sent = sent + 1 end
  end
  if req.budget then req.budget:give_back(req.reserved, sent) end
  local stats = self.stats
  stats.requests = stats.requests + sent
  stats.retries = stats.retries + math.max(0, sent - 1)
  if req.write then stats.writes = stats.writes + 1 end
  if status == 0 then error(errors.from_transport(req.method, req.shown, attempts)) end
  if warnings then
    -- the API server's Warning headers (deprecated APIs, ignored fields): once each per client
    for warning in warnings:gmatch("[^\n]+") do
      if not self._warned[warning] then
        self._warned[warning] = true
        warn(self, "API server warning",
          { warning = warning, method = req.method, path = req.path })
      end
    end
  end
  if status >= 200 and status < 300 then
    if req.decode_text ~= nil and decode_error == nil and type(body) == "string" then
      -- a rehearsed write's answer: decoded here, its text kept for the overlay
      local answer = body
      if answer == "" then body = nil else
        local ok, v = pcall(json.decode, answer, req.decode_text ~= true and req.decode_text or nil)
        if ok then body, req.rehearse.text = v, answer else decode_error = v end
      end
    end
    if decode_error ~= nil then
      error(errors.new { method = req.method, path = req.shown, code = status,
        reason = "InvalidResponse", message = "the server's answer is not JSON: " .. decode_error,
        attempts = attempts })
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

-- A plan's binding (cozy.kube.binding): a write's answer names the write
-- from now on; a live read of a rehearsal being saved is recorded.
local function bound_finish(self, req, status, body, attempts, warnings, decode_error)
  local ok, res, st, at = pcall(judge, self, req, status, body, attempts, warnings, decode_error)
  if not req.write then self.binding:read(req.path, req.options.query, ok, res) end
  if req.rehearse then
    res, st, at = rehearsal.finish(self, req.rehearse, ok, res, st, at)
  elseif not ok then
    error(res, 0)
  end
  if req.bound then self.binding:answered(req.bound, res) end
  return res, st, at
end

function Client:finish(req, status, body, attempts, warnings, decode_error)
  if self.binding then
    return bound_finish(self, req, status, body, attempts, warnings, decode_error)
  end
  if req.rehearse then
    -- a rehearsal's request: what the server answered enters the overlay
    -- (a 403 refused dry run is applied locally), a list page is merged
    return rehearsal.finish(self, req.rehearse,
      pcall(judge, self, req, status, body, attempts, warnings, decode_error))
  end
  return judge(self, req, status, body, attempts, warnings, decode_error)
end

-- One API call: the one path every request of the engine, the runner and a
-- migration takes. Returns the decoded body (nil when empty), the status and
-- the attempts; raises kube.Error for any non-2xx answer or transport failure.
-- spec = { query = {{k,v},...}, body = lua value, content_type =, retry_safe =, timeout =,
--          retry = a retry budget { attempts =, time = } (cozy.kube.budget),
--          first_line = true: a watch, answered at its stream's first line (the
--            body is that text, not decoded; engine code: cozy.kube.wait),
--          simulate = function() -> the result a client dry run returns instead of sending }
-- Whether the request is a write is decided here, from its method.
function Client:call(method, path, spec)
  local req, kept_back = self:prepare(method, path, spec)
  if req == nil then return kept_back, 0, {} end
  return self:finish(req, self._t:request(req.method, req.path, req.options))
end

-- Is `plural` of `api_version` served? Answered from discovery (the group
-- version's resource list), cached for the client's lifetime. A group
-- version the server does not know (404) is "not served"; any other error
-- raises: an unreachable server is never read as an absent API.
function Client:served(api_version, plural)
  validate.args(2, "served(api_version, plural)",
    { { "api_version", api_version, "string" }, { "plural", plural, "string" } })
  local cache = self._discovery
  local resources = cache[api_version]
  if resources == nil then
    local path = api_version:find("/", 1, true) and ("/apis/" .. api_version)
      or ("/api/" .. api_version)
    local ok, list = pcall(self.call, self, "GET", path)
    if ok then
      resources = {}
      for _, r in ipairs(type(list) == "table" and type(list.resources) == "table"
        and list.resources or {}) do
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

-- The resource kubectl would take `name` for ("pvc", "deployments.apps",
-- "helmreleases.helm.toolkit.fluxcd.io"), at the version the server serves
-- (cozy.kube.names): the resource, and what discovery says of it; or nil
-- and why, when the server serves no such resource. Cached as `served` is.
function Client:lookup(name)
  local found, why = names.resolve(self, self._names, name)
  if not found then return nil, why end
  return self:resource(found.api_version, found.plural,
    { namespaced = found.namespaced, kind = found.kind }), found
end

-- The resources API group `group` serves, as `kubectl api-resources
-- --api-group` lists them (cozy.kube.names); nil and why when the group is
-- not served. Cached as `lookup` is.
function Client:api_resources(group)
  return names.group_resources(self, self._names, group)
end

-- Raw access for the runner (e.g. /version): decoded body, raises on failure.
function Client:get_path(path, query)
  return (self:call("GET", path, { query = query }))
end

return client
