-- The pod's termination message: at the end of a run or a check, one line
-- (its summary, or the error that failed it) written to the file the kubelet
-- reads when the container ends, /dev/termination-log, so that
-- `kubectl describe pod` and `kubectl get pod -o jsonpath=...` show it.
--
-- Written only when the file exists (the kubelet creates it in a pod; on a
-- workstation there is none), and cut to the kubelet's 4096 bytes.
-- COZY_MIGRATE_TERMINATION_LOG names another path (tests; a pod whose
-- terminationMessagePath is not the default).
local errors = require "cozy.errors"
local text = require "cozy.text"

local termination = {}

termination.DEFAULT_PATH = "/dev/termination-log"
-- the kubelet reads at most this much of the file
termination.LIMIT = 4096

function termination.path()
  local p = os.getenv("COZY_MIGRATE_TERMINATION_LOG")
  if p and p ~= "" then return p end
  return termination.DEFAULT_PATH
end

-- Writes `line` (made one printable line by text.line, cut at a character boundary)
-- when the file exists. Returns whether it wrote; never raises: the run's
-- exit status is what it is, message or not.
function termination.write(line)
  local path = termination.path()
  -- "r+" opens only a file that exists (and that we may write)
  local probe = io.open(path, "r+")
  if not probe then return false end
  probe:close()
  local f = io.open(path, "w")
  if not f then return false end
  local ok = f:write(text.prefix(text.line(line), termination.LIMIT))
  f:close()
  return ok ~= nil
end

-- A command's end (runner.protect's finished): the error that failed it, else
-- its own line (nil: its exit status).
function termination.finish(status, err, line)
  return termination.write(err and ("failed (exit %d): %s"):format(status, errors.text(err))
    or line or ("exit " .. status))
end

return termination
