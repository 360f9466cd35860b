-- The runner: moves the cluster from the version stamped in ConfigMap
-- cozystack-version to the target, one migration at a time (design.md).
--
--   discover + validate (exit 2, before any request)
--   read the stamp; absent -> bootstrap at the target, run nothing
--   take the lock (Lease), re-read the stamp, run current..target-1:
--     Lua: run(ctx); legacy: child process, which stamps by itself
--     after each: stamp N+1 with its history record in one guarded write
--   release the lock; a summary line
--
-- Fail closed: the first error stops the run; nothing is stamped past it.
-- Plan mode (`plan`, `run --dry-run`) does the same with a client that
-- records writes instead of sending them, and takes no lock.
local context = require "cozy.runner.context"
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.runner.errors"
local json = require "cozy.json"
local lease = require "cozy.runner.lease"
local legacy = require "cozy.runner.legacy"
local log_module = require "cozy.log"
local proc = require "cozy.proc"
local stamp = require "cozy.runner.stamp"
local sys = require "cozy.sys"

local runner = {}

runner.DEFAULT_LOCK_TIMEOUT = 300

function runner.logger(opts)
  return log_module.new{ format = opts.log_format or "text", verbosity = opts.v or 0 }
end

local function kube()
  return require "cozy.kube"
end

-- The exit status for an error that ended a command.
function runner.exit_status(e)
  if getmetatable(e) == errors.RunnerError then return errors.exit_status[e.kind] or 1 end
  local ok, k = pcall(kube)
  if ok and k.ConfigError and getmetatable(e) == k.ConfigError then return 2 end
  return 1
end

local function error_fields(e)
  if type(e) ~= "table" then return nil end
  local f = {}
  for _, k in ipairs({ "code", "reason", "method", "path", "file", "field", "holder", "migration" }) do
    if e[k] ~= nil and type(e[k]) ~= "table" then f[k] = e[k] end
  end
  return next(f) and f or nil
end

local function error_text(e)
  if type(e) == "string" then return e end
  local mt = getmetatable(e)
  if mt and mt.__tostring then return tostring(e) end
  if type(e) == "table" and e.message then return tostring(e.message) end
  return tostring(e)
end
runner.error_text = error_text

-- Runs fn(log) and turns what it raises into a logged error and an exit
-- status (design.md: 1 failed, 2 usage/config/invalid set, 3 locked).
function runner.protect(opts, fn)
  local log = runner.logger(opts)
  local trace
  local ok, res = xpcall(fn, function(e)
    if type(e) == "string" then trace = debug.traceback(e, 2) end
    return e
  end, log)
  if ok then return res or 0 end
  local status = runner.exit_status(res)
  log:error(error_text(res), error_fields(res))
  if trace and (opts.v or 0) > 0 then log:debug(trace) end
  return status
end

function runner.discover(opts)
  return discovery.discover(discovery.options(opts))
end

function runner.namespace(opts)
  local ns = opts.namespace or os.getenv("NAMESPACE")
  if ns == nil or ns == "" then ns = require("cozy.runner.incluster").namespace(opts) or "cozy-system" end
  return ns
end

local function env_integer(name)
  local v = os.getenv(name)
  if v == nil or v == "" then return nil end
  local n = math.tointeger(tonumber(v))
  if n == nil or n < 0 then
    errors.raise("usage", ("$%s must be a non-negative integer, got %q"):format(name, v))
  end
  return n
end

-- --target, else $TARGET_VERSION, else highest migration number + 1.
function runner.target(opts, set)
  local t = opts.target or env_integer("TARGET_VERSION") or discovery.default_target(set)
  if t == nil then
    errors.raise("usage", "no target version: no migrations known and neither --target nor $TARGET_VERSION given")
  end
  return t
end

-- Plain-data connect options (the lease worker connects with the same).
function runner.connect_options(opts)
  return { kubeconfig = opts.kubeconfig, context = opts.context, request_timeout = opts.request_timeout or 30,
    qps = opts.qps, burst = opts.burst }
end

function runner.connect(opts, log, extra)
  local o = runner.connect_options(opts)
  for k, v in pairs(extra or {}) do o[k] = v end
  o.log = log
  return kube().connect(o), runner.connect_options(opts)
end

-- Loads one migration file (for specs and tools): the discovery entry.
function runner.load_file(path)
  local dir, filename = path:match("^(.*)/([^/]+)$")
  dir, filename = dir or ".", filename or path
  local set = discovery.discover({ migrations = dir, builtin = false })
  for _, m in ipairs(set.migrations) do
    if m.filename == filename then return m end
  end
  errors.raise("invalid", path .. ": not a migration file name (NN-name.lua, NN or NN-name)")
end

