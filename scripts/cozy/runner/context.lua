-- The `ctx` a migration's run(ctx) and check(ctx) receive (docs/engine-api.md).
--
-- ctx is a boundary: everything in it is a function or plain data. The
-- client, its resources and pagers, the logger and progress bars reach the
-- migration as tables of closures over the engine's objects, never as
-- those objects, so no field or metatable of what a migration holds leads to
-- the transport, an unguarded client, an engine class or a table the engine
-- itself uses (the closures' upvalues are out of reach without `debug`,
-- which the sandbox does not offer). ctx and each of those tables are the
-- sandbox's proxies (sandbox.seal, sandbox.view): pairs, next, rawget and
-- rawset lead no further than indexing does. Every request still goes
-- through the step's client view, whose gate (Client:call) decides what
-- may be sent.
local errors = require "cozy.errors"
local kerrors = require "cozy.kube.errors"
local join = require "cozy.kube.join"
local text = require "cozy.text"
local json = require "cozy.json"
local sandbox = require "cozy.sandbox"
local wait = require "cozy.kube.wait"
local validate = require "cozy.validate"

local context = {}

-- the resource behind each resource facade of ctx.kube, for ctx.kube:wait
local resource_of = setmetatable({}, { __mode = "k" })

-- What a migration holds of the engine is sealed: its metatable is not
-- theirs to read or replace, its fields not theirs to change, and nothing
-- (pairs, next, raw access) reaches the table that holds them (seal, below).

-- One calling convention: everything a migration calls through ctx is a
-- method, called with `:` (ctx:finding(...), ctx.log:info(...),
-- ctx.kube:lookup(...)). A call with `.` is refused with an error naming
-- the right form, never taken for one with `:` (docs/engine-api.md,
-- "Calling convention").
local facade_names = setmetatable({}, { __mode = "k" })

local function method(facade, fn)
  local wrapper
  wrapper = function(first, ...)
    if rawequal(first, facade) then return fn(...) end
    local where, key = facade_names[facade] or "ctx", "method"
    for k, v in pairs(facade) do
      if rawequal(v, wrapper) then key = k end
    end
    if where:find("^[%w_.]+$") then
      error(("%s.%s called with '.': call it with ':' (%s:%s(...))")
        :format(where, key, where, key), 2)
    end
    error(("%s called with '.' on %s: call it with ':' (x:%s(...))"):format(key, where, key), 2)
  end
  return wrapper
end

-- sandbox.seal, naming the facade for the calling-convention error
local function seal(t, name, opts)
  facade_names[t] = name
  return sandbox.seal(t, name, opts)
end

-- A value as plain data: strings, numbers, booleans, json.null and tables of
-- them (copied, depth-bounded); anything else becomes its text. Used for what
-- a migration hands the engine (finding fields), so that the engine never
-- keeps a migration's table, function or metatable.
local function plain(v, depth)
  local t = type(v)
  if t == "string" or t == "number" or t == "boolean" or v == json.null or v == nil then
    return v
  end
  if t ~= "table" or (depth or 0) > 32 then return errors.safe_text(v) end
  local out = {}
  for k, x in next, v do
    local key = type(k) == "number" and k or errors.safe_text(k)
    out[key] = plain(x, (depth or 0) + 1)
  end
  return out
end

-- Finding fields that name an object (`{ vm = vm }`) keep its name, and give
-- the finding the object's namespace unless the fields set one: where a
-- finding points reads the same in every migration.
local function located(fields)
  local out, namespace = {}, nil
  for k, v in next, fields do
    local meta = type(v) == "table" and rawget(v, "metadata")
    if type(meta) == "table" and type(meta.name) == "string" then
      out[k], namespace = meta.name, namespace or meta.namespace
    else
      out[k] = v
    end
  end
  if out.namespace == nil then out.namespace = namespace end
  return out
end

local pager_fields = { pages = true, count = true, restarts = true, skipped = true,
  resource_version = true }

local function pager_facade(p)
  local f = {}
  f.next = method(f, function() return p:next() end)
  f.collect = method(f, function() return p:collect() end)
  return seal(f, "a pager", {
    call = function() return p:next() end,
    index = function(k) if pager_fields[k] then return p[k] end end,
  })
