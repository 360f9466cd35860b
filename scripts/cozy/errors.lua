-- cozy.errors: the one error shape of the engine.
--
-- Every failure the engine raises on purpose is a table with this metatable
-- and a stable `kind`; the kind alone decides the exit status and how the
-- failure is logged. API errors carry the fields of docs/engine-api.md
-- ("Errors": code, reason, message, method, path, absent, attempts, ...).
--
-- What a migration raises with error("...") is not one of these; the step
-- executor turns it into kind "migration" (a deliberate, one-line failure),
-- and anything else a migration raises (a table, nil, a number) into kind
-- "bug", which is logged with its traceback.
--
-- The metatable is only reachable through the engine's own `debug` library:
-- `Error` has no __index (an error's fields are its own), so a migration
-- holding an error cannot reach it, change how errors print, or forge one.
local errors = {}

local Error = { __name = "cozy.Error" }

-- error -> its kind, as the engine made it. `err.kind` is a copy for
-- readers; a migration that catches an error can write to the error, but
-- the engine decides by this table alone, so `err.kind = "lost"` raised
-- again is still what it was (a lost lock is never released, so a forged
-- "lost" would leave the lock behind).
local kind_of = setmetatable({}, { __mode = "k" })

-- kind -> exit status (0 done, 1 failed, 2 usage/configuration/invalid set, 3 locked)
errors.exit_status = {
  api = 1,          -- an API request failed (err.code, err.reason, ...)
  config = 2,       -- a missing or malformed configuration (kubeconfig, token file, ...)
  usage = 2,        -- a bad option value or environment variable
  invalid = 2,      -- an invalid migration set (gap, duplicate, bad file)
  locked = 3,       -- another live runner holds the lock
  lost = 1,         -- our lock was lost mid-run: stopped before the next write
  interrupted = 1,  -- SIGTERM/SIGINT: stopped at a safe point
  timeout = 1,      -- a step ran past its deadline
  failed = 1,       -- a step or the stamp failed
  denied = 1,       -- a migration sent a request it did not declare in `permissions`
  readonly = 1,     -- a write where none may be sent (check)
  migration = 1,    -- a migration's own error("..."): it failed closed on purpose
  bug = 1,          -- a non-string error value: a bug, logged with its traceback
}

-- A text for any value, even one whose __tostring raises, loops or returns
-- a non-string: reporting an error must never fail nor hang. A table or
-- userdata is shown through its __tostring only when that is the engine's
-- (an engine error): anything else may be a migration's code, which runs
-- only under a watch, and this may run after the watch is gone.
local function safe_text(v)
  local t = type(v)
  if t == "string" then return v end
  if (t == "table" or t == "userdata") and debug.getmetatable(v) ~= nil
    and debug.getmetatable(v) ~= Error then
    return ("(a %s value that cannot be shown)"):format(t)
  end
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return ("(a %s value that cannot be shown)"):format(t)
end
errors.safe_text = safe_text

local function describe_attempts(attempts)
  if type(attempts) ~= "table" then return "" end
  -- one attempt says nothing more than the error, unless an exec plugin
  -- failed to renew the credential after it (the reason a 401 is final)
  if #attempts <= 1 and not (attempts[1] and attempts[1].credential_error) then return "" end
  local parts = {}
  for i, a in ipairs(attempts) do
    local what = a.code ~= 0 and tostring(a.code) or (a.reason or "transport error")
    if a.code == 0 and a.message then what = what .. " (" .. safe_text(a.message) .. ")" end
    if a.credential_error then
      what = what .. ", credential not renewed: " .. safe_text(a.credential_error)
    end
    if a.after_s then what = what .. (", retried after %.2fs"):format(a.after_s) end
    parts[i] = ("#%d %s"):format(i, what)
  end
  return " [attempts: " .. table.concat(parts, "; ") .. "]"
end

function Error.__tostring(e)
  local message = safe_text(e.message or "?")
  local kind = kind_of[e]
  if kind == "api" then
    local head = e.method and ("%s %s: "):format(e.method, e.path or "?") or ""
    local code = e.code and e.code ~= 0 and (" (%d)"):format(e.code) or ""
    return ("%s%s%s: %s%s"):format(head, e.reason or "Error", code, message,
      describe_attempts(e.attempts))
  elseif kind == "config" then
    return "configuration error: " .. message
  end
  return message
end

errors.Error = Error

-- A new error of `kind` with `fields` (the table itself becomes the error).
function errors.new(kind, fields)
  if errors.exit_status[kind] == nil then
    error(("cozy.errors: unknown kind %q"):format(tostring(kind)), 2)
  end
  fields = fields or {}
  fields.kind = kind
  kind_of[fields] = kind
  return setmetatable(fields, Error)
end

-- The kind an engine error was made with (nil for anything else).
function errors.kind(v)
  return kind_of[v]
end

-- Raises a new error of `kind` with `message` and more fields.
function errors.raise(kind, message, fields)
  local e = {}
  for k, v in pairs(fields or {}) do e[k] = v end
  e.message = message
  error(errors.new(kind, e), 0)
end

-- Is v an engine error (of `kind`, or of one of several kinds)?
function errors.is(v, kind, ...)
  local own = kind_of[v]
  if own == nil then return false end
  if kind == nil or own == kind then return true end
  for i = 1, select("#", ...) do
    if own == select(i, ...) then return true end
  end
  return false
end

-- The exit status for whatever ended a command.
function errors.exit_status_of(e)
  if errors.is(e) then return errors.exit_status[kind_of[e]] or 1 end
  return 1
end

-- The one-line text of whatever was raised.
function errors.text(e)
  if type(e) == "string" then return e end
  if errors.is(e) then return safe_text(e) end
  if type(e) == "table" and type(rawget(e, "message")) == "string" then
    return rawget(e, "message")
  end
  return safe_text(e)
end

-- Flat, printable fields of an error for a log line.
local shown = { "code", "reason", "method", "path", "file", "field", "holder", "migration" }
function errors.fields(e)
  if not errors.is(e) then return nil end
  local f = { kind = kind_of[e] }
  for _, k in ipairs(shown) do
    local v = e[k]
    if v ~= nil and type(v) ~= "table" then f[k] = v end
  end
  return next(f) and f or nil
end

return errors
