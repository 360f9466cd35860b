-- The runner's own failures, each with the exit status design.md gives it.
-- Every other error (a kube.Error, a migration's error()) means "a migration
-- or an API call failed": exit 1.
local errors = {}

local RunnerError = {}
RunnerError.__index = RunnerError
RunnerError.__tostring = function(e) return e.message end
errors.RunnerError = RunnerError

-- kind -> exit status
errors.exit_status = {
  invalid = 2,      -- an invalid migration set (gap, duplicate, bad file)
  usage = 2,        -- a bad option value or environment variable
  locked = 3,       -- another live runner holds the lock
  lost = 1,         -- our lock was lost mid-run: stopped before the next write
  interrupted = 1,  -- SIGTERM/SIGINT: stopped at a safe point
  failed = 1,       -- a migration or the stamp failed
}

function errors.new(kind, message, fields)
  local e = { kind = kind, message = message }
  for k, v in pairs(fields or {}) do e[k] = v end
  return setmetatable(e, RunnerError)
end

function errors.raise(kind, message, fields)
  error(errors.new(kind, message, fields), 0)
end

function errors.is(e, kind)
  return getmetatable(e) == RunnerError and (kind == nil or e.kind == kind)
end

return errors