end

local list_options = { "namespace", "label_selector", "field_selector", "limit", "project",
  "retry" }

-- "Kind ns/name" of an object, for log lines.
local function describe(res, obj)
  local md = type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
  local kind = type(obj) == "table" and obj.kind or res.kind or res.plural
  return ("%s %s%s"):format(kind, md.namespace and (md.namespace .. "/") or "", tostring(md.name))
end

local function resource_facade(res, logger, warned, mode)
  local r = { api_version = res.api_version, plural = res.plural, namespaced = res.namespaced,
    kind = res.kind }
  -- wait(ns, name, opts) (namespaced) or wait(name, opts): cozy.kube.wait
  r.wait = method(r, function(...)
    if res.namespaced then
      local ns, name, opts = ...
      return wait.run(res, ns, name, opts, logger, mode)
    end
    local name, opts = ...
    return wait.run(res, nil, name, opts, logger, mode)
  end)
  -- update_each with the step's progress bar, a line per object deleted
  -- since the list, a warning per object that failed (kept in the step's
  -- outcome), and a summary line (opts.summary = false leaves it out)
  r.update_each = method(r, function(items, edit, opts)
    validate.arg(2, "update_each(items, edit, opts)", "opts", opts, "table", true)
    opts = opts or {}
    local label = errors.safe_text(opts.label or res.plural)
    local name_of = opts.describe or function(item) return describe(res, item) end
    -- items read or made one at a time (a list, a function) say how many there will be in
    -- opts.total
    local total = math.tointeger(opts.total) or type(items) == "table" and #items or nil
    local progress = total and total > 0 and logger:progress(label, total) or nil
    local counts, failures = res:update_each(items, edit, {
      absent = opts.absent,
      concurrency = opts.concurrency,
      on_change = opts.on_change,
      on_error = opts.on_error,
      project = opts.project,
      retry = opts.retry,
      on_absent = function(item, value)
        logger:write("info", ("%s: deleted since the list, %s")
          :format(errors.safe_text(name_of(item, value)),
            errors.safe_text(opts.absent_note or "skipped")))
        if opts.on_absent then opts.on_absent(item, value) end
      end,
      on_failure = function(item, value, f)
        warned(("%s: failed, %s %s: %s"):format(errors.safe_text(name_of(item, value)),
          tostring(f.code), errors.safe_text(f.reason), errors.safe_text(f.message)))
        if opts.on_failure then opts.on_failure(item, value, plain(f)) end
      end,
      progress = progress,
    })
    if progress then progress:done() end
    if opts.summary ~= false then
      local failed = counts.failed and (", %d failed"):format(counts.failed) or ""
      logger:write("info", ("%s: %d changed, %d unchanged, %d deleted since the list%s")
        :format(label, counts.changed, counts.unchanged, counts.absent, failed), counts)
    end
    return counts, failures
  end)
  for _, name in ipairs({ "get", "find", "create", "apply", "merge_patch", "json_patch", "delete",
    "update", "change",
      "read_back", "path", "collection_path" }) do
    local fn = res[name]
    r[name] = method(r, function(...) return fn(res, ...) end)
  end
  r.list = method(r, function(opts)
    validate.arg(2, "list(opts)", "opts", opts, "table", true)
    local o = {}
    for _, k in ipairs(list_options) do o[k] = opts and opts[k] end
    local facade
    local on_restart = opts and opts.on_restart
    if on_restart ~= nil then
      validate.arg(2, "list(opts)", "on_restart", on_restart, "function")
      o.on_restart = function() on_restart(facade) end
    end
    facade = pager_facade(res:list(o))
    return facade
  end)
  seal(r, "a resource of ctx.kube")
  resource_of[r] = res
  return r
end

