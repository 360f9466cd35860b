-- Issue 23, class 6: signals and file descriptors. A stop is honoured
-- wherever the runner is, its own requests and their retry waits included;
-- a closed or broken output never kills a run holding the lock; closed
-- standard descriptors are never reused for a socket.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local q = cli.quote

local NOOP = [[return { description = "does nothing", run = function(ctx) ctx.log:info("step ran") end }]]

-- An executable legacy script `name` in dir.
local function script(dir, name, body)
  files.write(dir .. "/" .. name, "#!/bin/sh\n" .. body .. "\n")
  assert(files.sh("chmod +x " .. q(dir .. "/" .. name)) == 0)
end

-- The shell words of `cozy-migrate args...`, with the host variables that
-- would change a run unset (as cli.run does).
local function command(args)
  local words = { "env -u NAMESPACE -u TARGET_VERSION -u CURRENT_VERSION -u POD_NAME", q(cli.bin) }
  for _, a in ipairs(args) do words[#words + 1] = q(a) end
  return table.concat(words, " ")
end

describe("hostile signals and descriptors", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  -- SIGTERM once the rule has fired: the run must stop within the retry
  -- wait, fail (exit 1) naming the signal, and still release the lock.
  local function stopped_during(rule, dir)
    srv:faults { rule }
    local p = cli.start(cli.args(srv, dir, "run"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(30, function() return #srv:fired() > 0 end), p:stderr())
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    return r
  end

  it("honours SIGTERM while the stamp's PATCH is retried after 503 Retry-After: 5", function()
    local dir = cli.migration_dir { ["1-noop.lua"] = NOOP }
    finally(function() files.rm_rf(dir) end)
    local r = stopped_during({ method = "PATCH", path = "configmaps/cozystack-version", times = 3,
      status = { code = 503, retry_after = 5 } }, dir)
    assert.matches("step ran", r.stderr)
    assert.matches("run stopped by signal 15 %(PATCH [^ ]*/configmaps/cozystack%-version: Interrupted.*%) kind=interrupted", r.stderr)
    -- the stamp met one 503; the failed attempt's record (best effort, two
    -- attempts) met the other two, and only a WARN says so
    assert.same({ "status", "status", "status" }, srv:fired { method = "PATCH" })
    assert.matches("WARN  the failed attempt could not be recorded in the history: PATCH [^ ]*/configmaps/"
      .. "cozystack%-version: ServiceUnavailable %(503%)", r.stderr)
    assert.equal(1, cli.version(srv))
    assert.matches("lock released", r.stderr)
    assert.equal("", cli.lease_holder(srv))
  end)

  it("honours SIGTERM while the Lease create is retried after 429 Retry-After: 5", function()
    local dir = cli.migration_dir { ["1-noop.lua"] = NOOP }
    finally(function() files.rm_rf(dir) end)
    local r = stopped_during({ method = "POST", path = "leases", times = 3,
      status = { code = 429, retry_after = 5 } }, dir)
    assert.matches("run stopped by signal 15 %(POST [^ ]*/leases: Interrupted.*%) kind=interrupted", r.stderr)
    assert.same({ "status" }, srv:fired { method = "POST" })
    assert.not_matches("step ran", r.stderr)
    assert.is_nil(cli.lease_holder(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("survives `run 2>&1 | head -3`: the run completes and releases the lock (no SIGPIPE)", function()
    local dir = cli.tmpdir()
    finally(function() files.rm_rf(dir) end)
    -- far more than a pipe holds, so that most of it is written after head has gone
    script(dir, "1-chatty", "i=0\nwhile [ $i -lt 5000 ]; do echo \"line $i of a chatty legacy script\"; "
      .. "i=$((i+1)); done\n"
      .. [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}']])
    local r = cli.shell(("{ %s 2>&1; echo $? >%s; } | head -3"):format(
      command(cli.args(srv, dir, "run")), q(dir .. "/rc")))
    assert.equal(3, #cli.lines(r.stdout))
    assert.equal("0", (files.read(dir .. "/rc") or ""):match("%d+"), r.stdout)
    assert.equal(2, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("survives an output whose reader is gone before the run starts", function()
    local dir = cli.tmpdir()
    finally(function() files.rm_rf(dir) end)
    script(dir, "1-stamps",
      [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}']])
    -- a pipe with no reader as stdout and stderr; SIGPIPE back at its default, as a shell leaves it
    local py = "import os, signal, sys; signal.signal(signal.SIGPIPE, signal.SIG_DFL); r, w = os.pipe(); "
      .. "os.close(r); os.dup2(w, 1); os.dup2(w, 2); os.execvp(sys.argv[1], sys.argv[1:])"
    local argv = { cli.bin }
    for _, a in ipairs(cli.args(srv, dir, "run")) do argv[#argv + 1] = a end
    local words = {}
    for i, a in ipairs(argv) do words[i] = q(a) end
    local r = cli.shell(("%s -c %s %s"):format(q(fake.python), q(py), table.concat(words, " ")))
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  -- The script records what the runner (its parent) has as fd 0-2.
  local function run_closed(closing)
    local dir = cli.tmpdir()
    script(dir, "1-looks", "for fd in 0 1 2; do readlink /proc/$PPID/fd/$fd >>runner-fds; done\n"
      .. [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}']])
    local r = cli.shell(("%s %s"):format(command(cli.args(srv, dir, "run")), closing))
    local fds = cli.lines(files.read(dir .. "/runner-fds") or "")
    files.rm_rf(dir)
    return r, fds
  end

  it("with stdin, stdout and stderr closed, no socket becomes fd 0-2", function()
    local r, fds = run_closed("<&- >&- 2>&-")
    assert.equal(0, r.code)
    assert.same({ "/dev/null", "/dev/null", "/dev/null" }, fds)
    assert.equal(2, cli.version(srv))
    for _, e in ipairs(srv:requests()) do assert.are_not.equal(400, e.status, e.method .. " " .. e.path) end
  end)

  it("with only stderr closed, the log does not go into a socket", function()
    local r, fds = run_closed("2>&-")
    assert.equal(0, r.code)
    assert.equal("/dev/null", fds[3])
    assert.equal(2, cli.version(srv))
  end)
end)
