-- What a legacy script's kubectl asks the engine's endpoint, served
-- through the engine's client. The endpoint (core/endpoint.c) is the only
-- address the script can reach; each request it takes comes here as
-- { method, target, headers, body } and goes through the same Client:call
-- the Lua steps use.
--
-- In a rehearsal (docs/operations.md, "Rehearsals") that client is the
-- rehearsal's: reads merged with the overlay, writes sent with dryRun=All
-- and entering the overlay, each write a verdict in the plan's write list.
-- Discovery (/api, /apis, /openapi, /version) is read from the live server.
-- A watch is answered with the merged list as ADDED events, then ends. What
-- the overlay cannot serve (exec, attach, port-forward, proxy, any upgrade)
-- is answered 501 with a Status saying so, and the step marked inexact.
--
-- In a run bound to a plan (`run --plan`; docs/operations.md, "A saved
-- plan") it is the run's own client, forwarding to the live cluster: real
-- writes, each held to the plan's (cozy.kube.binding) in Client:prepare
-- before it is sent, as a Lua step's are. The script's requests are answered
-- as its rehearsal answered them where the overlay did not serve them (a
-- watch as a list, then ended; exec and the like 501), so that it makes the
-- requests the plan holds. The first write the plan does not hold is not
-- sent: it is answered 403 with the binding's reason, the script is stopped
-- (serve's fourth result: proc.spawn stops its group), and every request
-- after it is answered the same, unsent.
local errors = require "cozy.kube.errors"
local json = require "cozy.json"
local rehearsal = require "cozy.kube.rehearsal"
local request = require "cozy.kube.request"

local overlay_endpoint = {}

local JSON = "application/json"
local transcoded

local function unescape(s)
  return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- "a=b&c=d" as the client's query: an array of { name, value }.
local function query_of(qs)
  local out = {}
  for part in (qs or ""):gmatch("[^&]+") do
    local k, v = part:match("^([^=]*)=?(.*)$")
    out[#out + 1] = { unescape(k), unescape(v) }
  end
  return out
end

local function status(code, reason, message, stop)
  return code, JSON,
    json.encode(json.object { kind = "Status", apiVersion = "v1", metadata = json.object {},
      status = "Failure", message = message, reason = reason, code = code }), stop
end

-- The answer for an error the client raised: the server's own Status (or
-- the one the rehearsal answered as the run's server would), else a 502.
local function failed(e, forward)
  if errors.is_error(e) and type(e.code) == "number" and e.code >= 400 then
    return e.code, JSON,
      json.encode(json.object { kind = "Status", apiVersion = "v1", metadata = json.object {},
        status = "Failure", message = e.message, reason = e.reason, details = e.details,
        code = e.code })
  end
  if errors.is_error(e) then
    return status(502, "BadGateway", (forward and "the engine could not reach the cluster: "
      or "the rehearsal could not read the live cluster: ") .. tostring(e.message))
  end
  error(e, 0)
end

-- A run bound to a plan: the answer to a request the run refuses, unsent
-- (the binding's reason), with the script asked stopped.
local function refused(why)
  return status(403, "Forbidden", "cozy-migrate run --plan: " .. why, true)
end

-- A request a rehearsal serves inexactly, marked so (a run bound to a plan
-- has no rehearsal: it answers as the rehearsal did and marks nothing).
local function mark(client, why)
  if client.rehearsal then rehearsal.mark(client.rehearsal, why) end
end

local UNSERVED = { exec = "exec", attach = "attach", portforward = "port-forward", proxy = "proxy" }

-- Why a request cannot be served faithfully, or nil.
local function unserved(method, path, headers)
  local last = path:match("/([^/]+)$")
  local sub = path:match("/(proxy)/") or (last and UNSERVED[last] and last)
  if sub then return UNSERVED[sub] end
  if headers.upgrade then return "a connection upgrade (" .. headers.upgrade .. ")" end
  if method == "CONNECT" then return "CONNECT" end
  return nil
end

-- A create whose body is protobuf, as JSON: the live server decodes it
-- (a dry-run create, which stores nothing) and answers the object, whose
-- server-set fields are dropped; then it is created as any JSON body is.
-- Returns 200 and the object, or the server's status and answer. Only a
-- create: another write in protobuf is refused (415) and the step marked inexact.
local SERVER_SET = { "uid", "creationTimestamp", "resourceVersion", "managedFields", "generation" }
transcoded = function(client, method, path, query, raw, ctype)
  if method ~= "POST" then
    local why = ("%s %s: a protobuf body is taken for a create only"):format(method, path)
    mark(client, why)
    local _, _, body = status(415, "UnsupportedMediaType", why)
    return 415, body
  end
  local q = table.move(query, 1, #query, 1, {})
  q[#q + 1] = { "dryRun", "All" }
  local code, obj = client._t:request("POST", path, { query = request.encode_query(q), body = raw,
    content_type = ctype, decode = true })
  if code < 200 or code >= 300 or type(obj) ~= "table" or type(obj.metadata) ~= "table" then
    if code == 0 then
      return status(502, "BadGateway", "the rehearsal could not reach the live cluster")
    end
    return code, type(obj) == "string" and obj or "{}"
  end
  for _, k in ipairs(SERVER_SET) do obj.metadata[k] = nil end
  return 200, obj
end

local WATCH_ONLY = { resourceVersion = true, resourceVersionMatch = true,
  allowWatchBookmarks = true, timeoutSeconds = true, sendInitialEvents = true }

local function discovery(path)
  return path == "/api" or path == "/apis" or path == "/version" or path:match("^/api/[^/]+/?$")
    or path:match("^/apis/[^/]+/?$") or path:match("^/apis/[^/]+/[^/]+/?$")
    or path:match("^/openapi/")
    or path == "/openapi" or path == "/livez" or path == "/readyz" or path == "/healthz"
end

-- A serve function for the endpoint, and its tally ({ writes = n }: the
-- script's writes the engine sent for it, whatever the server answered).
-- client: the rehearsal client (its dry_run "rehearse"), or, with
-- opts.forward, a run's client bound to a plan (client.binding, "check");
-- log: the step's logger.
function overlay_endpoint.server(client, log, opts)
  local forward = opts ~= nil and opts.forward == true
  local tally = { writes = 0 }
  local binding = client.binding
  -- the one call every served request makes: in a run bound to a plan, a
  -- write the plan does not hold raises in Client:prepare, unsent
  local function call(method, path, spec)
    -- the script's, for the binding (a plan being saved, or a bound run)
    if binding then binding.script = true end
    local ok, answer, code = pcall(client.call, client, method, path, spec)
    if binding then binding.script = nil end
    if not ok and forward and binding and binding.stopped then
      if log then
        log:warn("the script's write is not sent, and the script is stopped: " .. binding.stopped)
      end
      return nil, table.pack(refused(binding.stopped))
    end
    if request.is_write(method) then tally.writes = tally.writes + 1 end
    return ok, answer, code
  end
  local serve = function(req)
    local path, qs = req.target:match("^([^?]*)%??(.*)$")
    local method = req.method
    if log then log:debug("script endpoint request", { method = method, path = req.target }) end
    if forward and binding and binding.stopped then
      return refused(binding.stopped .. "; nothing more is sent")
    end
    local what = unserved(method, path, req.headers)
    if what then
      local why = forward
        and ("%s %s: the legacy script's %s is not forwarded in a run bound to a plan: the engine "
          .. "could not hold "
          .. "what it does to the plan (its rehearsal was answered the same)")
            :format(method, path, what)
        or ("%s %s: the legacy script's %s cannot be rehearsed: the overlay serves no %s")
          :format(method, path, what, what)
      mark(client, why)
      return status(501, "NotImplemented", why)
    end
    local query = query_of(qs)
    if discovery(path) then
      if method ~= "GET" then return status(405, "MethodNotAllowed", method .. " " .. path) end
      local ok, body = pcall(function() return (client:call("GET", path, { query = query })) end)
      if not ok then return failed(body, forward) end
      return 200, JSON, json.encode(body)
    end
    local watch = false
    for i = #query, 1, -1 do
      if query[i][1] == "watch" then
        watch = query[i][2] == "true" or query[i][2] == "1"
        table.remove(query, i)
      end
    end
    local body
    local ctype = req.headers["content-type"]
    if req.body ~= "" and ctype and ctype:find("protobuf", 1, true) then
      -- kubectl's typed clients (`kubectl create configmap ...`) send protobuf
      local code, obj = transcoded(client, method, path, query, req.body, ctype)
      if code ~= 200 then return code, JSON, obj end
      body, ctype = obj, JSON
    elseif req.body ~= "" then
      local ok, decoded = pcall(json.decode, req.body)
      if not ok then
        return status(415, "UnsupportedMediaType",
          "the engine's endpoint takes JSON (or protobuf) request bodies only")
      end
      body = decoded
    end
    if watch then
      -- a list of the state now: a watch's own parameters do not apply to it
      for i = #query, 1, -1 do
        if WATCH_ONLY[query[i][1]] then table.remove(query, i) end
      end
      local ok, list = pcall(function() return (client:call("GET", path, { query = query })) end)
      if not ok then return failed(list, forward) end
      mark(client, ("watch of %s: answered with the rehearsal's state, then ended"):format(path))
      local events = {}
      for _, item in ipairs(type(list) == "table" and type(list.items) == "table" and list.items
        or {}) do
        if list.kind and type(item) == "table" and item.kind == nil then
          item.kind, item.apiVersion = (list.kind:gsub("List$", "")), list.apiVersion
        end
        events[#events + 1] = json.encode(json.object { type = "ADDED", object = item })
      end
      return 200, JSON, #events > 0 and (table.concat(events, "\n") .. "\n") or ""
    end
    local ok, answer, code = call(method, path, { query = query, body = body,
      content_type = body ~= nil and ctype or nil })
    if ok == nil then return table.unpack(answer, 1, answer.n) end -- refused: not sent
    if not ok then return failed(answer, forward) end
    if code == nil or code == 0 then code = method == "POST" and 201 or 200 end
    if answer == nil then return code, JSON, "{}" end
    return code, JSON, json.encode(answer)
  end
  return serve, tally
end

return overlay_endpoint
