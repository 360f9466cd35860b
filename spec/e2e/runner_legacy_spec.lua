-- Legacy executables run as child processes with today's environment; their
-- output is streamed into the log; the runner verifies their stamp.
local fake = require "spec.support.fake"
local json = require "cozy.json"
local support = require "spec.e2e.runner_support"

describe("runner legacy scripts", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { support.fixture(1) } } end)
  teardown(function() srv:stop() end)

  it("runs a script that stamps with kubectl, streams its output and records it", function()
    srv:reset(support.fixture(1))
    local r = support.run(support.args(srv, "legacy", "run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("legacy 2 running in cozy%-system from 2 to 3", r.stderr)
    assert.matches("WARN  to stderr", r.stderr)
    assert.matches("configmap/runner%-test patched", r.stderr)
    local v, cm = support.version(srv)
    assert.equal(3, v)
    assert.equal("true", cm.metadata.labels["platform.cozystack.io/no-delete"])
    assert.equal("ran", srv:object("ConfigMap", "cozy-system", "runner-test").data.legacy)
    local h = support.history(cm)
    assert.equal(2, #h)
    assert.same({ 2, "2-stamps", "legacy", 2, 3 }, { h[2].number, h[2].name, h[2].kind, h[2].from, h[2].to })
  end)

  it("streams legacy output as JSON log lines with --log-format json", function()
    srv:reset(support.fixture(2, { support.configmap("runner-test", { first = "done" }) }))
    local r = support.run(support.args(srv, "legacy", "run", "--target", "3", "--log-format", "json"))
    assert.equal(0, r.code, r.stderr)
    local found
    for _, line in ipairs(support.lines(r.stderr)) do
      local obj = json.decode(line)
      if obj.msg == "to stderr" then found = obj end
    end
    assert.truthy(found)
    assert.same({ "stderr", "2-stamps" }, { found.stream, found.migration })
  end)

  it("refuses a script that exits 0 without stamping", function()
    srv:reset(support.fixture(3, { support.configmap("runner-test", { first = "done" }) }))
    local r = support.run(support.args(srv, "legacy", "run", "--target", "4"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("legacy 3 ran, forgot to stamp", r.stderr)
    assert.matches("did not stamp 4", r.stderr)
    assert.equal(3, support.version(srv))
  end)

  it("fails closed when a script fails", function()
    local dir = support.tmpdir()
    finally(function() os.execute("rm -rf " .. support.quote(dir)) end)
    local f = assert(io.open(dir .. "/1", "w"))
    f:write("#!/bin/sh\necho failing on purpose\nexit 7\n")
    f:close()
    os.execute("chmod +x " .. dir .. "/1")
    srv:reset(support.fixture(1))
    local r = support.run(support.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("exited with status 7", r.stderr)
    assert.equal(1, support.version(srv))
  end)

  it("plan does not run legacy scripts", function()
    srv:reset(support.fixture(1))
    srv:clear_requests()
    local r = support.run(support.args(srv, "legacy", "plan", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("legacy script .*2%-stamps would run here", r.stdout)
    assert.same({}, support.writes(srv))
  end)
end)
