-- Structured errors of cozy.kube (docs/engine-api.md, "Errors").
--
-- The rule (docs/transport.md): every failed call RAISES one of these; the
-- only calls that return nil for a normal outcome are `find` (absent object)
-- and `update` when mutate returns nil (it returns obj, false). Nothing is
-- returned as `nil, err`.
local errors = {}

local Error = { __name = "kube.Error" }
Error.__index = Error

local function describe_attempts(attempts)
  if not attempts or #attempts <= 1 then return "" end
  local parts = {}
  for i, a in ipairs(attempts) do
    local what = a.code ~= 0 and tostring(a.code) or (a.reason or "transport error")
    if a.code == 0 and a.message then what = what .. " (" .. a.message .. ")" end
    if a.after_s then what = what .. (", retried after %.2fs"):format(a.after_s) end
    parts[i] = ("#%d %s"):format(i, what)
  end
  return " [attempts: " .. table.concat(parts, "; ") .. "]"
end

function Error.__tostring(e)
  local head = e.method and ("%s %s: "):format(e.method, e.path or "?") or ""
  local code = e.code and e.code ~= 0 and (" (%d)"):format(e.code) or ""
  return ("%s%s%s: %s%s"):format(head, e.reason or "Error", code, e.message or "",
    describe_attempts(e.attempts))
end

local ConfigError = { __name = "kube.ConfigError" }
ConfigError.__index = ConfigError
function ConfigError.__tostring(e)
  return ("configuration error: %s"):format(e.message or "?")
end

errors.Error = Error
errors.ConfigError = ConfigError

function errors.is_error(v)
  local mt = getmetatable(v)
  return mt == Error or mt == ConfigError
end

function errors.new(fields)
  return setmetatable(fields, Error)
end

function errors.config(fields)
  fields.code = fields.code or 0
  fields.reason = fields.reason or "ConfigError"
  return setmetatable(fields, ConfigError)
end

local reasons = {
  [400] = "BadRequest", [401] = "Unauthorized", [403] = "Forbidden", [404] = "NotFound",
  [405] = "MethodNotAllowed", [409] = "Conflict", [410] = "Expired", [415] = "UnsupportedMediaType",
  [422] = "Invalid", [429] = "TooManyRequests", [500] = "InternalError", [502] = "BadGateway",
  [503] = "ServiceUnavailable", [504] = "Timeout",
}

-- Builds an error from a response: status code, decoded body (a metav1.Status
-- or anything else) and the raw body for non-JSON answers.
function errors.from_response(method, path, code, status, raw, attempts)
  local e = { method = method, path = path, code = code, attempts = attempts }
  if type(status) == "table" and status.kind == "Status" then
    e.reason = status.reason
    e.message = status.message
    e.details = status.details
  end
  if e.reason == nil or e.reason == "" then e.reason = reasons[code] or "Unknown" end
  if e.message == nil or e.message == "" then
    e.message = raw and raw ~= "" and raw:sub(1, 200) or ("HTTP " .. tostring(code))
  end
  -- attempts from C carry a status only: name each, and the last one fully
  for i, a in ipairs(attempts or {}) do
    if a.code ~= 0 and a.reason == nil then
      a.reason = i == #attempts and e.reason or reasons[a.code] or "Unknown"
      if i == #attempts then a.message = e.message end
    end
  end
  if code == 404 then
    -- an absent object names itself in details; an absent type does not
    local d = type(e.details) == "table" and e.details or nil
    e.absent = (d and d.name and d.name ~= "") and "object" or "type"
  end
  return setmetatable(e, Error)
end

-- A transport failure (no HTTP status): the last attempt says why.
function errors.from_transport(method, path, attempts)
  local last = attempts[#attempts] or {}
  return setmetatable({
    method = method, path = path, code = 0,
    reason = last.reason or "TransportError",
    message = last.message or "transport error",
    attempts = attempts,
  }, Error)
end

return errors
