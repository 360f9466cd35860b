-- A migration's compensation: `finally = function(ctx) ... end` in its
-- table (docs/engine-api.md, "finally"), as a shell script's EXIT trap: it
-- runs once the step has ended, however it ended (success, failure, its
-- time limit, a stop by SIGTERM/SIGINT), in `run` and in a plan (whose
-- writes are kept back as the step's are), never in `check`; not after a
-- lost lock (no write could be sent).
--
-- Bounded: its own deadline (finally.TIMEOUT seconds, not the step's, which
-- may be spent) and a budget of finally.WRITES writes; a write past the
-- budget is refused, unsent, and fails it. The stop that ended the step has
-- been answered: finally runs with the signal flag cleared, so its writes
-- are sent; a second signal stops it as the first stopped the step (and the
-- flag is set back afterwards: the run still stops). It runs inside the
-- step, so under the lock (renewed by the lease worker meanwhile) and
-- before the run releases it. Its writes are log lines ("finally write")
-- and its end is in the step's history record (`finally`: what the step
-- ended by, how finally ended, its writes). A finally that fails fails a
-- step that succeeded (the version stays: the next run runs the step and
-- its finally again); after a failed step the step's error stays the run's
-- and finally's is a warning of its record. A runner killed (SIGKILL)
-- meanwhile leaves the version unstamped too, so the next run runs both
-- again: finally must be safe to run twice.
local errors = require "cozy.errors"
local proc = require "cozy.proc"
local sandbox = require "cozy.sandbox"
local sys = require "cozy.sys"
local text = require "cozy.text"

local finally = {}

finally.TIMEOUT = 30
finally.WRITES = 20

-- finally's deadline in seconds: COZY_MIGRATE_FINALLY_SECONDS (1..300)
-- moves it (tests; a compensation known to need longer), else the default.
function finally.timeout()
  local v = math.tointeger(tonumber(os.getenv("COZY_MIGRATE_FINALLY_SECONDS") or ""))
  if v and v >= 1 and v <= 300 then return v end
  return finally.TIMEOUT
end

-- What the step ended by, for the record: "success" or its error's kind.
local function ended_by(err)
  if err == nil then return "success" end
  return errors.kind(err) or "failure"
end

-- Runs m's finally after its step ended with err (nil: success). opts:
--   mode     "run" | "plan"
--   log      the step's logger
--   outcome  the step's outcome (finally's record goes in outcome.finally)
--   guard    the run's guard(method, path), or nil
--   context  function(guard, deadline, limit) -> the ctx finally gets (a
--            view whose gate calls guard before each write)
--   stopper  function(name, limit) -> the watch's on_stop
-- Returns the step's error as it stands after finally (nil: the step
-- succeeded and so did finally).
function finally.run(m, err, opts)
  local fn = m.definition.finally
  if fn == nil or opts.mode == "check" then return err end
  local log = opts.log:with { phase = "finally" }
  local record = { after = ended_by(err), writes = 0 }
  if opts.outcome then opts.outcome.finally = record end
  if errors.is(err, "lost") then
    record.ended = "not run: the lock was lost"
    log:warn("finally not run: the lock may no longer be ours, no write could be sent")
    return err
  end
  local limit = finally.timeout()
  local deadline = sys.monotime() + limit
  local budget_spent = false
  local function guard(method, path)
    if opts.guard then opts.guard(method, path) end
    if record.writes >= finally.WRITES then
      local e = errors.new("failed", { migration = m.name,
        message = ("%s's finally: write budget of %d writes spent: %s %s refused, not sent")
          :format(m.name, finally.WRITES, method, path) })
      budget_spent = budget_spent or e
      error(e, 0)
    end
    record.writes = record.writes + 1
    log:info("finally write", { method = method, path = path, write = record.writes })
  end
  -- the stop the step answered: cleared, so finally's writes are sent; set
  -- back afterwards unless another came (the run stops all the same)
  local signalled = proc.signalled()
  if signalled then proc.reset_signal() end
  log:info("finally started",
    { after = record.after, deadline_s = limit, write_budget = finally.WRITES })
  local t0 = sys.monotime()
  local ctx = opts.context(guard, deadline, limit)
  local name = m.name .. "'s finally"
  local ok, ferr, trace = sandbox.watched({ deadline = deadline,
    on_stop = opts.stopper(name, limit) }, fn, ctx)
  if signalled then proc.reset_signal(signalled) end
  local seconds = ("%.2f"):format(sys.monotime() - t0)
  -- a refusal the function caught (pcall) still fails it: the budget is the engine's
  if ok and budget_spent then ok, ferr = false, budget_spent end
  if ok then
    record.ended = "done"
    log:info("finally done", { writes = record.writes, seconds = seconds })
    return err
  end
  ferr = opts.classify(ferr, m.name, trace)
  record.ended = budget_spent and "over budget" or (errors.kind(ferr) or "failed")
  record.error = text.safe_prefix(errors.text(ferr), 200, "...")
  log:error("finally failed: " .. errors.text(ferr), { writes = record.writes, seconds = seconds })
  if err ~= nil then return err end
  return errors.new(errors.kind(ferr) or "failed", { migration = m.name, cause = ferr,
    message = ("%s: the step succeeded but its finally failed: %s")
      :format(m.name, errors.text(ferr)) })
end

return finally
