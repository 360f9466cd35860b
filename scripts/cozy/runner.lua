-- The runner: moves the cluster from the version stamped in ConfigMap
-- cozystack-version to the target, one migration at a time.
--
--   discover + validate (exit 2, before any request)       runner/discovery.lua
--   decide: read the stamp; absent -> bootstrap at the target, run nothing
--                                                          runner/steps.lua
--   take the lock (Lease), decide again, run current..target-1:
--                                                          runner/lease.lua
--     Lua: the step executor                               runner/step.lua
--     legacy: a child process, which stamps by itself      runner/legacy.lua
--     after each: stamp N+1 with its history record in one guarded write
--                                                          runner/stamp.lua
--     a step that fails: its failure record (best effort, under the lock)
--   release the lock; a summary line
--
-- Fail closed: the first error stops the run; nothing is stamped past it.
-- Plan mode (`plan`, `run --dry-run`) rehearses the same steps over an
-- overlay of the live cluster (cozy.kube.rehearsal): every write sent with
-- dryRun=All for the server to judge, its answer kept in the overlay, so
-- that each step sees what the earlier ones wrote; no lock is taken. A legacy
-- script runs in a network namespace of its own whose only address is the
-- rehearsal's endpoint (runner/legacy.lua, cozy.kube.overlay_endpoint); in a
-- run bound to a plan (`run --plan`) it runs the same way, its endpoint
-- forwarding to the cluster, each write held to the plan's. What a run
-- shows on stdout is the command's business: the runner hands each event
-- to `report` (cmd/plan.lua prints them).
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.errors"
local log_module = require "cozy.log"
local proc = require "cozy.proc"
local sys = require "cozy.sys"

-- What only the steps of a run or a plan need is required on first use, so
-- that `list`, which only discovers, starts without loading it (a tenth of
-- its instructions). Each field is read from the module at every use (no
-- copy), so a spec that replaces a module's function still reaches it.
local function lazy(name)
  return setmetatable({}, { __index = function(_, k) return require(name)[k] end })
end
local context = lazy "cozy.runner.context"
local events = lazy "cozy.runner.events"
local gate = lazy "cozy.kube.gate"
local lease = lazy "cozy.runner.lease"
local legacy = lazy "cozy.runner.legacy"
local parameters = lazy "cozy.runner.parameters"
local binding = lazy "cozy.kube.binding"
local planfile = lazy "cozy.runner.planfile"
local rehearsal = lazy "cozy.kube.rehearsal"
local stamp = lazy "cozy.runner.stamp"
local step = lazy "cozy.runner.step"
local steps = lazy "cozy.runner.steps"
local termination = lazy "cozy.runner.termination"

local runner = {}

runner.DEFAULT_LOCK_TIMEOUT = 300

function runner.logger(opts)
  return log_module.new{ format = opts.log_format or "text", verbosity = opts.v or 0 }
end

function runner.namespace(...) return steps.namespace(...) end
function runner.target(...) return steps.target(...) end

-- Runs fn(log) and turns what it raises into one logged event and an exit
-- status (1 failed, 2 usage/config/invalid set, 3 locked). An engine error
-- is one line (its traceback, when it has one, only with -v); anything
-- else is a bug in the engine, logged with its traceback.
-- finished(status, err), when given, is told how it ended (err: nil on success).
-- A traceback is laid out in lines by Lua: one log line for each (each
-- escaped as every log line is), so it stays readable and no line of it can
-- pass for another kind of line.
local function log_traceback(log, level, trace)
  for line in tostring(trace):gmatch("[^\n]+") do log:write(level, line) end
end

function runner.protect(opts, fn, finished)
  local log = runner.logger(opts)
  local trace
  local ok, res = xpcall(fn, function(e)
    if not errors.is(e) then trace = debug.traceback(errors.safe_text(e), 2) end
    return e
  end, log)
  finished = finished or function() end
  if ok then
    finished(res or 0)
    return res or 0
  end
  if errors.is(res) then
    log:error(errors.text(res), errors.fields(res))
    local cause = errors.is(res.cause) and res.cause or res
    if cause.traceback then
      log_traceback(log, errors.is(cause, "bug") and "error" or "debug", cause.traceback)
    end
  else
    log:error("internal error: " .. errors.safe_text(res))
    if trace then log_traceback(log, "error", trace) end
  end
  finished(errors.exit_status_of(res), res)
  return errors.exit_status_of(res)
end

function runner.discover(opts)
  return discovery.discover(discovery.options(opts))
end

