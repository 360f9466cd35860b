-- A failure an operator can read (issue 26, item 3): the failed attempt's
-- history record, `status` showing it until a later run of that step
-- succeeds, and the run's last line naming the step, the cause, the work
-- done and that a rerun resumes (a legacy step: its last stderr line).
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli

-- The set "partial" at version 2 with vm-1 .. vm-6, vm-5 broken: step 2
-- patches four, then fails.
local function fleet(broken)
  local extra = { cli.configmap("runner-test", { first = "done" }) }
  for i = 1, 6 do
    extra[#extra + 1] = cli.configmap("vm-" .. i, { broken = i == broken and "its disk is gone" or nil })
  end
  return cli.fixture(2, extra)
end

local function last_line(text)
  local lines = cli.lines(text)
  return lines[#lines] or ""
end

describe("a failed step", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { fleet(5) } } end)
  teardown(function() srv:stop() end)

  it("leaves a record of the attempt, its last line says what happened, status shows it until a rerun succeeds",
    function()
    srv:reset(fleet(5))
    local r = cli.run(cli.args(srv, "partial", "run"))
    assert.equal(1, r.code, r.stderr)
    -- the last line: the step, the cause, the work done, the resume
    local line = last_line(r.stderr)
    assert.matches("ERROR migration 2-patches failed: spec/fixtures/runner/partial/2-patches.lua:17: vm-5 is broken: "
      .. "its disk is gone;", line, 1, true)
    assert.matches("done before it failed: patched=4 total=6;", line, 1, true)
    assert.matches("version stays at 2: a rerun resumes at 2-patches", line, 1, true)
    assert.matches("failed attempt recorded in the history", r.stderr, 1, true)

    -- the record: the step, the runner, start and end, the error, the outcome so far
    local v, cm = cli.version(srv)
    assert.equal(2, v)
    local h = cli.history(cm)
    assert.equal(1, #h)
    local f = h[1]
    assert.same({ 2, "2-patches", "lua", 2, 3, "failed", 1 },
      { f.number, f.name, f.kind, f.from, f.to, f.result, f.attempts })
    assert.same({ kind = "migration",
      message = "spec/fixtures/runner/partial/2-patches.lua:17: vm-5 is broken: its disk is gone" }, f.error)
    assert.same({ patched = 4, total = 6 }, f.outcome.counts)
    assert.is_string(f.started); assert.is_string(f.finished); assert.is_string(f.runner)
    assert.equal(64, #f.sha256)

    -- status, text and JSON
    local s = cli.run(cli.args(srv, "partial", "status"))
    assert.equal(0, s.code, s.stderr)
    assert.matches("last failure: 2-patches (2 -> 3) at " .. f.finished .. ", by " .. f.runner .. ", attempt 1",
      s.stdout, 1, true)
    assert.matches("error (migration): spec/fixtures/runner/partial/2-patches.lua:17: vm-5 is broken: its disk is gone",
      s.stdout, 1, true)
    assert.matches("outcome: patched=4 total=6", s.stdout, 1, true)
    assert.matches("a rerun resumes at 2-patches", s.stdout, 1, true)
    assert.matches("2 %-> 3  2%-patches .* FAILED %(attempts: 1%)", s.stdout)
    local st = json.decode(cli.run(cli.args(srv, "partial", "status", "-o", "json")).stdout)
    assert.same({ "2-patches", "failed", "migration" }, { st.last_failure.name, st.last_failure.result,
      st.last_failure.error.kind })
    assert.same({ patched = 4, total = 6 }, st.last_failure.outcome.counts)

    -- failing again keeps one record, counting the attempts
    r = cli.run(cli.args(srv, "partial", "run"))
    assert.equal(1, r.code, r.stderr)
    h = cli.history(select(2, cli.version(srv)))
    assert.same({ 1, 2 }, { #h, h[1].attempts })

    -- repaired, a rerun resumes at the step and succeeds; status no longer shows the failure
    local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/vm-5",
      { body = { data = { broken = json.null } }, content_type = "application/merge-patch+json" })
    assert.equal(200, res.status, res.body)
    r = cli.run(cli.args(srv, "partial", "run"))
    assert.equal(0, r.code, r.stderr)
    v, cm = cli.version(srv)
    assert.equal(3, v)
    h = cli.history(cm)
    assert.same({ "failed", "2-patches" }, { h[1].result, h[2].name })
    assert.is_nil(h[2].result)
    assert.same({ patched = 6, total = 6 }, h[2].outcome.counts)
    s = cli.run(cli.args(srv, "partial", "status"))
    assert.not_matches("last failure", s.stdout, 1, true)
    st = json.decode(cli.run(cli.args(srv, "partial", "status", "-o", "json")).stdout)
    assert.equal(json.null, st.last_failure)
  end)

  it("warns when the record cannot be written, and keeps the step's error and exit status #fakeonly", function()
    srv:reset(fleet(5))
    srv:faults { { method = "PATCH", path = "configmaps/cozystack-version", times = 5,
      status = { code = 403, reason = "Forbidden", message = "no history for you" } } }
    local r = cli.run(cli.args(srv, "partial", "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("WARN  the failed attempt could not be recorded in the history: PATCH "
      .. "/api/v1/namespaces/cozy-system/configmaps/cozystack-version: Forbidden (403): no history for you", r.stderr,
      1, true)
    assert.matches("ERROR migration 2-patches failed: spec/fixtures/runner/partial/2-patches.lua:17: vm-5 is broken",
      last_line(r.stderr), 1, true)
    assert.same({ "status" }, srv:fired())
    assert.same({}, cli.history(select(2, cli.version(srv))))
  end)
end)

describe("a failed legacy step", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  it("quotes the script's last stderr line in the run's last line and its record", function()
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local f = assert(io.open(dir .. "/1-upgrade", "w"))
    f:write("#!/bin/sh\necho 'patching the HelmReleases'\necho 'Error from server (NotFound): helmreleases "
      .. "\"cozy-x\" not found' >&2\necho 'rollback skipped' >&2\necho 'done on stdout'\nexit 2\n")
    f:close()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    local line = last_line(r.stderr)
    assert.matches('ERROR migration 1-upgrade failed: legacy script ' .. dir .. '/1-upgrade exited with status 2, '
      .. 'its last stderr line: "rollback skipped"; version stays at 1: a rerun resumes at 1-upgrade', line, 1, true)
    local h = cli.history(select(2, cli.version(srv)))
    assert.same({ "1-upgrade", "legacy", "failed", "failed" }, { h[1].name, h[1].kind, h[1].result, h[1].error.kind })
    assert.equal('legacy script ' .. dir .. '/1-upgrade exited with status 2, its last stderr line: "rollback skipped"',
      h[1].error.message)
  end)

  it("after a step that left the version, names the version that stays and the step a rerun resumes at", function()
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local function script(name, body)
      local f = assert(io.open(dir .. "/" .. name, "w"))
      f:write("#!/bin/sh\n" .. body)
      f:close()
    end
    script("1-leaves", "echo 'best effort: left for the next upgrade'\n")
    script("2-fails", "echo 'cannot reach the registry' >&2\nexit 1\n")
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches('ERROR migration 2-fails failed: legacy script ' .. dir .. '/2-fails exited with status 1, '
      .. 'its last stderr line: "cannot reach the registry"; version stays at 1: a rerun resumes at 1-leaves',
      last_line(r.stderr), 1, true)
    local v, cm = cli.version(srv)
    assert.equal(1, v)
    local h = cli.history(cm)
    assert.same({ "unstamped", "failed" }, { h[1].result, h[2].result })
    assert.same({ "2-fails", 2, 3 }, { h[2].name, h[2].from, h[2].to })
    local s = cli.run(cli.args(srv, dir, "status"))
    assert.matches("last failure: 2-fails (2 -> 3)", s.stdout, 1, true)
  end)
end)
