-- API errors of cozy.kube: cozy.errors of kind "api" (and "config" for a
-- configuration the transport refused), built from a response or a
-- transport failure (docs/engine-api.md, "Errors").
--
-- The rule (docs/transport.md): every failed call RAISES one of these; the
-- only calls that return nil for a normal outcome are `find` (absent object)
-- and `update` when mutate returns nil (it returns obj, false). Nothing is
-- returned as `nil, err`.
local base = require "cozy.errors"
local request = require "cozy.kube.request"
local text = require "cozy.text"

local errors = {}

errors.Error = base.Error

-- An API error or a configuration error?
function errors.is_error(v)
  return base.is(v, "api", "config")
end

-- An API error of one request, as a best-effort batch counts it and goes
-- on (docs/engine-api.md, "A batch's errors"): kind "api", but not a stop
-- (a signal, a deadline) that ended the request, which stops everything.
function errors.is_item_error(v)
  if not base.is(v, "api") then return false end
  return not (v.code == 0 and (v.reason == "Interrupted" or v.reason == "DeadlineExceeded"))
end

-- An API error from fields { method=, path=, code=, reason=, message=, details=, attempts= }.
function errors.new(fields)
  return base.new("api", fields)
end

function errors.config(fields)
  fields.code = fields.code or 0
  fields.reason = fields.reason or "ConfigError"
  return base.new("config", fields)
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
    e.reason = type(status.reason) == "string" and status.reason or nil
    e.message = type(status.message) == "string" and status.message or nil
    e.details = type(status.details) == "table" and status.details or nil
  end
  if e.reason == nil or e.reason == "" then e.reason = reasons[code] or "Unknown" end
  if e.message == nil or e.message == "" then
    e.message = raw and raw ~= "" and text.safe_prefix(raw, 200) or ("HTTP " .. tostring(code))
  end
  -- a refused Secret write is answered with a message that quotes the
  -- object it was sent, data included (the real kube-apiserver's 422)
  if request.is_secrets(path or "") and code ~= 404 then
    e.message = ("the server's message is not shown: on a secrets path it may quote the "
      .. "Secret's data (HTTP %d)")
      :format(code)
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
    local d = e.details
    e.absent = (d and d.name and d.name ~= "") and "object" or "type"
  end
  return errors.new(e)
end

-- Did the server refuse the object a write would make, rather than the write
-- itself? kube-apiserver names the refused fields in `details.causes` (a
-- CRD's schema, a built-in's validation); a JSON patch whose op failed (a
-- `test` of ours among them) is a 422 with no causes. So a 422 with causes is
-- never a conflict: the patch, its test included, applied; the result is
-- invalid, and reading the object again cannot change that.
function errors.is_invalid_object(e)
  if not (errors.is_error(e) and e.code == 422) then return false end
  local d = e.details
  return type(d) == "table" and type(d.causes) == "table" and d.causes[1] ~= nil
end

-- A transport failure (no HTTP status): the last attempt says why.
function errors.from_transport(method, path, attempts)
  local last = attempts[#attempts] or {}
  return errors.new {
    method = method, path = path, code = 0,
    reason = last.reason or "TransportError",
    message = last.message or "transport error",
    attempts = attempts,
  }
end

return errors