-- Runs one Lua migration against a cluster without stamping or locking
-- (for migration specs). opts: kubeconfig, namespace, mode ("run"|"check"),
-- log (optional), client (optional). Returns ctx (ctx.findings for check).
function runner.run_migration(m, opts)
  local log = opts.log or log_module.new{ format = "text", verbosity = 0 }
  local client = opts.client or kube().connect{ kubeconfig = opts.kubeconfig, log = log }
  local ctx = context.new{
    client = client, log = log:with{ migration = m.name }, namespace = opts.namespace or "cozy-system",
    from = m.number, to = m.number + 1, mode = opts.mode or "run",
  }
  local fn = (opts.mode == "check") and m.definition.check or m.definition.run
  if fn then fn(ctx) end
  return ctx
end

local function history_record(m, from, to, started, identity)
  return {
    number = m.number, name = m.name, kind = m.kind, sha256 = m.sha256,
    from = from, to = to,
    started = log_module.iso8601(started), finished = log_module.iso8601(sys.time()),
    engine = sys.version, runner = identity,
  }
end

-- Writes printed by plan / run --dry-run: text or JSON lines on stdout.
local function write_printer(opts, state)
  local as_json = opts.log_format == "json"
  return function(w)
    state.writes = state.writes + 1
    local body = w.body
    local encoded = body ~= nil and json.encode(body) or nil
    if as_json then
      io.stdout:write(json.encode({ type = "write", step = state.step, method = w.method, path = w.path,
        query = w.query, content_type = w.content_type, body = body }), "\n")
    else
      local q = w.query
      if type(q) == "table" then
        local parts = {}
        for k, v in pairs(q) do parts[#parts + 1] = k .. "=" .. tostring(v) end
        table.sort(parts)
        q = table.concat(parts, "&")
      end
      io.stdout:write(("  %s %s%s%s\n"):format(w.method, w.path, (q and q ~= "") and ("?" .. q) or "",
        w.content_type and ("  (" .. w.content_type .. ")") or ""))
      if encoded then io.stdout:write("    ", encoded, "\n") end
    end
    io.stdout:flush()
  end
end

local function plan_line(opts, obj, text)
  if opts.log_format == "json" then
    io.stdout:write(json.encode(obj), "\n")
  else
    io.stdout:write(text, "\n")
  end
  io.stdout:flush()
end

-- `run` (mode "run") and `plan` / `run --dry-run` (mode "plan").
function runner.execute(opts, mode)
  return runner.protect(opts, function(log)
    local started = sys.monotime()
    local set = runner.discover(opts)
    local namespace = runner.namespace(opts)
    local target = runner.target(opts, set)
    -- a server dry run persists nothing either: it plans, with the server judging the writes
    local planning = mode == "plan" or opts.server_dry_run == true
    local state = { writes = 0, step = nil }
    local dry_run
    if opts.server_dry_run then dry_run = "server" elseif planning then dry_run = "client" end
    local client, connect_options = runner.connect(opts, log, {
      dry_run = dry_run, record = dry_run and write_printer(opts, state) or nil,
    })
    local cms = client:resource("v1", "configmaps")
    proc.trap()
    local identity = lease.identity()
    local holder
    local steps_run = 0
    local plan_failures = 0

    local function summary(result)
      local s = client.stats or {}
      log:info("summary", {
        result = result, steps = steps_run, writes = s.writes, requests = s.requests, retries = s.retries,
        conflicts = s.conflicts, duration_s = ("%.2f"):format(sys.monotime() - started),
        dry_run = dry_run,
      })
    end

    local function guard()
      if proc.signalled() then
        errors.raise("interrupted", ("stopped by signal %d before the next write"):format(proc.signalled()))
      end
      if holder then holder:check() end
    end

    local cm = stamp.read(cms, namespace)
    if cm == nil then
      log:info("no version ConfigMap: fresh install, stamping the target and running nothing",
        { configmap = stamp.CONFIGMAP, namespace = namespace, version = target })
      if planning then plan_line(opts, { type = "bootstrap", version = target },
        ("plan: no %s/%s: would create it at version %d"):format(namespace, stamp.CONFIGMAP, target)) end
      local _, created = stamp.bootstrap(cms, namespace, target)
      if not created then log:info("another runner created the ConfigMap first") end
      summary("bootstrapped")
      return 0
    end
    local current = stamp.version_of(cm)
    -- only cross-checked: a malformed value is worth a warning, not a refusal
    local cv_ok, hook_current = pcall(env_integer, "CURRENT_VERSION")
    if not cv_ok then
      log:warn("ignoring $CURRENT_VERSION: " .. error_text(hook_current))
    elseif hook_current and hook_current ~= current then
      log:warn("$CURRENT_VERSION differs from the stamped version; the ConfigMap wins",
        { env = hook_current, stamped = current })
    end
    if current >= target then
      if current > target then
        log:warn("cluster is ahead of the target: a version never goes down, nothing to do",
          { current = current, target = target })
      else
        log:info("up to date", { version = current })
      end
      if planning then plan_line(opts, { type = "plan", current = current, target = target, steps = 0 },
        ("plan: version %d, target %d: nothing to do"):format(current, target)) end
      summary("up-to-date")
      return 0
    end
    local steps = discovery.pending(set, current, target)

    local run_ok, run_err = pcall(function()
      if not planning and not opts.server_dry_run then
        local lock_opts = { namespace = namespace, identity = identity, duration = lease.duration(),
          timeout = opts.lock_timeout or runner.DEFAULT_LOCK_TIMEOUT, log = log }
        lease.acquire(client, lock_opts)
        holder = lease.hold(lock_opts, connect_options)
        -- another runner may have moved the version while we waited
        cm = assert(stamp.read(cms, namespace), "version ConfigMap disappeared")
        current = stamp.version_of(cm)
        if current >= target then
          log:info("up to date after taking the lock", { version = current })
          return
        end
        steps = discovery.pending(set, current, target)
      end
      if planning then
        plan_line(opts, { type = "plan", current = current, target = target, steps = #steps,
          server_dry_run = opts.server_dry_run or false },
          ("plan: version %d -> %d, %d step(s)%s"):format(current, target, #steps,
            opts.server_dry_run and ", writes sent with dryRun=All" or ", nothing written"))
      end
      log:info("migrating", { from = current, to = target, steps = #steps, runner = identity,
        dry_run = dry_run })
      for _, m in ipairs(steps) do
        guard()
        local from, to = m.number, m.number + 1
        state.step = from
        local step_log = log:with{ migration = m.name }
        local t0 = sys.time()
        local m0 = sys.monotime()
        step_log:info("step started", { from = from, to = to, kind = m.kind })
        if planning then
          plan_line(opts, { type = "step", number = m.number, name = m.name, kind = m.kind, from = from, to = to,
            description = m.description },
            ("step %d -> %d: %s (%s) %s"):format(from, to, m.name, m.kind, m.description))
        end
        if m.kind == "lua" then
          local ctx = context.new{ client = client, log = step_log, namespace = namespace, from = from, to = to,
            mode = planning and "plan" or "run", guard = guard }
          local ok, err = xpcall(m.definition.run, function(e)
            if type(e) == "string" then return debug.traceback(e, 2) end
            return e
          end, ctx)
          if not ok and planning and not context.stop_error(err) then
            -- a plan goes on: later steps see the cluster as it is, not as
            -- this step would have left it, so a failure may be an artefact
            plan_failures = plan_failures + 1
            step_log:warn("step could not be planned: " .. error_text(err), error_fields(err))
            plan_line(opts, { type = "failure", number = m.number, name = m.name, error = error_text(err) },
              ("  step %d would fail against the current cluster: %s"):format(m.number, error_text(err)))
          elseif not ok then
            if context.stop_error(err) then error(err, 0) end
            step_log:error("step failed: " .. error_text(err), error_fields(err))
            errors.raise("failed", ("migration %s failed; version stays at %d"):format(m.name, from),
              { migration = m.name })
          end
          guard()
          cm = stamp.advance(cms, cm, from, to, history_record(m, from, to, t0, identity))
        elseif planning then
          plan_line(opts, { type = "legacy", number = m.number, name = m.name },
            ("  legacy script %s would run here; its writes cannot be shown"):format(m.file))
          cm = stamp.advance(cms, cm, from, to, history_record(m, from, to, t0, identity))
        else
          legacy.run(m, { namespace = namespace, from = from, target = target, kubeconfig = opts.kubeconfig
            or os.getenv("KUBECONFIG"), log = step_log })
          local after = stamp.read(cms, namespace)
          local v = after and stamp.version_of(after)
          if v ~= to then
            errors.raise("failed", ("legacy script %s exited 0 but did not stamp %d (version is %s)")
              :format(m.file, to, tostring(v)), { migration = m.name })
          end
          -- its history record: even when a signal came meanwhile, the stamp is done
          if holder then holder:check() end
          cm = stamp.record(cms, after, to, history_record(m, from, to, t0, identity))
        end
        steps_run = steps_run + 1
        step_log:info(planning and "step planned" or "step done, stamped", { version = to,
          seconds = ("%.2f"):format(sys.monotime() - m0) })
      end
    end)
    if holder then
      holder:stop()
      -- best effort and quick: an unreleased lease only expires, while a
      -- release retried for minutes would hold a failed run (and its exit)
      local quick_ok, quick = pcall(runner.connect, opts, log,
        { request_timeout = 5, retry = { max_attempts = 2, max_time = 5 } })
      lease.release(quick_ok and quick or client, { namespace = namespace, identity = identity, log = log })
    end
    if not run_ok then
      summary("failed")
      error(run_err, 0)
    end
    if planning then
      plan_line(opts, { type = "summary", steps = steps_run, writes = state.writes, failures = plan_failures },
        ("plan: %d step(s), %d write(s)%s"):format(steps_run, state.writes,
          plan_failures > 0 and (", %d step(s) would fail"):format(plan_failures) or ""))
      if plan_failures > 0 then
        summary("plan-failed")
        return 1
      end
    end
    summary(planning and "planned" or "done")
    return 0
  end)
end

return runner
