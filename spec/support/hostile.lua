-- Runs spec/support/hostile-server (huge plain, chunked and gzip bodies) for
-- busted specs, and runs cozy-migrate children against it that report their
-- peak memory. Polls on conditions (ready file, process gone), with bounds.
local fake = require "spec.support.fake"

local hostile = {}

local READY_TIMEOUT = 10
local POLL = 0.05

hostile.server_path = "spec/support/hostile-server"
hostile.bin = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"

local files = require "spec.helpers.files"
local q, read_file, write_file, capture = files.quote, files.read, files.write, files.capture

local Server = {}
Server.__index = Server

function hostile.start()
  local dir = capture("mktemp -d -t hostile-server-spec.XXXXXX"):gsub("%s+$", "")
  assert(dir ~= "", "hostile: mktemp failed")
  local self = setmetatable({ dir = dir }, Server)
  os.execute(("%s %s --ready-file %s >%s 2>&1 </dev/null & echo $! >%s"):format(q(fake.python),
    q(hostile.server_path), q(dir .. "/ready"), q(dir .. "/stderr"), q(dir .. "/pid")))
  self.pid = tonumber((read_file(dir .. "/pid") or ""):match("%d+"))
  for _ = 1, math.floor(READY_TIMEOUT / POLL) do
    local url = read_file(dir .. "/ready")
    if url and url:match("^http://") then
      self.url = url
      -- an anonymous kubeconfig for the plain-HTTP server
      self.kubeconfig = dir .. "/kubeconfig"
      write_file(self.kubeconfig, table.concat({
        "apiVersion: v1", "kind: Config", "current-context: hostile",
        "clusters:", "- name: hostile", "  cluster: {server: '" .. url .. "'}",
        "contexts:", "- name: hostile", "  context: {cluster: hostile}", "" }, "\n"))
      return self
    end
    if not self.pid or not fake.running(self.pid) then break end
    os.execute("sleep " .. POLL)
  end
  local err = read_file(dir .. "/stderr") or ""
  self:stop()
  error("hostile: server did not become ready: " .. err, 2)
end

-- Request log: { {path=, sent=, complete=}, ... }
function Server:log()
  local json = require "cozy.json"
  return json.decode(capture("curl -s --max-time 10 " .. q(self.url .. "/_hostile/log")))
end

function Server:stop()
  if self.stopped then return end
  self.stopped = true
  if self.pid then
    os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
    local gone = false
    for _ = 1, math.floor(5 / POLL) do
      if not fake.running(self.pid) then gone = true break end
      os.execute("sleep " .. POLL)
    end
    if not gone then os.execute("kill -KILL " .. self.pid .. " 2>/dev/null") end
  end
  if self.dir:match("hostile%-server%-spec") then os.execute("rm -rf " .. q(self.dir)) end
end

-- The child: connects with the given options, GETs path, prints one JSON
-- line with the outcome and its peak resident set size (VmHWM).
local CHILD = [[
local json = require "cozy.json"
local kube = require "cozy.kube"
local opts = json.decode(arg[1])
local function hwm_kib()
  for line in io.lines("/proc/self/status") do
    local kb = line:match("^VmHWM:%s*(%d+) kB")
    if kb then return tonumber(kb) end
  end
end
local out = {}
local ok, err = pcall(function()
  local c = kube.connect(opts.connect)
  out.max_response_bytes = c.info.max_response_bytes
  local obj = c:call("GET", opts.path)
  out.pad_len = #obj.data.pad
end)
out.ok = ok
if not ok then
  out.error = tostring(err)
  if type(err) == "table" then
    out.reason, out.attempts = err.reason, err.attempts and #err.attempts
  end
end
out.hwm_kib = hwm_kib()
io.stdout:write(json.encode(out), "\n")
]]

-- Runs a child against path; connect options are merged over the server's
-- kubeconfig. Returns the decoded JSON line.
function Server:fetch(path, connect)
  local json = require "cozy.json"
  local script = self.dir .. "/child.lua"
  if not read_file(script) then write_file(script, CHILD) end
  local c = { kubeconfig = self.kubeconfig, request_timeout = 120, retry = { max_attempts = 3, base_delay = 0.01 } }
  for k, v in pairs(connect or {}) do c[k] = v end
  local line = capture(("%s lua %s %s 2>&1"):format(q(hostile.bin), q(script),
    q(json.encode { path = path, connect = c })))
  local ok, res = pcall(json.decode, line)
  assert(ok and type(res) == "table", "child did not report: " .. line)
  return res
end

return hostile
