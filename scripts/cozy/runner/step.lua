-- The step executor: the one place that runs a Lua migration's run or
-- check. `run`, `plan`, `check` and the spec harness all come here, so a spec
-- exercises exactly what production runs.
--
-- For a step it builds the client view whose gate enforces the step's rules
-- at the choke point (Client:call):
--   every mode   the migration's declared `permissions` (kind "denied")
--   run, plan    guard(method, path) before every write: SIGTERM, the lock
--   check        no write at all (kind "readonly"); nothing is sent
-- (plan's "nothing is sent" is the client's dry-run mode, decided there too),
-- then the boundary ctx over that view, and runs the function under a
-- handler that turns whatever it raised into one structured error.
local context = require "cozy.runner.context"
local errors = require "cozy.errors"

local step = {}

-- What a migration raised, as a cozy.errors error naming the migration:
--   an engine error (API, denied, interrupted, ...) stays what it is;
--   a string is the migration failing closed on purpose: kind "migration";
--   anything else is a bug: kind "bug", with the traceback to find it.
local function classify(e, name, trace)
  if errors.is(e) then
    if e.migration == nil then e.migration = name end
    return e
  end
  if type(e) == "string" then
    return errors.new("migration", { message = e, migration = name, traceback = trace })
  end
  local text = errors.safe_text(e)
  return errors.new("bug", { message = ("%s raised a %s value: %s"):format(name, type(e), text),
    migration = name, traceback = trace })
end
step.classify = classify

-- Runs migration m's `run` (mode "run" or "plan") or `check` (mode "check").
-- opts:
--   client     the engine's client (its dry-run mode is the run's)
--   log        the engine's logger (tagged with the migration here)
--   namespace  the engine's namespace
--   mode       "run" | "plan" | "check"
--   guard      function(method, path) raising to stop a write (run, plan)
-- Returns ok, err (a cozy.errors error when not ok), findings (plain data),
-- and whether the migration defines the function at all.
function step.execute(m, opts)
  local mode = opts.mode or "run"
  local def = m.definition
  local fn = mode == "check" and def.check or def.run
  local findings = {}
  if fn == nil then return true, nil, findings, false end
  local view = opts.client:view {
    who = "migration " .. m.name,
    permissions = def.permissions or {},
    read_only = mode == "check" and "check() is read-only" or nil,
    guard = mode ~= "check" and opts.guard or nil,
  }
  local ctx = context.new {
    view = view, log = opts.log:with { migration = m.name }, namespace = opts.namespace,
    from = m.number, to = m.number + 1, mode = mode, findings = findings,
  }
  local trace
  local ok, err = xpcall(fn, function(e)
    trace = debug.traceback(type(e) == "string" and e or nil, 2)
    return e
  end, ctx)
  if ok then return true, nil, findings, true end
  return false, classify(err, m.name, trace), findings, true
end

return step