-- The list page size; COZY_MIGRATE_PAGE_LIMIT changes it (tests that want
-- many pages from a small fleet, and servers that struggle with large pages).
function runner.page_limit()
  local v = math.tointeger(tonumber(os.getenv("COZY_MIGRATE_PAGE_LIMIT") or ""))
  if v and v >= 1 then return v end
  return nil
end

-- Plain-data connect options (the lease worker connects with the same).
function runner.connect_options(opts)
  return { kubeconfig = opts.kubeconfig, context = opts.context,
    request_timeout = opts.request_timeout or 30, qps = opts.qps, burst = opts.burst,
    concurrency = opts.concurrency, page_limit = runner.page_limit() }
end

function runner.connect(opts, log, extra)
  local o = runner.connect_options(opts)
  for k, v in pairs(extra or {}) do o[k] = v end
  o.log = log
  return require("cozy.kube").connect(o)
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

-- Runs one Lua migration through the step executor, without stamping or
-- locking (the spec harness). opts: kubeconfig or client, namespace, mode
-- ("run" | "plan" | "check"), log, record (plan: each write kept back).
-- Raises what the step raised; returns what step.execute returns as its
-- result ({ findings =, outcome =, defined = }).
function runner.run_migration(m, opts)
  local log = opts.log or log_module.new{ format = "text", verbosity = 0 }
  local mode = opts.mode or "run"
  local client = opts.client
    or require("cozy.kube").connect{ kubeconfig = opts.kubeconfig, log = log,
      dry_run = mode == "plan" and "client" or nil, record = opts.record }
  local ok, err, result = step.execute(m, { client = client, log = log, mode = mode,
    namespace = opts.namespace or "cozy-system", guard = opts.guard,
    tools = { kubeconfig = opts.kubeconfig } })
  if not opts.client then client:close() end
  if not ok then error(err, 0) end
  return result
end

-- The lock for a run: taken (waiting up to the lock timeout), then renewed
-- by a worker thread until released.
local function take_lock(client, opts, namespace, identity, log, event)
  local lock_opts = { namespace = namespace, identity = identity, duration = lease.duration(),
    timeout = opts.lock_timeout or runner.DEFAULT_LOCK_TIMEOUT, log = log, event = event }
  local obj, acquired_at = lease.acquire(client, lock_opts)
  return lease.hold(lock_opts, runner.connect_options(opts), obj, acquired_at)
end
runner.take_lock = take_lock

-- The Kubernetes Events of a command that takes the lock (runner/events.lua):
-- none when `off` (a plan, a dry run); each on a quick connection of its
-- own, so that a slow or refusing server costs seconds at most, and the
-- command's counters (the summary's writes) stay the migration's and the
-- stamp's.
function runner.recorder(opts, log, namespace, identity, off)
  return events.recorder { off = off, namespace = namespace, configmap = stamp.CONFIGMAP,
    identity = identity, log = log, pod = os.getenv("POD_NAME"),
    pod_namespace = os.getenv("POD_NAMESPACE"),
    connect = function()
      return runner.connect(opts, log, { request_timeout = events.REQUEST_TIMEOUT,
        retry = "events" })
    end }
end

-- Best effort and quick: an unreleased lease only expires, while a release
-- retried for minutes would hold a failed run (and its exit). A signal
-- that stopped the run has done its work (the run fails): the flag is
-- cleared so that the release is sent, and a second signal ends it.
local function release_lock(holder, client, opts, namespace, identity, log)
  holder:stop()
  proc.reset_signal()
  local quick_ok, quick = pcall(runner.connect, opts, log,
    { request_timeout = 5, retry = "release" })
  lease.release(quick_ok and quick or client,
    { namespace = namespace, identity = identity, log = log })
end
runner.release_lock = release_lock

-- Raises when a signal came: the migration about to write (its name) is
-- named, as the step's watch names it when it stops the migration's code,
-- so the line says the same whichever of the two sees the signal first.
local function interrupted_check(name)
  local signo = proc.signalled()
  if signo then
    errors.raise("interrupted", ("%s stopped by signal %d before the next write")
      :format(name, signo))
  end
end

