-- cozy.kube.trace: kubectl's request tracing (-v=6 and up), called from the
-- one place every request's result is known (Client:finish, serial and
-- batched alike). One log line per attempt that went out: method, path,
-- status and duration; from -v=8 the request's and the answer's bodies too,
-- cut at 1 KiB as kubectl cuts them (-v=9: whole).
--
-- Never logged: headers (the transport keeps them, the token and client key
-- never leave C memory), and a Secret's data: any object of kind Secret,
-- and the objects, lists and patches of a secrets path, have their `data`
-- and `stringData` values (and a JSON patch's values) replaced before the
-- body is encoded, as are the messages of a Status a secrets path answers.
-- A Secret's annotations carry its data too: `kubectl apply` keeps the
-- whole object it applied in kubectl.kubernetes.io/last-applied-configuration
-- (kapp in kapp.k14s.io/original, other tools elsewhere), so every
-- annotation value of a Secret that is JSON is redacted as a Secret's body
-- (any object, list or patch inside it), and one that looks like JSON but
-- does not decode is replaced whole. The same redaction is what a client
-- dry run records of a write (plan, run --dry-run, check's findings).
-- Every line also goes through cozy.log's text.safe, a body before it is
-- cut (a cut inside a URL's user-info would hide the '@' that marks it).
local json = require "cozy.json"
local request = require "cozy.kube.request"
local text = require "cozy.text"

-- MAX_DEPTH: a table nested deeper in a body is shown as "<too deep>"
local trace = { REQUESTS = 6, BODIES = 8, WHOLE_BODIES = 9, BODY_BYTES = 1024, MAX_DEPTH = 64 }

local REDACTED = "<redacted>"

local function redact_values(t)
  if type(t) ~= "table" then return REDACTED end
  local mt = getmetatable(t)
  local c = setmetatable({}, (mt == json.array_mt or mt == json.object_mt) and mt or nil)
  for k in pairs(t) do c[k] = REDACTED end
  return c
end

local redacted

-- A Secret's annotations, each value that is (or looks like) JSON redacted
-- as the body of a secrets path: a last-applied-configuration is the
-- object kubectl applied, data and stringData included.
local function redact_annotations(annotations, depth)
  if type(annotations) ~= "table" then return annotations end
  for k, v in pairs(annotations) do
    if type(v) == "string" and v:find("^%s*[%[{]") then
      local ok, decoded = pcall(json.decode, v)
      local eok, encoded = false, nil
      if ok and type(decoded) == "table" then
        eok, encoded = pcall(json.encode, redacted(decoded, true, depth + 1))
      end
      annotations[k] = eok and encoded or REDACTED
    end
  end
  return annotations
end

-- A copy of v (the caller's body is never changed) with Secret data redacted.
-- `secret`: v is the body of a secrets path (an object, a list, or a patch).
-- The copy is data: its tables carry cozy.json's array and object marks
-- and no other metatable (the encoder reads none).
function redacted(v, secret, depth)
  if type(v) ~= "table" then return v end
  depth = depth or 0
  if depth > trace.MAX_DEPTH then return "<too deep>" end
  -- nothing in v to redact or to cut (every body of a write a plan shows,
  -- but a Secret's): the copy in C, not table by table here
  if not secret and not json.holds(v, "kind", "Secret", trace.MAX_DEPTH - depth) then
    return json.copy(v)
  end
  local mt = getmetatable(v)
  local c = setmetatable({}, (mt == json.array_mt or mt == json.object_mt) and mt or nil)
  for k, x in pairs(v) do c[k] = redacted(x, secret and k == "items", depth + 1) end
  if secret and c.kind == "Status" then
    -- an answer refusing a write to a Secret quotes the object it was
    -- sent, data included (a real API server's 422 does)
    if c.message ~= nil then c.message = REDACTED end
    if type(c.details) == "table" and type(c.details.causes) == "table" then
      for _, cause in ipairs(c.details.causes) do
        if type(cause) == "table" and cause.message ~= nil then cause.message = REDACTED end
      end
    end
  end
  if secret or c.kind == "Secret" then
    if c.data ~= nil then c.data = redact_values(c.data) end
    if c.stringData ~= nil then c.stringData = redact_values(c.stringData) end
    if type(c.metadata) == "table" then redact_annotations(c.metadata.annotations, depth) end
    if secret and c[1] ~= nil then
      -- a list's items, or a JSON patch's operations
      for i, x in ipairs(c) do
        if type(x) == "table" then
          if x.op ~= nil and x.value ~= nil then x.value = REDACTED end
          if x.data ~= nil then x.data = redact_values(x.data) end
          if x.stringData ~= nil then x.stringData = redact_values(x.stringData) end
          if type(x.metadata) == "table" then redact_annotations(x.metadata.annotations, depth) end
          c[i] = x
        end
      end
    end
  end
  return c
end
trace.redacted = redacted

local is_secrets = request.is_secrets

local function shown_body(body, secret, whole)
  if body == nil or body == "" then return nil end
  if type(body) == "string" then
    local ok, v = pcall(json.decode, body)
    if ok then
      body = v
    elseif secret then
      return REDACTED -- not JSON: nothing to pick the data out of
    end
  end
  if type(body) == "table" then
    local ok, s = pcall(json.encode, redacted(body, secret))
    body = ok and s or "<not encodable>"
  end
  body = text.safe(tostring(body))
  if not whole and #body > trace.BODY_BYTES then
    body = body:sub(1, trace.BODY_BYTES)
      .. (" [truncated %d chars]"):format(#body - trace.BODY_BYTES)
  end
  return body
end

-- Logs the attempts of one request at log's verbosity (nothing below 6).
function trace.request(log, req, body, attempts)
  local v = log.verbosity or 0
  if v < trace.REQUESTS then return end
  local secret = is_secrets(req.path)
  local bodies = v >= trace.BODIES
  local whole = v >= trace.WHOLE_BODIES
  local request_body = bodies and shown_body(req.options and req.options.body, secret, whole) or nil
  local n = #attempts
  for i, a in ipairs(attempts) do
    if a.sent ~= false then
      log:write("debug", "API request", {
        method = req.method, path = req.shown, status = a.code,
        ms = a.elapsed_s and math.floor(a.elapsed_s * 1000 + 0.5) or nil,
        attempt = n > 1 and i or nil, reason = a.code == 0 and a.reason or nil,
        request_body = request_body,
        -- the answer's body is the last attempt's
        response_body = bodies and i == n and shown_body(body, secret, whole) or nil,
      })
    end
  end
end

return trace
