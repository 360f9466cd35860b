-- Issue 23, class 2: legacy scripts that outlive their limits. Each script
-- runs in its own process group under the step's time limit; the whole group
-- is stopped on that limit, on SIGTERM and once the script exits; it inherits
-- none of the engine's descriptors; output of any size and shape is read in
-- bounded pieces.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local STAMP = [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}' >/dev/null]]

-- A directory holding one executable legacy script `1-<name>`, and a file
-- path inside it where the script may leave pids.
local function script_dir(name, body)
  local dir = cli.tmpdir()
  files.write(dir .. "/1-" .. name, "#!/bin/sh\n" .. body .. "\n")
  assert(files.sh("chmod +x " .. cli.quote(dir .. "/1-" .. name)) == 0)
  return dir
end

local function alive(pid)
  return files.sh(("kill -0 %d 2>/dev/null"):format(pid)) == 0
end

describe("hostile legacy scripts", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  it("stops a script at --step-timeout, with everything it started", function()
    local dir = script_dir("sleeps", 'sleep 600 &\necho $! >>pids\necho $$ >>pids\nexec sleep 600')
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(cli.args(srv, dir, "run", "--step-timeout", "2"))
    finally(function() p:cleanup() end)
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("legacy script [^ ]*/1%-sleeps ran past its time limit of 2s: its process group was stopped "
      .. "%(it was killed by signal 15%); version stays at 1: a rerun resumes at 1%-sleeps kind=timeout", r.stderr)
    for _, pid in ipairs(cli.pids(dir .. "/pids", 2)) do assert.is_false(alive(pid), "pid " .. pid .. " survived") end
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("kills a script that ignores SIGTERM at its time limit after the grace", function()
    local dir = script_dir("stubborn", "trap '' TERM\necho $$ >>pids\nwhile :; do sleep 1; done")
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(cli.args(srv, dir, "run", "--step-timeout", "1"))
    finally(function() p:cleanup() end)
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("ran past its time limit of 1s: its process group was stopped %(it was killed by signal 9%)",
      r.stderr)
    assert.is_false(alive(cli.pids(dir .. "/pids", 1)[1]))
  end)

  it("does not wait for a background child the script left (port-forward &), and stops it", function()
    -- the child keeps the script's stdout and stderr open, as `kubectl port-forward &` does
    local dir = script_dir("forwards", "sleep 600 &\necho $! >>pids\necho forwarding\n" .. STAMP)
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(cli.args(srv, dir, "run"))
    finally(function() p:cleanup() end)
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.matches("forwarding", r.stderr)
    assert.matches("lock released", r.stderr)
    assert.equal(2, cli.version(srv))
    assert.is_false(alive(cli.pids(dir .. "/pids", 1)[1]))
  end)

  it("passes SIGTERM to the script's whole group, not just the script", function()
    local dir = script_dir("waits", "sleep 600 &\necho $! >>pids\necho waiting\nwait")
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(cli.args(srv, dir, "run"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("waiting", 1, true) end), p:stderr())
    local child = cli.pids(dir .. "/pids", 1)[1]
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("legacy script [^ ]*/1%-waits stopped by signal 15: it was killed by signal 15; "
      .. "version stays at 1: a rerun resumes at 1%-waits kind=interrupted", r.stderr)
    assert.matches("lock released", r.stderr)
    assert.is_false(alive(child))
    assert.equal(1, cli.version(srv))
  end)

  it("gives the script no descriptor but 0, 1 and 2, and SIGPIPE, SIGTERM, SIGINT unblocked, not ignored", function()
    -- ls runs in a child and writes where the shell writes: the list is of
    -- the shell's descriptors, with none of the listing's own. The signal
    -- state is grep's own, as the shell hands it to every command it runs
    -- (bash, which runs #!/bin/sh scripts, blocks SIGCHLD in itself while it
    -- waits for a child: that is the shell's, not what the runner gave it)
    local dir = script_dir("fds", "ls -l /proc/$$/fd/\ngrep -E '^Sig(Blk|Ign):' /proc/self/status\n" .. STAMP)
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(0, r.code, r.stderr)
    local listed = {}
    for fd, target in r.stderr:gmatch(" (%d+) %-> (%S+)") do
      -- the shell keeps a descriptor on the script it reads
      if target ~= dir .. "/1-fds" then listed[#listed + 1] = tonumber(fd) end
    end
    table.sort(listed)
    assert.same({ 0, 1, 2 }, listed)
    -- /proc's tab comes through the log's output edge escaped, as \t
    assert.matches("SigBlk:\\t0+ ", r.stderr)
    local ignored = tonumber(r.stderr:match("SigIgn:\\t(%x+)"), 16)
    for _, signo in ipairs({ 2, 13, 15 }) do -- SIGINT, SIGPIPE, SIGTERM
      assert.equal(0, ignored & (1 << (signo - 1)), "signal " .. signo .. " ignored")
    end
  end)

  it("delivers a 3 MB line without a newline in bounded pieces, then the lines after it", function()
    local dir = script_dir("floods", "head -c 3000000 /dev/zero | tr '\\0' x\necho\necho after the flood\n" .. STAMP)
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(0, r.code, r.stderr:sub(1, 2000))
    local total, pieces, longest = 0, 0, 0
    -- the flood's pieces only: an "x" or two in a temporary path on the same
    -- lines is not the script's output
    for run in r.stderr:gmatch("x+") do
      if #run >= 100 then total, pieces, longest = total + #run, pieces + 1, math.max(longest, #run) end
    end
    assert.equal(3000000, total)
    assert.equal(65536, longest)
    assert.equal(math.ceil(3000000 / 65536), pieces)
    assert.matches("after the flood", r.stderr)
  end)
end)
