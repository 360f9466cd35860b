-- Legacy scripts run as child processes with today's environment; their
-- output is streamed into the log; the runner verifies their stamp.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

describe("runner legacy scripts", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  it("runs a script that stamps with kubectl, streams its output and records it", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, "legacy", "run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("legacy 2 running in cozy%-system from 2 to 3", r.stderr)
    assert.matches("WARN  to stderr", r.stderr)
    assert.matches("configmap/runner%-test patched", r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    assert.equal("true", cm.metadata.labels["platform.cozystack.io/no-delete"])
    assert.equal("ran", srv:object("ConfigMap", "cozy-system", "runner-test").data.legacy)
    local h = cli.history(cm)
    assert.equal(2, #h)
    assert.same({ 2, "2-stamps", "legacy", 2, 3 }, { h[2].number, h[2].name, h[2].kind, h[2].from, h[2].to })
  end)

  it("streams legacy output as JSON log lines with --log-format json", function()
    srv:reset(cli.fixture(2, { cli.configmap("runner-test", { first = "done" }) }))
    local r = cli.run(cli.args(srv, "legacy", "run", "--target", "3", "--log-format", "json"))
    assert.equal(0, r.code, r.stderr)
    local found
    for _, line in ipairs(cli.lines(r.stderr)) do
      local obj = json.decode(line)
      if obj.msg == "to stderr" then found = obj end
    end
    assert.truthy(found)
    assert.same({ "stderr", "2-stamps" }, { found.stream, found.migration })
  end)

  it("a script that exits 0 without stamping: recorded and passed by default, refused under --strict-stamp", function()
    srv:reset(cli.fixture(3, { cli.configmap("runner-test", { first = "done" }) }))
    local r = cli.run(cli.args(srv, "legacy", "run", "--target", "4"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("legacy 3 ran, forgot to stamp", r.stderr)
    assert.matches("step did not stamp", r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    assert.equal("unstamped", cli.history(cm)[1].result)
    srv:reset(cli.fixture(3, { cli.configmap("runner-test", { first = "done" }) }))
    r = cli.run(cli.args(srv, "legacy", "run", "--target", "4", "--strict-stamp"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("did not stamp 4 %(version is 3%) and %-%-strict%-stamp is set", r.stderr)
    assert.equal(3, cli.version(srv))
  end)

  it("fails closed when a script fails", function()
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local f = assert(io.open(dir .. "/1", "w"))
    f:write("#!/bin/sh\necho failing on purpose\nexit 7\n")
    f:close()
    os.execute("chmod +x " .. dir .. "/1")
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("exited with status 7", r.stderr)
    assert.equal(1, cli.version(srv))
  end)

  it("passes SIGTERM on to a running script, then stops and releases the lock", function()
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local f = assert(io.open(dir .. "/1-waits", "w"))
    f:write("#!/bin/sh\necho waiting\nexec sleep 60\n")
    f:close()
    os.execute("chmod +x " .. dir .. "/1-waits")
    srv:reset(cli.fixture(1))
    local p = cli.start(cli.args(srv, dir, "run"))
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("waiting", 1, true) end), p:stderr())
    p:kill("TERM")
    local r = p:wait(20)
    assert.equal(1, r.code, r.stderr)
    assert.matches("killed by signal 15", r.stderr)
    assert.matches("lock released", r.stderr)
    assert.equal(1, cli.version(srv))
  end)

  it("plan rehearses legacy scripts in isolation; --server-dry-run does not run them", function()
    srv:reset(cli.fixture(1))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "legacy", "plan", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    -- a rehearsal runs the script in a namespace of its own, served from the overlay: it patches
    -- the ConfigMap step 1 created only there, and its stamp decides the rest (spec/e2e/plan/legacy_rehearsal_spec.lua)
    assert.matches("legacy script .*2%-stamps: rehearsed in a network namespace of its own", r.stdout)
    assert.matches("legacy 2 running", r.stderr)
    assert.matches("PATCH /api/v1/namespaces/cozy%-system/configmaps/runner%-test%?dryRun=All", r.stdout)
    assert.matches("rehearsal: steps 2 exact, 0 inexact, 0 not rehearsed", r.stdout, 1, true)
    for _, w in ipairs(cli.writes(srv)) do assert.matches("dryRun=All", w.query) end
    assert.equal(1, cli.version(srv))
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "runner-test"))
    srv:clear_requests()
    r = cli.run(cli.args(srv, "legacy", "run", "--server-dry-run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("legacy script .*2%-stamps would run here", r.stdout)
    assert.not_matches("legacy 2 running", r.stderr)
    for _, w in ipairs(cli.writes(srv)) do assert.matches("dryRun=All", w.query) end
    assert.equal(1, cli.version(srv))
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "runner-test"))
  end)

  describe("written as the platform writes them", function()
    -- mode 0644 (run-migrations.sh runs chmod +x before each), #!/bin/sh with
    -- pipefail, a lib/ sourced next to the script; "4" is not a file at all
    local dir
    setup(function()
      dir = cli.migration_dir {}
      os.execute("mkdir " .. cli.quote(dir .. "/lib"))
      files.write(dir .. "/lib/stamp.sh", [[
stamp_version() {
  kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p "{\"data\":{\"version\":\"$1\"}}" >/dev/null
}
]])
      files.write(dir .. "/2", [[#!/bin/sh
set -euo pipefail
. "$(dirname "$0")/lib/stamp.sh"
echo "platform style 2 from $CURRENT_VERSION"
stamp_version 3
]])
      files.write(dir .. "/3", [[#!/bin/sh
set -euo pipefail
echo "before the pipeline"
false | cat
echo "pipefail did not stop me"
]])
      os.execute("chmod 0644 " .. cli.quote(dir .. "/2") .. " " .. cli.quote(dir .. "/3")
        .. " && mkdir " .. cli.quote(dir .. "/4"))
    end)
    teardown(function() files.rm_rf(dir) end)

    it("run whatever their mode, sh with pipefail wherever cozy-migrate runs, lib/ next to them", function()
      srv:reset(cli.fixture(2))
      local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir,
        "--target", "3" })
      assert.equal(0, r.code, r.stderr)
      assert.matches("platform style 2 from 2", r.stderr, 1, true)
      assert.equal(3, cli.version(srv))
      -- "4" is outside [2, 3): a warning, not a refusal
      assert.matches("outside the pending range, so not refused: " .. dir .. "/4: is not a regular file",
        r.stderr, 1, true)

      r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir, "--target", "4" })
      assert.equal(1, r.code, r.stderr)
      assert.matches("before the pipeline", r.stderr, 1, true)
      assert.not_matches("pipefail did not stop me", r.stderr, 1, true)
      assert.matches("legacy script " .. dir .. "/3 exited with status 1", r.stderr, 1, true)
      assert.equal(3, cli.version(srv))
    end)

    it("a defect inside the pending range still refuses the set before anything runs", function()
      srv:reset(cli.fixture(3))
      local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir,
        "--target", "5" })
      assert.equal(2, r.code, r.stderr)
      assert.matches(dir .. "/4: is not a regular file", r.stderr, 1, true)
      assert.not_matches("before the pipeline", r.stderr, 1, true)
      assert.equal(3, cli.version(srv))
    end)
  end)
end)
