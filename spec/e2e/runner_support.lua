-- Helpers for the runner's e2e specs: run the binary (foreground or in the
-- background), read its output, poll with a bound.
local support = {}

support.bin = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
support.quote = q

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
support.slurp = slurp

function support.tmpdir()
  local p = io.popen("mktemp -d -t cozy-runner-spec.XXXXXX")
  local dir = p:read("l")
  p:close()
  return dir
end

local function command_line(args, env)
  local parts = { "exec env" }
  -- env wants its -u options before the assignments
  for k, v in pairs(env or {}) do
    if v == false then parts[#parts + 1] = "-u " .. k end
  end
  for k, v in pairs(env or {}) do
    if v ~= false then parts[#parts + 1] = q(k .. "=" .. v) end
  end
  parts[#parts + 1] = q(support.bin)
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  return table.concat(parts, " ")
end

-- Runs cozy-migrate; returns { code =, stdout =, stderr = }.
-- env: name -> value, or false to unset (NAMESPACE, TARGET_VERSION... are
-- unset unless given, so the host environment does not leak in).
function support.run(args, env)
  local dir = support.tmpdir()
  local e = { NAMESPACE = false, TARGET_VERSION = false, CURRENT_VERSION = false, POD_NAME = false }
  for k, v in pairs(env or {}) do e[k] = v end
  local ok, how, code = os.execute(("(%s) >%s 2>%s </dev/null"):format(command_line(args, e),
    q(dir .. "/out"), q(dir .. "/err")))
  local res = { stdout = slurp(dir .. "/out") or "", stderr = slurp(dir .. "/err") or "" }
  res.code = (how == "exit") and code or (128 + (code or 0))
  if ok and how == "exit" then res.code = 0 end
  os.execute("rm -rf " .. q(dir))
  return res
end

local Proc = {}
Proc.__index = Proc

-- Starts cozy-migrate in the background; returns a Proc.
function support.start(args, env)
  local dir = support.tmpdir()
  local e = { NAMESPACE = false, TARGET_VERSION = false, CURRENT_VERSION = false, POD_NAME = false }
  for k, v in pairs(env or {}) do e[k] = v end
  os.execute(("sh -c %s >/dev/null 2>&1 </dev/null &"):format(q(
    ("%s >%s 2>%s </dev/null & echo $! >%s; wait $!; echo $? >%s"):format(
      command_line(args, e), q(dir .. "/out"), q(dir .. "/err"), q(dir .. "/pid"), q(dir .. "/rc")))))
  local self = setmetatable({ dir = dir }, Proc)
  assert(support.poll(5, function()
    self.pid = tonumber((slurp(dir .. "/pid") or ""):match("%d+"))
    return self.pid
  end), "background cozy-migrate did not start")
  return self
end

function Proc:done()
  local rc = slurp(self.dir .. "/rc")
  return rc and rc:match("%d+") and tonumber(rc:match("%d+")) or nil
end

-- Waits (bounded) for exit; returns { code =, stdout =, stderr = }.
function Proc:wait(timeout)
  local code = support.poll(timeout or 60, function() return self:done() end)
  assert(code, "cozy-migrate did not exit within " .. tostring(timeout or 60) .. "s: " .. self:stderr())
  return { code = code, stdout = slurp(self.dir .. "/out") or "", stderr = self:stderr() }
end

function Proc:stderr() return slurp(self.dir .. "/err") or "" end

function Proc:kill(sig)
  os.execute("kill -" .. (sig or "KILL") .. " " .. self.pid .. " 2>/dev/null")
end

function Proc:cleanup()
  if not self:done() then self:kill("KILL") end
  support.poll(5, function() return self:done() end)
  os.execute("rm -rf " .. q(self.dir))
end

-- Calls fn every `step` seconds until it returns a truthy value (returned)
-- or `timeout` seconds pass (nil).
function support.poll(timeout, fn, step)
  local sys = require "cozy.sys"
  local deadline = sys.monotime() + timeout
  repeat
    local v = fn()
    if v then return v end
    sys.sleep(step or 0.02)
  until sys.monotime() > deadline
  return nil
end

-- Requests of the fake that change state (what "no write" means).
function support.writes(srv)
  local out = {}
  for _, r in ipairs(srv:requests()) do
    -- an access review (self or not) persists nothing
    if r.method ~= "GET" and r.method ~= "HEAD" and not r.path:match("subjectaccessreviews$") then
      out[#out + 1] = r
    end
  end
  return out
end

-- A fixture: the namespace, the version ConfigMap at `version` (nil: no
-- ConfigMap, a fresh install) and `extra` objects: for srv:reset(...), and
-- fake.start{ fixtures = { support.fixture(...) } }.
function support.fixture(version, extra, labels)
  local items = { { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } } }
  if version then
    items[#items + 1] = { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "cozystack-version", namespace = "cozy-system", labels = labels },
      data = { version = tostring(version) } }
  end
  for _, o in ipairs(extra or {}) do items[#items + 1] = o end
  return items
end

function support.configmap(name, data)
  return { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, namespace = "cozy-system" }, data = data }
end

-- The args of a command against srv with the migrations of fixture dir `dir`
-- alone (--no-builtin: the fixture sets are numbered from 1 and must not mix
-- with the built-in 59).
function support.args(srv, dir, ...)
  local args = { ... }
  for _, a in ipairs({ "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations",
      dir:find("/") and dir or ("spec/fixtures/runner/" .. dir) }) do
    args[#args + 1] = a
  end
  return args
end

-- data.version of the stamp, as a number (nil: absent)
function support.version(srv)
  local cm = srv:object("ConfigMap", "cozy-system", "cozystack-version")
  return cm and tonumber(cm.data.version), cm
end

function support.history(cm)
  local json = require "cozy.json"
  return json.decode(cm.data.history or "[]")
end

function support.lines(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

return support
