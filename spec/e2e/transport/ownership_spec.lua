-- Who owns what the transport allocates when a caller's options raise
-- (issue 22, "Ownership gaps"). m:submit used to allocate its job and then
-- read `retry_safe` and `timeout` from the caller's table: an __index that
-- raised there stranded the job and its strings (about 240 bytes a call;
-- 11 -> 139 MB RSS over 200,000 calls in the issue's measure). Now every
-- option is read before anything is allocated.
--
-- The calls run in a child cozy-migrate, so that the ASan build's
-- LeakSanitizer judges that process alone at its exit (it failed there with
-- "detected memory leaks" on the old binary); the plain build measures the
-- child's resident memory across the calls instead (it grew by about 47 MB
-- on the old binary, under 1 MB now).
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local q = cli.quote

-- A kubeconfig for a server that is never contacted: m:submit only queues.
local KUBECONFIG = [[
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: not-a-secret}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
]]

-- arg[1] kubeconfig, arg[2] calls; prints: calls that raised, the last
-- error, the growth of VmRSS (KiB) over the measured calls, and how many
-- requests the batch holds.
local CHILD = [[
local transport = require "cozy.transport"
local kubeconfig, calls = arg[1], tonumber(arg[2])
local t = assert(transport.new { kubeconfig = kubeconfig })
local m = t:multi { concurrency = 1 }
local opts = setmetatable({}, { __index = function(_, k)
  if k == "retry_safe" then error("options refused: " .. k, 0) end
end })
local function rss_kib()
  for line in io.lines("/proc/self/status") do
    local kib = line:match("^VmRSS:%s*(%d+) kB")
    if kib then return tonumber(kib) end
  end
end
local raised, last = 0, nil
local function round(n)
  for _ = 1, n do
    local ok, err = pcall(m.submit, m, "GET", "/api/v1/namespaces", opts)
    if not ok then raised, last = raised + 1, err end
  end
  collectgarbage("collect")
end
round(calls // 10) -- the heap's working size, before measuring
local before = rss_kib()
round(calls)
io.write(raised, "\t", last, "\t", rss_kib() - before, "\t", m:pending(), "\n")
]]

local function sanitized(bin)
  local res = cli.shell("ldd " .. q(bin))
  return res.stdout:find("libasan", 1, true) ~= nil
end

describe("core/transport_multi.c: m:submit whose options raise", function()
  local dir
  setup(function()
    dir = cli.tmpdir()
    files.write(dir .. "/kubeconfig", KUBECONFIG)
    files.write(dir .. "/child.lua", CHILD)
  end)
  teardown(function() os.execute("rm -rf " .. q(dir)) end)

  it("strands nothing: no leak at exit (ASan) and no resident growth over 200,000 calls", function()
    local asan = sanitized(cli.bin)
    -- ASan's quarantine keeps freed blocks resident, so there the leak
    -- checker is the judge, over fewer calls
    local calls = asan and 20000 or 200000
    local res = cli.run({ "lua", dir .. "/child.lua", dir .. "/kubeconfig", tostring(calls) },
      { ASAN_OPTIONS = "detect_leaks=1:exitcode=23" })
    assert.not_matches("LeakSanitizer", res.stderr)
    assert.equal(0, res.code, res.stderr)
    local raised, last, growth, pending = res.stdout:match("^(%d+)\t([^\t]*)\t(%-?%d+)\t(%d+)\n$")
    assert.truthy(raised, "unexpected child output: " .. res.stdout)
    -- the fault fired on every call, and no request was queued by one
    assert.equal(calls + calls // 10, tonumber(raised))
    assert.equal("options refused: retry_safe", last)
    assert.equal(0, tonumber(pending))
    if not asan then
      -- 200,000 stranded jobs are about 47 MB; the heap's own noise is far below 8 MiB
      assert.is_true(tonumber(growth) < 8 * 1024, "VmRSS grew by " .. growth .. " KiB")
    end
  end)
end)
