-- The step executor: the one place that runs a Lua migration's run or
-- check. `run`, `plan`, `check` and the spec harness all come here, so a spec
-- exercises exactly what production runs.
--
-- For a step it builds the client view whose gate (cozy.kube.gate, the
-- run's gate narrowed) enforces the step's rules at the choke point
-- (Client:prepare, for single requests and batches alike):
--   every mode   the migration's declared `permissions` (kind "denied")
--   run, plan    guard(method, path) before every write: SIGTERM, the lock
--   check        no write at all (kind "readonly"); nothing is sent
-- (plan's "nothing is sent" is the client's dry-run mode, decided there too),
-- then the boundary ctx over that view, and runs the function under a
-- handler that turns whatever it raised into one structured error.
local context = require "cozy.runner.context"
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.errors"
local finally = require "cozy.runner.finally"
local gate = require "cozy.kube.gate"
local files = require "cozy.runner.files"
local json = require "cozy.json"
local parameters = require "cozy.runner.parameters"
local request = require "cozy.kube.request"
local sandbox = require "cozy.sandbox"
local sys = require "cozy.sys"
local text = require "cozy.text"
local tools = require "cozy.runner.tools"

local step = {}

-- A step's time limit, in seconds, when neither the migration (`timeout`)
-- nor --step-timeout says otherwise: long enough for a fleet-wide pass at
-- the client's rate limit, short enough that a hung step ends a Job.
step.DEFAULT_TIMEOUT = 1800

-- The limit for migration m: --step-timeout (override), else its own
-- `timeout`, else the default.
function step.timeout(m, override)
  return override or (m.definition and m.definition.timeout) or step.DEFAULT_TIMEOUT
end

-- What a watch raises when it stops a step. running: the step's
-- { tool = name } while ctx.tool runs one (cozy.runner.tools), whose group
-- is gone by the time this error leaves the call.
function step.stopper(name, limit, running)
  return function(reason, detail, where)
    -- where the migration was, when it was in its own code (not the engine's)
    local at = ""
    if running and running.tool then
      at = (" during tool %s: its process group was stopped"):format(running.tool)
    elseif type(where) == "string" and not where:find("^scripts/cozy/")
      and not where:find("^%[") then
      at = " (at " .. where .. ")"
    end
    if reason == "signal" then
      errors.raise("interrupted", ("%s stopped by signal %d%s"):format(name, detail, at))
    end
    errors.raise("timeout", ("%s ran past its time limit of %ss%s")
      :format(name, tostring(limit), at))
  end
end
local stopper = step.stopper

-- What a migration raised, as a cozy.errors error naming the migration:
--   an engine error (API, denied, interrupted, ...) stays what it is;
--   a string is the migration failing closed on purpose: kind "migration";
--   anything else is a bug: kind "bug", with the traceback to find it.
local function classify(e, name, trace)
  -- a request the watch stopped comes back as an API error
  if errors.is(e, "api") and e.code == 0
    and (e.reason == "Interrupted" or e.reason == "DeadlineExceeded") then
    local last = type(e.attempts) == "table" and e.attempts[#e.attempts] or {}
    local during = ("%s %s"):format(tostring(e.method), tostring(e.path))
    if e.reason == "Interrupted" then
      return errors.new("interrupted", { migration = name, cause = e,
        message = ("%s stopped by signal %s during %s")
          :format(name, tostring(last.signal or "?"), during) })
    end
    return errors.new("timeout", { migration = name, cause = e,
      message = ("%s ran past its time limit during %s"):format(name, during) })
  end
  if errors.is(e) then
    if e.migration == nil then e.migration = name end
    return e
  end
  if type(e) == "string" then
    return errors.new("migration", { message = e, migration = name, traceback = trace })
  end
  local shown = errors.safe_text(e)
  return errors.new("bug", { message = ("%s raised a %s value: %s"):format(name, type(e), shown),
    migration = name, traceback = trace })
end
step.classify = classify

-- Runs migration m's `run` (mode "run" or "plan") or `check` (mode "check"),
-- or its `walk` in any mode.
-- opts:
--   client     the engine's client (its dry-run mode is the run's)
--   log        the engine's logger (tagged with the migration here)
--   namespace  the engine's namespace
--   mode       "run" | "plan" | "check"
--   gate       the run's gate (cozy.kube.gate: its lock), narrowed here
--   guard      function(method, path) raising to stop a write (run, plan)
-- Returns ok, err (a cozy.errors error when not ok) and what the step left:
--   { defined = <the migration has this function>,
--     findings = { {severity=, message=, fields=}... },
--     outcome = { counts = {...}, warnings = {...}, warnings_dropped = n,
--                 leave = <reason, when the step called ctx.leave_version> } }
-- all plain data (the outcome goes into the step's history record).
-- A write a walk would make, as check reports it (a finding): what, on which
-- object, and the change it would send (a JSON patch without the engine's
-- resourceVersion test), cut to a line.
local function would(finding, w)
  local a = request.attributes(w.method, w.path, w.query)
  local what = a.resource and (a.resource .. (a.subresource and ("/" .. a.subresource) or ""))
    or w.path
  local body = w.body
  -- a create names its object in the body, not the path: the finding names it
  -- (a generateName as `prefix*`)
  local name = a.name
  local md = a.verb == "create" and type(body) == "table" and type(body.metadata) == "table"
    and body.metadata
  if name == nil and md then
    name = type(md.name) == "string" and md.name
      or (type(md.generateName) == "string" and (md.generateName .. "*")) or nil
  end
  -- a Namespace is its own namespace in the API's request attributes: named once
  local ns = a.resource ~= "namespaces" and a.namespace or nil
  local target = name and ((ns and (ns .. "/") or "") .. name) or (a.namespace or "")
  if type(body) == "table" and type(body[1]) == "table" and body[1].op == "test"
      and body[1].path == "/metadata/resourceVersion" then
    body = json.array(table.move(body, 2, #body, 1, {}))
  end
  local ok, encoded = pcall(json.encode, body)
  local change = body ~= nil and ok and text.safe_prefix(encoded, 200, "...") or nil
  finding("info", ("would %s %s %s"):format(a.verb or w.method, what, target):gsub("%s+$", ""),
    { verb = a.verb, resource = a.resource, namespace = a.namespace, name = name, change = change })
end

function step.execute(m, opts)
  local mode = opts.mode or "run"
  local def = m.definition
  local fn = mode == "check" and def.check or def.run
  -- a walk is run and check at once: checking, each write it would make is
  -- kept back (a client dry run: nothing is sent) and reported as a finding
  local reporting = def.walk ~= nil and mode == "check"
  if def.walk then fn = def.walk end
  local findings = {}
  local outcome = { counts = {}, warnings = {}, warnings_dropped = 0 }
  local result = { defined = fn ~= nil, findings = findings, outcome = outcome }
  if fn == nil then return true, nil, result end
  -- its inputs, checked before anything of the step runs
  local iok, values, roots = pcall(function()
    local v = parameters.resolve(m)
    return v, files.resolve(m, v)
  end)
  if not iok then return false, classify(values, m.name), result end
  -- A blocking finding in run or plan stops the step before its first
  -- write: every write is refused from then on, naming the findings that
  -- block it, and a step that ends without writing fails the same way.
  -- Findings are only ever appended (ctx.finding), so each is looked at
  -- once: looking at all of them before every write was quadratic (at
  -- 20,000 VMs, 15,000 findings and 10,000 writes; bench/README.md).
  local messages, looked_at = {}, 0
  local function blocked()
    for i = looked_at + 1, #findings do
      local f = findings[i]
      if f.severity == "block" then messages[#messages + 1] = f.message end
    end
    looked_at = #findings
    if #messages > 0 then
      errors.raise("migration", ("%s: blocked by %d finding(s): %s"):format(m.name, #messages,
        table.concat(messages, "; ")))
    end
  end
  local guard = nil
  if mode ~= "check" then
    guard = function(method, path)
      blocked()
      if opts.guard then return opts.guard(method, path) end
    end
  end
  -- the run's gate (its lock), narrowed to this step's rules
  local function step_view(write_guard)
    return opts.client:view((opts.gate or gate.new()):narrow {
      who = "migration " .. m.name,
      permissions = discovery.permissions_for(def, mode),
      read_only = mode == "check" and not reporting and "check() is read-only" or nil,
      guard = write_guard,
    })
  end
  local view = step_view(guard)
  local limit = step.timeout(m, opts.timeout)
  local deadline = sys.monotime() + limit
  local step_log = opts.log:with { migration = m.name }
  -- ctx:tool (cozy.runner.tools): run under the step's deadline, or finally's
  local t = opts.tools or {}
  local running = {}
  -- in a rehearsal the tool's requests are served through tool_view, the
  -- step's: its permissions judge them as they judge the migration's own
  local function tool_caller(tool_deadline, tool_limit, tool_view, stop)
    return tools.caller { m = m, mode = mode, log = step_log, namespace = opts.namespace,
      running = running, stop = stop,
      kubeconfig = t.kubeconfig, context = t.context, lock = t.lock,
      rehearse = t.rehearse and tool_view,
      deadline = function() return tool_deadline, tool_limit end,
      unrehearsed = function(why) result.not_rehearsed = result.not_rehearsed or why end }
  end
  local ctx = context.new {
    view = view, log = step_log, namespace = opts.namespace,
    from = m.number, to = m.number + 1, mode = mode, findings = findings, outcome = outcome,
    params = values, files = roots,
    tool = tool_caller(deadline, limit, view, stopper(m.name, limit, running)),
  }
  if reporting then
    -- the engine's own ctx.finding, taken before the migration runs
    local finding = ctx.finding
    view.dry_run = "client"
    view.record = function(w) would(function(...) return finding(ctx, ...) end, w) end
  end
  -- the step's deadline and SIGTERM/SIGINT stop it wherever it is: in Lua
  -- code, a request, a backoff, a <close> handler run while unwinding
  local ok, err, trace = sandbox.watched({ deadline = deadline,
    on_stop = stopper(m.name, limit, running) },
    function(c)
      fn(c)
      if mode ~= "check" then blocked() end
    end, ctx)
  err = not ok and classify(err, m.name, trace) or nil
  -- the migration's compensation, however the step ended (cozy.runner.finally)
  if def.finally and mode ~= "check" then
    err = finally.run(m, err, { mode = mode, log = step_log, outcome = outcome, guard = opts.guard,
      classify = classify, stopper = function(name, lim) return stopper(name, lim, running) end,
      context = function(write_guard, finally_deadline, finally_limit)
        local finally_view = step_view(write_guard)
        return context.new { view = finally_view, log = step_log:with { phase = "finally" },
          namespace = opts.namespace, from = m.number, to = m.number + 1, mode = mode,
          findings = findings, outcome = outcome, params = values, files = roots,
          tool = tool_caller(finally_deadline, finally_limit, finally_view,
            stopper(m.name .. "'s finally", finally_limit, running)) }
      end })
  end
  if err == nil then return true, nil, result end
  return false, err, result
end

return step
