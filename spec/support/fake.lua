-- Test helper: runs spec/support/fake-apiserver as a child process and talks to
-- its control endpoints.  Busted specs use it like this:
--
--   local fake = require("spec.helpers").server   -- specs reach it through the harness
--   local srv = fake.start{ fixtures = { "spec/fixtures/x.json" }, tls = true, token = "t" }
--   finally(function() srv:stop() end)          -- or teardown(), or `local srv <close> = ...`
--
-- See spec/support/README.md for the whole API.

local ok, json = pcall(require, "cozy.json")
if not ok then json = require "cjson" end

local fake = {}

local READY_TIMEOUT = 10      -- seconds to wait for the server to listen
-- The real control plane starts etcd and kube-apiserver (about 5 s) and may
-- build itself first (hack/test.sh builds it before any spec runs).
local REAL_READY_TIMEOUT = 600
local POLL = 0.05             -- seconds between polls

-- The server sits next to this file, wherever the specs are run from.
local here = (debug.getinfo(1, "S").source:match("^@(.*)[/\\][^/\\]*$")) or "spec/support"
fake.server_path = here .. "/fake-apiserver"
fake.real_server_path = here .. "/kube-apiserver"

--- Which server fake.start runs: "fake" (the default) or "real" (the real
--- kube-apiserver of spec/support/kube-apiserver), from COZY_SPEC_SERVER.
function fake.server_kind()
  local kind = os.getenv("COZY_SPEC_SERVER") or "fake"
  if kind == "" then kind = "fake" end
  if kind ~= "fake" and kind ~= "real" then
    error("COZY_SPEC_SERVER must be fake or real, not " .. kind, 2)
  end
  return kind
end

-- The real server's admin token when a spec gives none: the real server
-- always authenticates.
local REAL_TOKEN = "cozy-spec-admin"
fake.python = os.getenv("FAKE_APISERVER_PYTHON") or "/usr/bin/python3"
-- The kubectl specs compare us with: $KUBECTL, else the current one
-- spec/support/go/build built (spec/support/README.md), else PATH's: a
-- fresh machine's PATH may hold Debian's kubectl 1.20, kubectl's
-- conventions are judged by a current one.
fake.kubectl_path = os.getenv("KUBECTL") or (function()
  local built = (os.getenv("COZY_SUPPORT_BIN") or "spec/support/go/bin") .. "/kubectl"
  local f = io.open(built, "r")
  if f then f:close() return built end
  return "kubectl"
end)()