-- What a step reported before it failed (ctx.outcome's counts), as
-- "k=v k=v", or nil when it reported nothing.
local function work_done(outcome)
  if not outcome or next(outcome.counts) == nil then return nil end
  local parts = {}
  for k, v in pairs(outcome.counts) do parts[#parts + 1] = ("%s=%s"):format(k, tostring(v)) end
  table.sort(parts)
  return table.concat(parts, " ")
end
runner.work_done = work_done

-- One failed step as the run's one error line: the step, why, what it did
-- before (its outcome so far), the version that stays (`at`: the step's
-- own, or an earlier one a step left unstamped) and where a rerun resumes
-- (`resume`: the migration of that version); the cause's own fields
-- (code, reason, ...) kept. A stop (lost lock, signal, time limit) keeps
-- its kind, which decides the release and the exit status.
local function step_failure(m, err, outcome, at, resume)
  local fields = errors.fields(err) or {}
  local kind = context.stop_error(err) and errors.kind(err) or "failed"
  fields.kind = nil
  fields.migration, fields.cause = m.name, err
  -- for the failure record: the step's own error and what it reported
  fields.step_cause, fields.outcome = err, outcome
  local done = work_done(outcome)
  fields.message = ("migration %s failed: %s;%s version stays at %d: a rerun resumes at %s")
    :format(m.name, errors.text(err), done and (" done before it failed: " .. done .. ";") or "",
      at, resume)
  return errors.new(kind, fields)
end

-- A run: its phases in order, each a method of Run, and the events it
-- hands its observer (cmd/plan.lua's printer, for a plan):
--
--   decide     discover the set, read the stamp: bootstrap, nothing to
--              do, or the steps to migrate
--   lock       take the Lease (not in a plan) and decide again under it
--   each step  run or plan it, then stamp it
--   release    give the lock up (a lost one is only stopped)
--   summarise  the summary event and line; the exit status
--
-- The events: bootstrap, plan, step, write (a plan's kept-back or
-- server-judged write), legacy, failure, summary (see cmd/plan.lua).
local Run = {}
Run.__index = Run

function Run.new(opts, mode, observe, log)
  local self = setmetatable({ opts = opts, log = log, observe = observe or function() end,
    started = sys.monotime(), writes = 0, step = nil, steps_run = 0, failures = 0,
    unstamped_steps = {}, attempt = nil }, Run)
  -- a server dry run persists nothing either: it plans, with the server judging the writes
  self.planning = mode == "plan" or opts.server_dry_run == true
  self.dry_run = opts.server_dry_run and "server" or (self.planning and "rehearse" or nil)
  if self.dry_run == "rehearse" then
    -- a rehearsal holds an overlay that grows to the end while each step's
    -- reads come and go: a generational collector leaves the old objects
    -- alone in most cycles, where the incremental one (cozy.cli) marks them
    -- all in each (at 20,000 VMs a seventh less peak RSS, and no more CPU:
    -- bench/README.md, "A heap of its own")
    collectgarbage("generational")
  end
  -- a rehearsal's tally: steps exact, inexact (why), not rehearsed
  self.rehearsed = { exact = 0, inexact = 0, not_rehearsed = 0 }
  return self
end

function Run:emit(event)
  if self.saving then self:note_for_plan(event) end
  self.observe(event)
end

-- The client, the run's gate (its lock slot, filled once the lock is taken:
-- from then on the engine's writes, the stamp, and the steps' need it,
-- checked before every attempt, retries included) and the resources.
function Run:connect()
  self.client = runner.connect(self.opts, self.log,
    { dry_run = self.dry_run, stand_in = self.namespace,
    record = self.dry_run and function(w)
    self.writes = self.writes + 1
    w.type, w.step = "write", self.step
    self:emit(w)
  end or nil })
  self.lock = {}
  self.client.gate = gate.new { lock = self.lock }
  self.cms = self.client:resource("v1", "configmaps", { kind = "ConfigMap" })
  self.leases = self.client:resource("coordination.k8s.io/v1", "leases", { kind = "Lease" })
  self:bind()
end

function Run:summary(result)
  local s = self.client.stats
  -- the pod's termination message when it succeeds (runner.execute)
  self.line = ("%s: version %s, target %d, %d step(s), %d write(s), %.2fs"):format(result,
    tostring(self.at or (self.decision and self.decision.current) or self.target), self.target,
    self.steps_run, s.writes, sys.monotime() - self.started)
  self.log:info("summary", {
    result = result, steps = self.steps_run, writes = s.writes, requests = s.requests,
    retries = s.retries, conflicts = s.conflicts,
    duration_s = ("%.2f"):format(sys.monotime() - self.started), dry_run = self.dry_run,
    unstamped = #self.unstamped_steps > 0 and #self.unstamped_steps or nil,
  })
end

-- Phase decide. Returns the exit status when the run ends here (a
-- bootstrap, nothing to do), nil when there are steps to migrate.
function Run:decide()
  local log, opts = self.log, self.opts
  self.set = runner.discover(opts)
  self.namespace = steps.namespace(opts)
  self.target = steps.target(opts, self.set)
  self:load_plan()
  self:connect()
  proc.trap()
  self.identity = lease.identity()
  local target, namespace = self.target, self.namespace
  self:recorder()
  local decision = steps.decide(self.set, self.cms, namespace, target, log, self.leases)
  self.decision = decision
  self.events:regard(decision.cm)
  self:verify_plan()
  if decision.action == "bootstrap" then
    log:info("no version ConfigMap: fresh install, stamping the target and running nothing",
      { configmap = stamp.CONFIGMAP, namespace = namespace, version = target })
    self:emit { type = "bootstrap", version = target, namespace = namespace,
      configmap = stamp.CONFIGMAP }
    local _, created = stamp.bootstrap(self.cms, namespace, target)
    if not created then log:info("another runner created the ConfigMap first") end
    self:summary("bootstrapped")
    return 0
  elseif decision.action == "none" then
    if decision.current > target then
      log:warn("cluster is ahead of the target: a version never goes down, nothing to do",
        { current = decision.current, target = target })
    else
      log:info("up to date", { version = decision.current })
    end
    self:emit { type = "plan", current = decision.current, target = target, steps = 0 }
    self:summary("up-to-date")
    return 0
  end
  -- every step's parameters, before the lock and the first step (exit 2)
  parameters.check_steps(decision.steps)
  return nil
end

-- The run's Kubernetes Events: none in a plan or a dry run.
function Run:recorder()
  self.events = runner.recorder(self.opts, self.log, self.namespace, self.identity, self.planning)
end

-- Phase lock (a real run only): taken, then the decision made again under
-- it, since another runner may have moved the version while we waited.
-- Returns whether there is still something to migrate.
function Run:take_lock()
  if self.planning then return true end
  self.lock.holder = take_lock(self.client, self.opts, self.namespace, self.identity, self.log,
    function(reason, note) self.events:emit(reason, "Lock", note) end)
  self.decision = steps.decide(self.set, self.cms, self.namespace, self.target, nil, self.leases)
  self.events:regard(self.decision.cm)
  if self.decision.action ~= "migrate" then
    self.log:info("up to date after taking the lock", { version = self.decision.current })
    return false
  end
  return true
end

-- A Lua step, run or planned; returns what it left for its history record.
-- A plan goes on after a failure: later steps see the cluster as it is, not
-- as this step would have left it, so a failure may be an artefact.
function Run:lua_step(m, step_log)
  local ok, err, result = step.execute(m,
    { client = self.client, log = self.log, namespace = self.namespace,
      mode = self.planning and "plan" or "run", timeout = self.opts.step_timeout,
    gate = self.client.gate, guard = function() interrupted_check(m.name) end,
    tools = { kubeconfig = self.opts.kubeconfig, context = self.opts.context,
      lock = self.lock.holder, rehearse = self.dry_run == "rehearse" and self.client or nil } })
  if result.not_rehearsed and self.planning then
    -- a declared tool run without dry-run marking (or not isolated): not
    -- run, so neither this step nor what follows is rehearsed
    if not ok and context.stop_error(err) then error(err, 0) end
    self.rehearsed.not_rehearsed = self.rehearsed.not_rehearsed + 1
    step_log:warn("step not rehearsed: " .. result.not_rehearsed)
    self:emit { type = "not_rehearsed", number = m.number, name = m.name, kind = m.kind,
      why = result.not_rehearsed .. "; it was not run" }
    self.stopped = ("it follows step %s, which was not rehearsed"):format(m.name)
    return result.outcome
  end
  if not ok then
    if not self.planning then error(self:step_failure(m, err, result.outcome), 0) end
    if context.stop_error(err) then error(err, 0) end
    self.failures = self.failures + 1
    step_log:warn("step could not be planned: " .. errors.text(err), errors.fields(err))
    self:emit { type = "failure", number = m.number, name = m.name, error = errors.text(err),
      rehearsal = self.dry_run == "rehearse" }
    -- the run stops here: a rehearsal of the later steps would rehearse what never runs
    if self.dry_run == "rehearse" then self.stopped = ("step %s would fail"):format(m.name) end
  end
  interrupted_check(m.name)
  return result.outcome
end

-- A legacy script of a rehearsal that failed, or was not run because no
-- network namespace could be had: neither it nor any later step is
-- rehearsed (what the run would do after it is not known). A stop (a
-- signal) ends the rehearsal.
function Run:legacy_unrehearsed(m, err, cm, step_log)
  if context.stop_error(err) then error(err, 0) end
  if type(err) == "table" and err.unisolated then
    self.rehearsed.not_rehearsed = self.rehearsed.not_rehearsed + 1
    step_log:warn("legacy script not rehearsed: " .. err.unisolated)
    self:emit { type = "not_rehearsed", number = m.number, name = m.name, kind = m.kind,
      why = err.unisolated .. "; it was not run" }
    self.stopped = ("it follows legacy script %s, which was not rehearsed"):format(m.file)
    return cm
  end
  self.failures = self.failures + 1
  step_log:warn("step could not be planned: " .. errors.text(err), errors.fields(err))
  self:emit { type = "failure", number = m.number, name = m.name, error = errors.text(err),
    rehearsal = true }
  self.stopped = ("step %s would fail"):format(m.name)
  return cm
end

-- A step that ran to its end but left the version where it was (a legacy
-- script that exited 0 without stamping, a Lua step that called
-- ctx.leave_version): under --strict-stamp the run fails there; by default,
-- as run-migrations.sh does, a WARN line and a history record that says so,
-- and the run goes on to the next step. The version stays at self.at.
function Run:unstamped(m, cm, rec, reason, step_log)
  if self.opts.strict_stamp then
    errors.raise("failed",
      ("migration %s left the version unstamped (%s) and --strict-stamp is set; "
        .. "version stays at %d")
      :format(m.name, reason, self.at), { migration = m.name })
  end
  self.unstamped_steps[#self.unstamped_steps + 1] = m.number
  step_log:warn("step did not stamp: the version stays, the run goes on to the next step",
    { version = self.at, reason = reason })
  return stamp.record(self.cms, cm, self.at, stamp.unstamped(rec, self.at, reason))
end

-- Step m failed with err (outcome: what it reported so far) as the run's
-- error: the version stays at self.at, where a rerun resumes.
function Run:step_failure(m, err, outcome)
  local resume = self.set and self.set.by_number[self.at]
  return step_failure(m, err, outcome, self.at, resume and resume.name or ("version " .. self.at))
end

-- Phase each step: one migration run (or planned) and stamped; returns the
-- version ConfigMap as stamped.
function Run:each_step(m, cm)
  interrupted_check(m.name)
  if self.stopped then
    -- after a legacy script or a failing step: what the run would do is not known
    self.rehearsed.not_rehearsed = self.rehearsed.not_rehearsed + 1
    self:emit { type = "not_rehearsed", number = m.number, name = m.name, kind = m.kind,
      why = self.stopped }
    return cm
  end
  local marks = self.client.rehearsal and #self.client.rehearsal.marks
  local from, to = m.number, m.number + 1
  self.step = from
  local step_log = self.log:with{ migration = m.name }
  local t0, m0 = sys.time(), sys.monotime()
  step_log:info("step started", { from = from, to = to, kind = m.kind })
  self.events:emit("StepStarted", "Migrate",
    ("migration %s started: version %d to %d (%s), runner %s")
    :format(m.name, from, to, m.kind, self.identity))
  self:emit { type = "step", number = m.number, name = m.name, kind = m.kind, from = from, to = to,
    description = m.description }
  local function record(outcome)
    return stamp.history_record(m, from, to, t0, self.identity, outcome)
  end
  local stamped, outcome = true, nil
  -- the attempt, for its failure record should it fail before its stamp
  self.attempt = { m = m, from = from, at = self.at, started = t0 }
  local bound = self.client.binding
  if bound then bound:begin_step(m.number) end
  if m.kind == "lua" then
    outcome = self:lua_step(m, step_log)
    if self.stopped then
      if bound then bound:end_step() end
      return cm
    end
    self:bound_step_end(m, outcome)
    if outcome.leave then
      stamped = false
      cm = self:unstamped(m, cm, record(outcome), outcome.leave, step_log)
    else
      cm = stamp.advance(self.cms, cm, self.at, to, record(outcome))
    end
  elseif self.planning and self.dry_run ~= "rehearse" then
    self:emit { type = "legacy", number = m.number, name = m.name, file = m.file }
    cm = stamp.advance(self.cms, cm, self.at, to, record())
  else
    -- in a rehearsal: run in a network namespace of its own, served from the overlay;
    -- in a run bound to a plan: the same, forwarded, each write held to the plan's
    local rehearse = self.dry_run == "rehearse" and self.client or nil
    local forward = bound and not self.planning and self.client or nil
    if rehearse then
      self:emit { type = "legacy", number = m.number, name = m.name, file = m.file,
        rehearsal = true }
    end
    local ok, after, legacy_stamped, writes = pcall(legacy.step, m, self.cms,
      { namespace = self.namespace, from = from, target = self.target, at = self.at,
        strict = self.opts.strict_stamp,
      kubeconfig = self.opts.kubeconfig, context = self.opts.context, log = step_log,
      timeout = self.opts.step_timeout, lock = self.lock.holder, rehearse = rehearse,
      forward = forward })
    if not ok and rehearse then return self:legacy_unrehearsed(m, after, cm, step_log) end
    if not ok then error(self:step_failure(m, after), 0) end
    stamped = legacy_stamped
    self:bound_step_end(m)
    -- its history record: even when a signal came meanwhile, the stamp is done.
    -- In a bound run it counts the script's writes, which the engine sent for it
    local rec = record()
    if forward then rec.writes = writes end
    if stamped then
      cm = stamp.record(self.cms, after, to, rec)
    else
      cm = self:unstamped(m, after, rec, ("%s exited 0 without stamping %d")
        :format(m.file, to), step_log)
    end
  end
  if stamped then self.at = to end
  if bound then bound:end_step() end
  if marks then
    -- what this step's reads and writes (its stamp's included) marked inexact
    local all, why = self.client.rehearsal.marks, {}
    for i = marks + 1, #all do why[#why + 1] = all[i] end
    local key = #why == 0 and "exact" or "inexact"
    self.rehearsed[key] = self.rehearsed[key] + 1
    self:emit { type = "rehearsed", number = m.number, name = m.name, exact = #why == 0,
      why = #why > 0 and why or nil }
  end
  self.attempt = nil
  self.steps_run = self.steps_run + 1
  local seconds = ("%.2f"):format(sys.monotime() - m0)
  step_log:info(self.planning and (stamped and "step planned" or "step planned, version left")
    or (stamped and "step done, stamped" or "step done, not stamped"),
    { version = self.at, seconds = seconds })
  self.events:regard(cm)
  self.events:emit("StepSucceeded", "Migrate", ("migration %s done in %ss: %s%s")
    :format(m.name, seconds,
      stamped and ("version stamped " .. to) or ("version left at " .. self.at .. ", not stamped"),
    runner.outcome_text(outcome)))
  return cm
end

-- A step's outcome (ctx.outcome: its counts and warnings) as text for
-- its Event: "; counts: k=v k=v; 2 warning(s)", or "" when it reported none.
function runner.outcome_text(outcome)
  if type(outcome) ~= "table" then return "" end
  local parts = {}
  for k, v in pairs(type(outcome.counts) == "table" and outcome.counts or {}) do
    parts[#parts + 1] = ("%s=%s"):format(k, tostring(v))
  end
  table.sort(parts)
  local out = #parts > 0 and ("; counts: " .. table.concat(parts, " ")) or ""
  local warnings = type(outcome.warnings) == "table" and #outcome.warnings or 0
  if warnings > 0 then out = out .. ("; %d warning(s)"):format(warnings) end
  return out
end

-- Phases lock and each step, which the release must follow whatever they raise.
function Run:migrate()
  if not self:take_lock() then return end
  if not self.planning then self:verify_plan() end
  local decision = self.decision
  self:emit { type = "plan", current = decision.current, target = self.target,
    steps = #decision.steps, server_dry_run = self.opts.server_dry_run or false }
  self.log:info("migrating", { from = decision.current, to = self.target, steps = #decision.steps,
    runner = self.identity, dry_run = self.dry_run })
  local cm = decision.cm
  self.at = decision.current
  for _, m in ipairs(decision.steps) do cm = self:each_step(m, cm) end
  self:left_behind()
  -- a rehearsal's objects, whose live befores are read meanwhile: a stop
  -- (a signal) stops those reads as it stops the steps'
  if self.client.rehearsal then self:emit_objects(self.client.rehearsal) end
end

-- After the last step: the steps that did not stamp, and what the next
-- upgrade makes of them. It starts from the stamped version, as the
-- platform's hook does: a step at or above it runs again; one that a later
-- step stamped past does not (run-migrations.sh's rule too), and only its
-- history record tells of it.
function Run:left_behind()
  if #self.unstamped_steps == 0 then return end
  local retried, passed = {}, {}
  for _, n in ipairs(self.unstamped_steps) do
    if n >= self.at then retried[#retried + 1] = n else passed[#passed + 1] = n end
  end
  self.log:warn(("%d step(s) did not stamp: version is %d, target %d")
    :format(#self.unstamped_steps, self.at, self.target),
    { retried_next_upgrade = #retried > 0 and table.concat(retried, ",") or nil,
      stamped_past = #passed > 0 and table.concat(passed, ",") or nil })
end

-- Phase release: the lock given up, unless it was lost (a release would
-- only be refused).
function Run:release(err)
  local h = self.lock.holder
  if h == nil then return end
  self.lock.holder = nil
  if errors.is(err, "lost") then
    h:stop()
  else
    release_lock(h, self.client, self.opts, self.namespace, self.identity, self.log)
  end
end

-- a signal ends the runner's own requests and waits too (the stamp, the
-- lock; core/watch.c): whatever failed then, the run was interrupted
-- (a lost lock stays what it is: the release must not be tried)
local function stopped_by_signal(err)
  local signo = proc.signalled()
  if not signo or errors.is(err, "interrupted", "lost") then return err end
  return errors.new("interrupted", { cause = err,
    message = ("run stopped by signal %d (%s)"):format(signo, errors.text(err)) })
end

-- A rehearsal's objects, each created, changed or deleted one with its
-- before, after and diff: one `object` event each, before the summary.
-- The befores still to be read are read as they are needed
-- (cozy.kube.rehearsal.befores).
function Run:emit_objects(r)
  require("cozy.kube.changes").each(r.overlay, function(o) self:emit(o) end,
    function(due) return rehearsal.befores(self.client, due) end)
end

-- Phase summarise: the summary event and line; the exit status, or what
-- failed the run raised.
function Run:summarise(ok, err)
  if not ok then
    self:summary("failed")
    error(err, 0)
  end
  local summary = { type = "summary", steps = self.steps_run, writes = self.writes,
    failures = self.failures }
  local r = self.client and self.client.rehearsal
  if r then
    local c = r.overlay:changes()
    summary.rehearsal = { steps_exact = self.rehearsed.exact,
      steps_inexact = self.rehearsed.inexact, steps_not_rehearsed = self.rehearsed.not_rehearsed,
      writes_admitted = r.stats.admitted, writes_refused = r.stats.refused,
      writes_not_validated = r.stats.not_validated, created = #c.created, changed = #c.changed,
      deleted = #c.deleted }
  end
  self:emit(summary)
  self:save_plan()
  if self.planning and self.failures > 0 then
    self:summary("plan-failed")
    return 1
  end
  self:summary(self.planning and "planned" or "done")
  return 0
end

-- The failed attempt's history record (a real run, a step under way):
-- written under the lock before its release, best effort and quick. Not
-- writing it is a WARN that never replaces the step's error: a lost lock
-- forbids the write, a version someone else moved is theirs to record, an
-- unreachable server is the failure itself. A signal that stopped the run
-- has done its work: its flag is cleared so the record is sent (as for the
-- release), and a second signal ends the write.
function Run:record_failure(err)
  local a = self.attempt
  if self.planning or a == nil or self.lock.holder == nil then return end
  -- the step's own error, also under the signal's wrapping (stopped_by_signal)
  local failure = err
  if errors.is(failure) and failure.step_cause == nil and errors.is(failure.cause) then
    failure = failure.cause
  end
  local cause = errors.is(failure) and failure.step_cause or err
  local outcome = errors.is(failure) and failure.outcome or nil
  if errors.is(err, "lost") then
    self.log:warn("the failed attempt is not recorded in the history: the lock was lost",
      { migration = a.m.name })
    return
  end
  proc.reset_signal()
  local quick
  local ok, werr = pcall(function()
    -- the "record" retry policy: quick, a Retry-After cut to 1 s, so that
    -- the record cannot hold a stopping Job
    quick = runner.connect(self.opts, self.log, { request_timeout = 5, retry = "record" })
    quick.gate = self.client.gate
    local cms = quick:resource("v1", "configmaps", { kind = "ConfigMap" })
    local rec = stamp.failure_record(a.m, a.from, a.started, self.identity, outcome, cause)
    local cm = stamp.read(cms, self.namespace)
    if cm == nil then errors.raise("failed", "the version ConfigMap is gone") end
    stamp.record_failure(cms, cm, a.at, rec)
  end)
  if quick then quick:close() end
  if ok then
    self.log:info("failed attempt recorded in the history",
      { migration = a.m.name, configmap = stamp.CONFIGMAP })
  else
    self.log:warn("the failed attempt could not be recorded in the history: " .. errors.text(werr),
      { migration = a.m.name })
  end
end

function Run:execute()
  local done = self:decide()
  if done then
    self:save_plan()
    return done
  end
  local ok, err = pcall(self.migrate, self)
  if not ok then
    err = stopped_by_signal(err)
    self:record_failure(err)
  end
  self:release(err)
  -- after the release, which clears a signal's flag: the Event is sent
  if not ok and self.attempt then
    self.events:emit("StepFailed", "Migrate", errors.text(err))
  end
  self.events:close()
  return self:summarise(ok, err)
end

-- A saved plan (docs/operations.md, "A saved plan"; cozy.kube.binding,
-- cozy.runner.planfile). `plan --save FILE` records the rehearsal; `run
-- --plan FILE` starts only on the cluster the plan read and stops before a
-- write the plan does not hold.

-- Before any request: the plan file read and checked (exit 2 otherwise).
function Run:load_plan()
  local opts = self.opts
  self.saving = opts.save ~= nil
  if self.saving and self.dry_run ~= "rehearse" then
    errors.raise("usage", "--save records a rehearsal: not with --server-dry-run")
  end
  if opts.plan == nil then return end
  if self.planning then
    errors.raise("usage", "--plan binds a run: not with --dry-run or --server-dry-run")
  end
  self.bound_plan = planfile.load(opts.plan, { namespace = self.namespace, target = self.target,
    set = self.set })
  self.not_rehearsed = nil
end

function Run:bind()
  local path = ("/api/v1/namespaces/%s/configmaps/%s"):format(self.namespace, stamp.CONFIGMAP)
  if self.saving then
    self.client.binding = binding.new("record", path)
    self.not_rehearsed = {}
  elseif self.bound_plan then
    self.client.binding = binding.new("check", path, self.bound_plan.by_step)
  end
end

-- What the plan must refuse to bind: the steps not rehearsed, or failing.
-- (A rehearsed legacy step is recorded as a step: its script's reads and
-- writes went through the engine's endpoint, and a bound run holds the
-- script to them the same way.)
function Run:note_for_plan(e)
  if e.type == "not_rehearsed" or e.type == "failure" then
    local why = e.why or ("it would fail: " .. tostring(e.error))
    self.not_rehearsed[#self.not_rehearsed + 1] = { number = e.number, name = e.name, why = why }
  end
end

-- The run starts only on the cluster the plan read: the stamp, then every
-- object and list (before the lock, and again under it). Exit 1 otherwise.
function Run:verify_plan()
  local p = self.bound_plan
  if p == nil then return end
  local d = self.decision
  local rv = d.cm and d.cm.metadata and d.cm.metadata.resourceVersion or nil
  local planned_rv = type(p.stamp) == "table" and p.stamp.resourceVersion or nil
  if rv ~= planned_rv or (d.current ~= nil and d.current ~= p.current) then
    errors.raise("failed",
      ("the plan does not bind this cluster: the version ConfigMap %s/%s changed since it was "
      .. "planned (version %s, resourceVersion %s; planned version %s, resourceVersion %s); "
      .. "nothing was written: "
      .. "plan again"):format(self.namespace, stamp.CONFIGMAP, tostring(d.current), tostring(rv),
      tostring(p.current), tostring(planned_rv)))
  end
  local changed = binding.changed(self.client, p.reads, p.lists)
  if changed then
    errors.raise("failed",
      ("the plan does not bind this cluster: %s; nothing was written: plan again")
      :format(changed))
  end
end

-- A checked step's end, before its stamp: every write the plan holds for
-- it was made, else the step fails there.
function Run:bound_step_end(m, outcome)
  local bound = self.client.binding
  if bound == nil or self.planning then return end
  local ok, err = pcall(bound.check_complete, bound, m.number)
  if not ok then error(self:step_failure(m, err, outcome), 0) end
end

-- The rehearsal recorded, as `plan --save FILE` writes it.
function Run:save_plan()
  if not self.saving or self.client == nil then return end
  local b, d = self.client.binding, self.decision
  local reads, lists = b:recorded()
  local json = require "cozy.json"
  local steps_out = json.array {}
  for _, n in ipairs(b.order) do
    local m = self.set.by_number[n]
    local writes = json.array {}
    for _, w in ipairs(b.steps[n].writes) do writes[#writes + 1] = json.object(w) end
    steps_out[#steps_out + 1] = json.object { number = n, name = m and m.name, writes = writes }
  end
  local nr = json.array {}
  for _, s in ipairs(self.not_rehearsed) do nr[#nr + 1] = json.object(s) end
  local rv = d and d.cm and d.cm.metadata and d.cm.metadata.resourceVersion
  planfile.save(self.opts.save,
    { namespace = self.namespace, current = d and d.current or json.null, target = self.target,
      stamp = rv and json.object { resourceVersion = rv } or json.null,
    migrations = planfile.migrations(d and d.steps or {}), steps = steps_out, not_rehearsed = nr,
    reads = json.array(reads), lists = json.array(lists) })
  self.log:info("plan saved", { file = self.opts.save, steps = #steps_out })
end

-- `run` (mode "run") and `plan` / `run --dry-run` (mode "plan"). observe(event)
-- receives the run's events (cmd/plan.lua prints them); nil for a real run.
-- At its end, a one-line summary for the pod's termination message
-- (runner/termination.lua): the summary, or the error line that failed it.
function runner.execute(opts, mode, observe)
  local run
  return runner.protect(opts, function(log)
    run = Run.new(opts, mode, observe, log)
    return run:execute()
  end, function(status, err) termination.finish(status, err, run and run.line) end)
end

return runner