-- What a migration may pass to a raw call: the request and a retry budget
-- (which only lowers the engine's bounds), nothing that changes how the
-- engine treats it (retry safety, a simulated result).
local function call_spec(spec)
  if spec == nil then return nil end
  validate.arg(3, "call(method, path, spec)", "spec", spec, "table")
  return { query = spec.query, body = spec.body, content_type = spec.content_type,
    timeout = spec.timeout, retry = spec.retry }
end

local function kube_facade(view, logger, warned, mode)
  local k = { namespace = view.namespace, server = view.server }
  k.conditions = seal(wait.conditions(), "ctx.kube.conditions")
  -- wait(resource, name, { namespace =, condition | deleted | created, timeout = }):
  -- resource a resource of ctx.kube or a name as kubectl takes it
  k.wait = method(k, function(resource, name, opts)
    local res = resource_of[resource]
    if res == nil and type(resource) == "string" then
      local why
      res, why = view:lookup(resource)
      if res == nil then
        error(("wait: %s is not served (%s)"):format(resource, errors.safe_text(why)), 2)
      end
    end
    validate.args(2, "wait(resource, name, opts)",
      { { "resource", res, function(r) return r ~= nil end,
        { says = "a resource of ctx.kube or its name" } }, { "opts", opts, "table", true } })
    return wait.run(res, opts and opts.namespace, name, opts, logger, mode)
  end)
  -- the client's live counters, seen through a view: the table the client
  -- counts in stays the client's
  k.stats = sandbox.view(view.stats, "ctx.kube.stats")
  k.resource = method(k, function(api_version, plural, opts)
    validate.arg(2, "resource(api_version, plural, opts)", "opts", opts, "table", true)
    return resource_facade(view:resource(api_version, plural,
      opts and { namespaced = opts.namespaced, kind = opts.kind }), logger, warned, mode)
  end)
  -- an API error of one request (not a stop): what a best-effort loop of a
  -- migration's own logs and goes on from (kube.errors.is_item_error)
  k.is_item_error = method(k, function(v) return kerrors.is_item_error(v) end)
  k.call = method(k, function(http_method, path, spec)
    validate.args(2, "call(method, path [, spec])",
      { { "method", http_method, "string" }, { "path", path, "string" } })
    return view:call(http_method, path, call_spec(spec))
  end)
  k.get_path = method(k, function(path, query) return view:get_path(path, query) end)
  k.served = method(k, function(api_version, plural) return view:served(api_version, plural) end)
  -- a resource as kubectl names it: the resource and what discovery says of
  -- it (a copy), or nil and why the server serves no such resource
  k.lookup = method(k, function(name)
    local res, about = view:lookup(name)
    if res == nil then return nil, about end
    return resource_facade(res, logger, warned, mode), plain(about)
  end)
  -- the resources of an API group, as `kubectl api-resources --api-group`
  -- lists them (plain copies), or nil and why when the group is not served
  k.api_resources = method(k, function(group)
    local list, why = view:api_resources(group)
    if list == nil then return nil, why end
    return plain(list)
  end)
  -- update_each over every object of a resource named as kubectl names it,
  -- the list's options (namespace, label_selector, ...) and update_each's
  -- together in opts: a port's "for each X, if served" in one call. A
  -- resource the server does not serve is an info line and nil, why.
  k.update_all = method(k, function(name, edit, opts)
    validate.arg(2, "update_all(name, edit, opts)", "opts", opts, "table", true)
    opts = opts or {}
    local found, about = view:lookup(name)
    if found == nil then
      logger:write("info", ("%s not served (%s): nothing to change")
        :format(errors.safe_text(name), errors.safe_text(about)))
      return nil, about
    end
    local res, listing = resource_facade(found, logger, warned, mode), {}
    for _, key in ipairs(list_options) do listing[key] = opts[key] end
    return res:update_each(res:list(listing), edit, opts)
  end)
  return seal(k, "ctx.kube")
end

-- The keyed join and the queue of cozy.kube.join, as closures.
local function queue_facade(q)
  local f = {}
  f.push = method(f, function(o, value) return q:push(o, value) end)
  f.pop = method(f, function() return q:pop() end)
  f.len = method(f, function() return q:len() end)
  f.drain = method(f, function() return function() return q:pop() end end)
  return seal(f, "a queue")
end

local function join_facade(j)
  local f = {}
  f.next = method(f, function() return j:next() end)
  f.unmatched = method(f, function()
    local it = j:unmatched()
    return function() return it() end
  end)
  return seal(f, "a join", { call = function() return j:next() end })
end

local function progress_facade(p)
  local f = {}
  f.step = method(f, function(n) return p:step(n) end)
  f.done = method(f, function() return p:done() end)
  return seal(f, "a progress bar")
end

-- Bounds of what a step's outcome (kept in the history record) may hold.
context.OUTCOME_LIMITS = { counts = 20, warnings = 10, text = 200, key = 63 }

local function bounded_text(v)
  return text.safe_prefix(errors.safe_text(v), context.OUTCOME_LIMITS.text, "...")
end

local function note_warning(outcome, message)
  if outcome == nil then return end
  if #outcome.warnings < context.OUTCOME_LIMITS.warnings then
    outcome.warnings[#outcome.warnings + 1] = bounded_text(message)
  else
    outcome.warnings_dropped = outcome.warnings_dropped + 1
  end
end

-- "{run wording|plan wording}" in a template, for the mode: one log call
-- words a change for both ("{adding|would add}"); check (a walk's) words it
-- as plan does.
local function worded(template, mode)
  return (template:gsub("{([^|{}]*)|([^|{}]*)}",
    function(run, plan) return mode == "run" and run or plan end))
end
context.worded = worded

local function log_facade(logger, outcome, mode)
  local l = {}
  -- a change, worded for the mode: log:change("VM %s: {adding|would add} %s", key, what)
  l.change = method(l, function(template, ...)
    validate.arg(2, "log:change(template, ...)", "template", template, "string")
    return logger:write("info", worded(template, mode):format(...))
  end)
  for _, level in ipairs({ "info", "warn", "error", "debug" }) do
    l[level] = method(l, function(message, fields)
      local line = errors.safe_text(message)
      if level == "warn" or level == "error" then note_warning(outcome, line) end
      return logger:write(level, line, fields and plain(fields) or nil)
    end)
  end
  l.enabled = method(l, function(level) return logger:enabled(level) end)
  l.progress = method(l, function(label, total)
    return progress_facade(logger:progress(errors.safe_text(label), math.tointeger(total) or total))
  end)
  l.with = method(l,
    function(tags) return log_facade(logger:with(plain(tags or {})), outcome, mode) end)
  return seal(l, "ctx.log")
end

-- What the step did, in a few counts (or short strings) for the history
-- record: ctx:outcome{ updated = 3, volumes = 5 }. Later calls add to and
-- overwrite earlier keys; at most OUTCOME_LIMITS.counts keys are kept.
-- A call is checked whole before anything is kept (all or nothing): keys
-- are short texts, values numbers, strings or booleans; a number that is
-- not finite is left out (with a warning), so what a step reports can
-- always be encoded and never stops its stamp. Returns fields, so that the
-- step's summary line can carry what it recorded.
local function outcome_recorder(outcome, logger)
  return function(fields)
    validate.arg(2, "ctx:outcome(fields)", "fields", fields, "table")
    for k, v in next, fields do
      if type(k) ~= "string" or k == "" or #k > context.OUTCOME_LIMITS.key or k:find("%c")
        or not utf8.len(k) then
        error(("ctx:outcome: keys must be texts of 1 to %d bytes without control "
          .. "characters, got %s")
          :format(context.OUTCOME_LIMITS.key,
            bounded_text(type(k) == "string" and ("%q"):format(k) or type(k))), 2)
      end
      validate.arg(2, "ctx:outcome", k, v, { "number", "string", "boolean" }, { show = "got" })
    end
    if outcome == nil then return fields end
    for k, v in next, fields do
      local n = 0
      -- a ratio of nothing (0/0) is data, not a mistake in the code: it is
      -- left out with a warning rather than failing the step
      if type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
        logger:write("warn", ("ctx:outcome: %s is %s, not a finite number: left out of the history")
          :format(k, tostring(v)))
        goto continue
      end
      for _ in next, outcome.counts do n = n + 1 end
      if outcome.counts[k] ~= nil or n < context.OUTCOME_LIMITS.counts then
        outcome.counts[k] = type(v) == "string" and bounded_text(v) or v
      end
      ::continue::
    end
    return fields
  end
end

-- opts: view (the step's client view), log (the engine's logger for the
-- step), namespace, from, to, mode ("run"|"plan"|"check"), findings (the
-- engine's own array that ctx.finding appends plain copies to), params
-- (name -> value) and files (key -> path): the step's resolved inputs.
-- Returns the ctx a migration receives (its LuaCATS class: types/cozy/ctx.lua).
---@return cozy.Ctx
function context.new(opts)
  local logger = opts.log
  local findings = opts.findings or {}
  local seen = {} -- plain copies of the findings, readable (not writable) as ctx.findings
  -- a warning line of the engine's, kept in the outcome as the migration's are
  local function warned(line)
    note_warning(opts.outcome, line)
    logger:write("warn", line)
  end
  local ctx = {
    kube = kube_facade(opts.view, logger, warned, opts.mode or "run"),
    log = log_facade(logger, opts.outcome, opts.mode or "run"),
    namespace = opts.namespace,
    from = opts.from,
    to = opts.to,
    mode = opts.mode or "run",
    findings = sandbox.view(seen, "ctx.findings"),
    -- the migration's declared inputs (cozy.runner.parameters, cozy.runner.files)
    params = sandbox.view(opts.params or {}, "ctx.params"),
    files = require("cozy.runner.files").facade(opts.files or {}, seal, method, logger),
  }
  -- a declared tool, run (cozy.runner.tools); the step executor gives it
  if opts.tool ~= nil then ctx.tool = method(ctx, opts.tool) end
  local outcome = opts.outcome
  ctx.outcome = method(ctx, outcome_recorder(outcome, logger))
  -- "Some items failed: leave the version for the next upgrade", as the
  -- platform's best-effort scripts exit 0 without stamping. The step still
  -- returns normally (`return ctx:leave_version("3 namespaces failed")`);
  -- the runner then does what it does for a legacy script that did not
  -- stamp (docs/operations.md, "Steps that leave the version"). The last
  -- call's reason is the one recorded.
  ctx.leave_version = method(ctx, function(reason)
    validate.arg(2, "ctx:leave_version(reason)", "reason", reason,
      function(v) return type(v) == "string" and v:find("%S") end,
      { says = "a non-empty string saying what is left to do" })
    if outcome ~= nil then outcome.leave = bounded_text(reason) end
  end)
  -- a text worded for the mode: "{updated|would update}" (run | plan)
  ctx.worded = method(ctx, function(template)
    validate.arg(2, "ctx:worded(template)", "template", template, "string")
    return worded(template, ctx.mode)
  end)
  -- join(left, right, { key = fn(right_item) [, left_key = fn(left_item)] }):
  -- for left_item, matches in ctx:join(...) do ... end; then :unmatched()
  ctx.join = method(ctx, function(left, right, join_opts)
    validate.arg(2, "ctx:join(left, right, opts)", "opts", join_opts, "table", true)
    return join_facade(join.new(left, right, join_opts))
  end)
  ctx.queue = method(ctx, function() return queue_facade(join.queue()) end)
  ctx.progress = method(ctx, function(label, total)
    return ctx.log:progress(label, total)
  end)
  ctx.finding = method(ctx, function(severity, message, fields)
    validate.args(2, "ctx:finding", {
      { "severity", severity, { one_of = { "info", "warn", "block" } }, { show = "got" } },
      { "fields", fields, "table", true },
    })
    local f = { severity = severity, message = errors.safe_text(message),
      fields = fields and plain(located(fields)) or nil }
    findings[#findings + 1] = f
    seen[#seen + 1] = plain(f)
    local level = severity == "info" and "info" or (severity == "warn" and "warn" or "error")
    logger:write(level, "finding: " .. f.message, f.fields)
  end)
  -- sealed: the engine reads ctx.finding back (a walk's kept-back writes
  -- in check), so no field of it may be the migration's
  return seal(ctx, "ctx")
end

-- Errors that stop a run wherever they happen (a plan does not go on past them).
function context.stop_error(e)
  return errors.is(e, "lost", "interrupted", "timeout")
end

return context