-- The requests a kubectl -v=6 log names: { method, path (with its query),
-- status } each, in either of its formats: before 1.30 "GET
-- https://host:port/path?query 200 OK in 3 milliseconds"; since (structured
-- logging) '"Response" verb="GET" url="https://host:port/path?query"
-- status="200 OK" milliseconds=3'.
function fake.kubectl_requests(stderr)
  local out = {}
  for method, path, status in stderr:gmatch("%] (%u+) https?://[^/%s]+(/%S*) (%d+) %u") do
    out[#out + 1] = { method, path, status }
  end
  for method, path, status in stderr:gmatch('"Response" verb="(%u+)" url="https?://[^/"]+(/[^"]*)" status="(%d+)') do
    out[#out + 1] = { method, path, status }
  end
  return out
end

local files = require "spec.helpers.files"
local q, read_file, write_file, sh, capture = files.quote, files.read, files.write, files.sh, files.capture

-- Inside the host (cozy-migrate lua busted) cozy.sys sleeps in-process; under
-- a plain lua5.4 (spec/fake runs there too) a `sleep` child does. Only poll()
-- uses it: a spec waits for a condition, never for a time.
local has_sys, sys = pcall(require, "cozy.sys")
local sleep
if has_sys and type(sys.sleep) == "function" then
  sleep = sys.sleep
else
  sleep = function(seconds) sh(("sleep %.3f"):format(seconds)) end
end

local clock = has_sys and type(sys.monotime) == "function" and sys.monotime or os.time

--- Calls fn every `step` seconds (default POLL) until it returns a truthy value,
--- which is returned, or until `timeout` seconds have passed: nil.
function fake.poll(timeout, fn, step)
  local deadline = clock() + timeout
  while true do
    local v = fn()
    if v then return v end
    if clock() > deadline then return nil end
    sleep(step or POLL)
  end
end
local poll = fake.poll

local function encode(v)
  if type(v) == "table" and next(v) == nil and v ~= nil then
    return "[]"   -- every empty table this helper sends is a list (fixtures, rules)
  end
  return json.encode(v)
end

fake.json = json
fake.quote = q

--- Is `t` a list of fixture sources (paths, List tables, arrays of objects), rather
--- than one array of objects? Objects carry `kind`/`apiVersion`; sources do not.
function fake.is_source_list(t)
  if type(t) ~= "table" or t.items ~= nil or t.kind ~= nil or t[1] == nil then return false end
  for _, v in ipairs(t) do
    local source = type(v) == "string"
      or type(v) == "table" and (v.items ~= nil or (v.kind == nil and v.apiVersion == nil))
    if not source then return false end
  end
  return true
end

-- A fixture given as a Lua table may be a List or a plain array of objects.
local fixture_text
function fixture_text(fixture)
  if type(fixture) == "string" then
    local data = read_file(fixture)
    if not data then error("fake: cannot read fixture " .. fixture, 3) end
    return data
  end
  if type(fixture) ~= "table" then error("fake: a fixture is a path or a table", 3) end
  if fake.is_source_list(fixture) then
    -- several fixtures (files or tables): a JSON array of Lists, files kept
    -- verbatim (no decode/encode round trip, which plain cjson would make lossy)
    local texts = {}
    for i, path in ipairs(fixture) do texts[i] = fixture_text(path) end
    return "[" .. table.concat(texts, ",") .. "]"
  end
  if fixture.items or fixture.kind then return json.encode(fixture) end
  return '{"apiVersion":"v1","kind":"List","items":' .. encode(fixture) .. "}"
end

local Server = {}
Server.__index = Server

--- Starts a server. opts: fixtures (list of paths or tables), tls (bool),
--- token (string), latency_ms (number), deny (list of "verb:group:resource" or
--- {verb=, group=, resource=}), listen ("127.0.0.1:0"), server ("fake" or
--- "real"; default fake.server_kind()).
---
--- The real server always serves TLS and always needs a token (`token`, or a
--- default admin token); `latency_ms` and `deny` are the fake's alone, and
--- asking the real server for them is an error.
function fake.start(opts)
  opts = opts or {}
  local real = (opts.server or fake.server_kind()) == "real"
  local dir = capture("mktemp -d -t fake-apiserver-spec.XXXXXX"):gsub("%s+$", "")
  assert(dir ~= "", "fake: mktemp failed")
  local self = setmetatable({ dir = dir, token = opts.token, kubeconfig = dir .. "/kubeconfig", real = real }, Server)
  local args
  if real then
    if opts.latency_ms or (opts.deny and #opts.deny > 0) then
      sh("rm -rf " .. q(dir))
      error("fake: latency_ms and deny are the fake API server's alone (a fake-only spec)", 2)
    end
    self.token = opts.token or REAL_TOKEN
    self.ca = dir .. "/ca.pem"
    args = { q(fake.real_server_path), "--ca-out", q(self.ca), "--token", q(self.token) }
  else
    args = { q(fake.python), q(fake.server_path) }
  end
  for _, a in ipairs { "--listen", q(opts.listen or "127.0.0.1:0"), "--ready-file", q(dir .. "/ready"),
                       "--kubeconfig-out", q(self.kubeconfig) } do
    args[#args + 1] = a
  end
  for i, fixture in ipairs(opts.fixtures or {}) do
    local path = dir .. "/fixture-" .. i .. ".json"
    write_file(path, fixture_text(fixture))
    args[#args + 1] = "--fixture " .. q(path)
  end
  if not real then
    if opts.tls then
      self.ca = dir .. "/ca.pem"
      args[#args + 1] = "--tls --ca-out " .. q(self.ca)
    end
    if opts.token then args[#args + 1] = "--token " .. q(opts.token) end
    if opts.latency_ms then args[#args + 1] = "--latency-ms " .. q(opts.latency_ms) end
    for _, d in ipairs(opts.deny or {}) do
      if type(d) == "table" then d = (d.verb or "*") .. ":" .. (d.group or "") .. ":" .. (d.resource or "*") end
      args[#args + 1] = "--deny " .. q(d)
    end
  end
  sh(table.concat(args, " ") .. " >" .. q(dir .. "/stdout") .. " 2>" .. q(dir .. "/stderr")
     .. " </dev/null & echo $! >" .. q(dir .. "/pid"))
  self.pid = tonumber((read_file(dir .. "/pid") or ""):match("%d+"))
  if not self.pid then
    self:stop()
    error("fake: could not start " .. (real and fake.real_server_path or fake.server_path), 2)
  end
  local url = poll(real and REAL_READY_TIMEOUT or READY_TIMEOUT, function()
    local u = read_file(dir .. "/ready")
    if u and u:match("^https?://") then return u end
    if not self:alive() then return "dead" end
  end)
  if url and url ~= "dead" then
    self.url = url:gsub("%s+$", "")
    return self
  end
  local err = self:stderr()
  self:stop()
  error("fake: server did not become ready: " .. (err ~= "" and err or "(no output)"), 2)
end

-- A process that has exited may linger as a zombie until its (adoptive) parent reaps
-- it, and `kill -0` succeeds on a zombie: look at /proc where there is one.
local function running(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if f then
    local stat = f:read("a") or ""
    f:close()
    local state = stat:match("%) (%a)")
    return state ~= nil and state ~= "Z" and state ~= "X"
  end
  local proc = io.open("/proc/self/stat", "r")
  if proc then
    proc:close()
    return false          -- /proc exists, the pid does not: gone
  end
  return sh("kill -0 " .. pid .. " 2>/dev/null") == 0
end
fake.running = running

function Server:alive()
  return self.pid ~= nil and not self.stopped and running(self.pid)
end

--- The server's stderr so far (for error messages).
function Server:stderr()
  return read_file(self.dir .. "/stderr") or ""
end

--- Terminates the server and removes its files; safe to call twice.
function Server:stop()
  if self.stopped then return end
  if self.pid then
    sh("kill -TERM " .. self.pid .. " 2>/dev/null")
    local gone = poll(5, function() return not running(self.pid) end)
    if not gone then sh("kill -KILL " .. self.pid .. " 2>/dev/null") end
  end
  self.stopped = true
  if self.dir and self.dir:match("fake%-apiserver%-spec") then sh("rm -rf " .. q(self.dir)) end
end
Server.__close = Server.stop
Server.__gc = Server.stop

local function parse_headers(raw)
  local headers = {}
  -- with redirects or 100-continue there can be several blocks: keep the last
  local last = raw
  for block in raw:gmatch("HTTP/[^\r\n]*\r?\n.-\r?\n\r?\n") do last = block end
  for name, value in last:gmatch("([%w%-]+):%s*([^\r\n]*)") do
    headers[name:lower()] = value
  end
  return headers
end

--- One HTTP request against the server, via the curl CLI.
--- srv:request(method, path[, opts]) or srv:request{method=, path=, ...};
--- opts: body (string, or a table to JSON-encode), content_type, token (false: send none),
--- headers ({name = value}), timeout (seconds).
--- Returns {status = n (0 if the connection was dropped), body = s, json = decoded or nil,
--- headers = {lowercase-name = value}, error = curl's message when status is 0}.
function Server:request(method, path, opts)
  if type(method) == "table" then
    opts = method
    method, path = opts.method, opts.path
  end
  opts = opts or {}
  local dir = self.dir
  local args = { "curl", "-sS", "-X", q(method or "GET"), "-o", q(dir .. "/resp.body"), "-D", q(dir .. "/resp.headers"),
                 "-w", "'%{http_code}'", "--max-time", tostring(opts.timeout or 30) }
  if self.ca then args[#args + 1] = "--cacert " .. q(self.ca) end
  local token = opts.token
  if token == nil then token = self.token end
  if token then args[#args + 1] = "-H " .. q("Authorization: Bearer " .. token) end
  if opts.body ~= nil then
    local body = type(opts.body) == "table" and json.encode(opts.body) or opts.body
    write_file(dir .. "/req.body", body)
    args[#args + 1] = "--data-binary @" .. q(dir .. "/req.body")
    args[#args + 1] = "-H " .. q("Content-Type: " .. (opts.content_type or "application/json"))
  elseif opts.content_type then
    args[#args + 1] = "-H " .. q("Content-Type: " .. opts.content_type)
  end
  for name, value in pairs(opts.headers or {}) do
    args[#args + 1] = "-H " .. q(name .. ": " .. value)
  end
  os.remove(dir .. "/resp.body")
  os.remove(dir .. "/resp.headers")
  args[#args + 1] = q(self.url .. path)
  local out = capture(table.concat(args, " ") .. " 2>" .. q(dir .. "/curl.err"))
  local res = { status = tonumber(out:match("(%d+)%s*$")) or 0 }
  res.body = read_file(dir .. "/resp.body") or ""
  res.headers = parse_headers(read_file(dir .. "/resp.headers") or "")
  if res.status == 0 then res.error = read_file(dir .. "/curl.err") end
  if res.body ~= "" then
    local okay, decoded = pcall(json.decode, res.body)
    if okay then res.json = decoded end
  end
  return res
end

-- control endpoints: no token, errors are fatal to the spec
function Server:control(method, path, body)
  local res = self:request(method, path, { body = body, token = false })
  if res.status ~= 200 then
    -- a refused request answers a Status: its message is what the spec needs to read
    local why = type(res.json) == "table" and type(res.json.message) == "string" and res.json.message or res.body
    error(("fake: %s %s answered %d: %s %s"):format(method, path, res.status, why, res.error or ""), 3)
  end
  return res.json
end

--- Every stored object (decoded items of /_fake/objects).
function Server:objects()
  return self:control("GET", "/_fake/objects").items
end

--- One stored object or nil.  kind is "ConfigMap" or "Kind.group" ("VirtualMachine.kubevirt.io");
--- namespace is nil for cluster-scoped objects.
function Server:object(kind, namespace, name)
  local k, group = kind:match("^([^.]+)%.(.+)$")
  k = k or kind
  for _, o in ipairs(self:objects()) do
    local g = (o.apiVersion or ""):match("^(.*)/") or ""
    local m = o.metadata or {}
    if o.kind == k and (group == nil or g == group) and m.name == name
        and (m.namespace or nil) == (namespace or nil) then
      return o
    end
  end
  return nil
end

--- The request log: {method, path, query, content_type, body, status, user_agent[, fault]}.
--- filter (optional): {method = "PATCH", path = "lua pattern"} keeps the matching entries.
function Server:requests(filter)
  local log = self:control("GET", "/_fake/requests")
  if not filter then return log end
  local out = {}
  for _, e in ipairs(log) do
    if (not filter.method or e.method == filter.method)
        and (not filter.path or tostring(e.path):match(filter.path)) then
      out[#out + 1] = e
    end
  end
  return out
end

--- What the fault rules did: the `fault.action` of every request-log entry a rule
--- fired on, in log order (filter as for requests()). A fault test asserts this, so
--- that a rule that never fires cannot pass for one that did.
function Server:fired(filter)
  local out = {}
  for _, e in ipairs(self:requests(filter)) do
    if type(e.fault) == "table" then out[#out + 1] = e.fault.action end
  end
  return out
end

function Server:clear_requests()
  self:control("DELETE", "/_fake/requests")
end

--- Adds fault rules (see README); they fire in order, first match wins.
function Server:faults(rules)
  return self:control("POST", "/_fake/faults", encode(rules))
end

function Server:clear_faults()
  self:control("DELETE", "/_fake/faults")
end

--- Replaces the deny rules set at run time: list of {verb=, group=, resource=[, namespace=]}.
function Server:deny(rules)
  self:control("POST", "/_fake/denies", encode(rules))
end

--- Allow-list mode: from now on only requests one of `rules` covers are allowed
--- (deny rules still apply on top); each rule {verb=, group=, resource=[, namespace=][, name=]},
--- `*` for any verb, group or resource. srv:allow{} allows nothing; srv:allow(nil) ends the mode.
function Server:allow(rules)
  self:control("POST", "/_fake/allows", rules == nil and "null" or encode(rules))
end

--- Reloads the whole state from a fixture: a path, a List table, an array of objects,
--- or a list of those (paths and tables mixed).
function Server:reset(fixture)
  self:control("POST", "/_fake/reset", fixture_text(fixture or {}))
  -- kubectl's discovery cache would remember the previous state's resource types
  sh("rm -rf " .. q(self.dir .. "/kubecache"))
end

--- Deletes a CustomResourceDefinition through the API, as an operator would,
--- and waits until the server no longer serves it: a cluster without KubeVirt
--- or Flux on either server (the real one always starts with their CRDs; a
--- reset brings them back).
---
--- A real server's discovery follows the CRD's removal a moment later (its
--- discovery controller works from a watch): this also waits until no served
--- version of the CRD lists its resource any more, so that a client started
--- next cannot still see the API.
function Server:delete_crd(name)
  local path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" .. name
  local crd = self:request("GET", path)
  if crd.status ~= 200 and crd.status ~= 404 then
    error(("fake: reading CRD %s answered %d: %s"):format(name, crd.status, crd.body), 2)
  end
  local res = self:request("DELETE", path)
  if res.status ~= 200 and res.status ~= 404 then
    error(("fake: deleting CRD %s answered %d: %s"):format(name, res.status, res.body), 2)
  end
  local gone = poll(60, function() return self:request("GET", path).status == 404 end)
  if not gone then error("fake: CRD " .. name .. " was not removed within 60 s", 2) end
  local spec = crd.status == 200 and type(crd.json) == "table" and crd.json.spec or {}
  for _, v in ipairs(spec.versions or {}) do
    local discovery = "/apis/" .. tostring(spec.group) .. "/" .. tostring(v.name)
    local unlisted = poll(60, function()
      local r = self:request("GET", discovery)
      if r.status == 404 then return true end
      if r.status ~= 200 or type(r.json) ~= "table" then return false end
      for _, listed in ipairs(r.json.resources or {}) do
        if listed.name == spec.names.plural then return false end
      end
      return true
    end)
    if not unlisted then error(("fake: %s still lists %s 60 s after CRD %s was removed"):format(
      discovery, tostring(spec.names.plural), name), 2) end
  end
end

--- Emulated etcd compaction: every continue token issued so far expires (410).
function Server:compact()
  return self:control("POST", "/_fake/compact")
end

--- Runs kubectl against the server.  srv:kubectl("get", "cm", "-n", "x") or
--- srv:kubectl{ "apply", "-f", "-", stdin = "..." }.
--- Returns {ok = bool, code = n, stdout = s, stderr = s}.
function Server:kubectl(first, ...)
  local argv = type(first) == "table" and first or { first, ... }
  local parts = { q(fake.kubectl_path), "--kubeconfig=" .. q(self.kubeconfig),
                  "--cache-dir=" .. q(self.dir .. "/kubecache") }
  for _, a in ipairs(argv) do parts[#parts + 1] = q(a) end
  local stdin = "/dev/null"
  if argv.stdin then
    stdin = self.dir .. "/kubectl.stdin"
    write_file(stdin, argv.stdin)
  end
  local code = sh(table.concat(parts, " ") .. " <" .. q(stdin) .. " >" .. q(self.dir .. "/kubectl.out")
                  .. " 2>" .. q(self.dir .. "/kubectl.err"))
  return { ok = code == 0, code = code, stdout = read_file(self.dir .. "/kubectl.out") or "",
           stderr = read_file(self.dir .. "/kubectl.err") or "" }
end

return fake
