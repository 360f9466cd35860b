-- Stops that stop (issue 35, class 3): nothing the runner starts outlives
-- the runner or its stop, and a legacy script never runs while an earlier
-- copy of it may still run. An exec credential plugin re-run mid-run or at
-- the release is killed with its group at once on SIGTERM; SIGHUP stops a
-- run as SIGTERM does; a legacy script's group (and its kubeconfig) goes
-- when the runner is killed with SIGKILL or frozen (its guardian,
-- core/guardian.c), and when the lock it runs under may stop being ours.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local q = cli.quote

local NOOP = [[return { description = "does nothing", run = function(ctx) ctx.log:info("step ran") end }]]
local STAMP = [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}' >/dev/null]]

local function all_gone(list)
  return cli.poll(20, function()
    for _, pid in ipairs(list) do if cli.alive(pid) then return nil end end
    return true
  end)
end

-- An exec plugin in dir: its first run prints a token; each later one (a
-- renewal after a 401) ignores SIGTERM, starts a child that does too,
-- writes both pids to dir/pids and waits for ever.
local function hanging_plugin(dir, url)
  local path = dir .. "/plugin"
  files.write(path, table.concat({
    "#!/bin/sh",
    'echo run >>"$PLUGIN_DIR/runs"',
    'if [ "$(wc -l <"$PLUGIN_DIR/runs")" -ge 2 ]; then',
    "  trap '' TERM",
    "  sleep 600 &",
    '  echo $! >>"$PLUGIN_DIR/pids"',
    '  echo $$ >>"$PLUGIN_DIR/pids"',
    "  wait",
    "fi",
    [[printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t"}}\n']],
    "",
  }, "\n"))
  assert(files.sh("chmod +x " .. q(path)) == 0)
  local kubeconfig = dir .. "/kubeconfig"
  files.write(kubeconfig, table.concat({
    "apiVersion: v1", "kind: Config", "current-context: c",
    "contexts:", "- name: c", "  context: {cluster: k, user: u, namespace: cozy-system}",
    "clusters:", "- name: k", "  cluster: {server: '" .. url .. "'}",
    "users:", "- name: u", "  user:", "    exec:",
    "      command: " .. path,
    "      apiVersion: client.authentication.k8s.io/v1",
    "      interactiveMode: Never",
    "      env: [{name: PLUGIN_DIR, value: '" .. dir .. "'}]", "",
  }, "\n"))
  return kubeconfig
end

-- A directory holding one executable legacy script `1-<name>`.
local function script_dir(name, body)
  local dir = cli.tmpdir()
  files.write(dir .. "/1-" .. name, "#!/bin/sh\n" .. body .. "\n")
  assert(files.sh("chmod +x " .. q(dir .. "/1-" .. name)) == 0)
  return dir
end

-- A script that records each copy of itself: whether an earlier copy was
-- still alive when it started ("overlap"), its pid and its kubeconfig's
-- path; then it stamps when told to (dir/stamp exists), else it waits for
-- ever, ignoring SIGTERM, with a child that ignores it too.
local GUARDED = [[
for p in $(cat pids 2>/dev/null); do
  s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)
  if [ -n "$s" ] && [ "$s" != Z ]; then echo "overlap with $p" >>copies; fi
done
echo "copy $$" >>copies
echo "$KUBECONFIG" >>kubeconfigs
if [ -e stamp ]; then
]] .. STAMP .. [[

  exit 0
fi
trap '' TERM
sleep 600 &
echo $! >>pids
echo $$ >>pids
echo started
wait]]

describe("stops that stop", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  describe("an exec credential plugin that ignores SIGTERM #fakeonly", function()
    local function run_with_plugin(rule)
      local dir = cli.tmpdir()
      local mdir = cli.migration_dir { ["1-noop.lua"] = NOOP }
      local kubeconfig = hanging_plugin(dir, srv.url)
      srv:faults { rule }
      local p = cli.start(cli.with_kubeconfig(cli.args(srv, mdir, "run"), kubeconfig))
      return p, dir, mdir
    end

    it("re-run mid-run (a 401) is killed with its group at once on the runner's SIGTERM", function()
      local p, dir, mdir = run_with_plugin { method = "PATCH", path = "configmaps/cozystack-version$",
        status = 401 }
      finally(function() p:cleanup(); files.rm_rf(dir); files.rm_rf(mdir) end)
      local plugin = cli.pids(dir .. "/pids", 2)
      assert.truthy(plugin, "the plugin was not run again: " .. p:stderr())
      assert.same({ "status" }, srv:fired())
      p:kill("TERM")
      local r = p:wait(30)
      assert.equal(1, r.code, r.stderr)
      assert.matches("exec plugin [^\n]*: stopped by signal 15 %(killed%)", r.stderr)
      assert.truthy(all_gone(plugin), "the plugin or its child outlived the stop")
      assert.equal(1, cli.version(srv))
      assert.matches("lock released", r.stderr)
    end)

    it("re-run at the release is killed with its group at once on SIGTERM", function()
      local p, dir, mdir = run_with_plugin { method = "PATCH", path = "leases/cozystack-migrations$",
        status = 401 }
      finally(function() p:cleanup(); files.rm_rf(dir); files.rm_rf(mdir) end)
      local plugin = cli.pids(dir .. "/pids", 2)
      assert.truthy(plugin, "the plugin was not run again: " .. p:stderr())
      assert.matches("step done, stamped", p:stderr())
      p:kill("TERM")
      local r = p:wait(30)
      assert.matches("could not release the lock %(it will expire%)[^\n]*stopped by signal 15 %(killed%)", r.stderr)
      assert.truthy(all_gone(plugin), "the plugin or its child outlived the stop")
      assert.equal(2, cli.version(srv))
      assert.same({ "status" }, srv:fired())
    end)

    it("run mid-run is killed with its group when the runner is killed with SIGKILL", function()
      local p, dir, mdir = run_with_plugin { method = "PATCH", path = "configmaps/cozystack-version$",
        status = 401 }
      finally(function() p:cleanup(); files.rm_rf(dir); files.rm_rf(mdir) end)
      local plugin = cli.pids(dir .. "/pids", 2)
      assert.truthy(plugin, "the plugin was not run again: " .. p:stderr())
      p:kill("KILL")
      assert.equal(128 + 9, p:wait(10).code)
      assert.truthy(all_gone(plugin), "the plugin or its child outlived the runner")
    end)
  end)

  describe("a legacy script", function()
    it("is stopped with its group on the runner's SIGHUP, which stops the run as SIGTERM does", function()
      local dir = script_dir("guarded", GUARDED)
      finally(function() files.rm_rf(dir) end)
      local p = cli.start(cli.args(srv, dir, "run"))
      finally(function() p:cleanup() end)
      local script = cli.pids(dir .. "/pids", 2)
      assert.truthy(script, p:stderr())
      p:kill("HUP")
      local r = p:wait(30)
      assert.equal(1, r.code, r.stderr)
      assert.matches("legacy script [^ ]*/1%-guarded stopped by signal 1: it was killed by signal %d+", r.stderr)
      assert.matches("lock released", r.stderr)
      assert.truthy(all_gone(script), "the script's group outlived the stop")
      local kubeconfig = cli.lines(files.read(dir .. "/kubeconfigs"))[1]
      assert.is_nil(files.read(kubeconfig), "its kubeconfig stayed: " .. kubeconfig)
      assert.equal(1, cli.version(srv))
    end)

    -- A runner running the guarded script under a 3 s lease, its script's
    -- two pids known: the dir, the env, the runner and the pids.
    local function first_copy()
      local dir = script_dir("guarded", GUARDED)
      finally(function() files.rm_rf(dir) end)
      local env = { COZY_MIGRATE_LEASE_SECONDS = "3" }
      local a = cli.start(cli.args(srv, dir, "run"), env)
      finally(function() a:cleanup() end)
      local first = cli.pids(dir .. "/pids", 2)
      assert.truthy(first, a:stderr())
      return dir, env, a, first
    end

    -- The next runner takes the Lease over and runs the step again; the
    -- script recorded two copies, neither overlapping the other.
    local function second_copy_alone(dir, env)
      local r = cli.run(cli.args(srv, dir, "run", "--lock-timeout", "30"), env)
      assert.equal(0, r.code, r.stderr)
      assert.matches("lock taken over from an expired holder", r.stderr)
      local copies = cli.lines(files.read(dir .. "/copies"))
      assert.equal(2, #copies, files.read(dir .. "/copies"))
      for _, line in ipairs(copies) do assert.not_matches("overlap", line) end
    end

    -- The issue's run: the runner is killed with SIGKILL while its script
    -- runs, the next runner takes the expired Lease and starts the same
    -- step. The first copy (and its kubeconfig) must be gone by then.
    it("does not outlive a runner killed with SIGKILL, nor run twice at once when the next runner takes over", function()
      local dir, env, a, first = first_copy()
      a:kill("KILL")
      assert.equal(128 + 9, a:wait(10).code)
      assert.truthy(all_gone(first), "the script's group outlived the runner")
      local kubeconfig = cli.lines(files.read(dir .. "/kubeconfigs"))[1]
      assert.truthy(cli.poll(10, function() return files.read(kubeconfig) == nil end),
        "its kubeconfig stayed: " .. kubeconfig)
      files.write(dir .. "/stamp", "")
      second_copy_alone(dir, env)
      assert.equal(2, cli.version(srv))
    end)

    -- A runner frozen (SIGSTOP) while its script runs renews its Lease no
    -- more and cannot stop the script itself: the guardian kills the group
    -- by the time the lock is certainly no longer its own, before another
    -- runner may take the Lease over and run the script again.
    it("of a frozen runner is stopped before another runner can take the Lease over", function()
      local dir, env, a, first = first_copy()
      a:kill("STOP")
      files.write(dir .. "/stamp", "")
      second_copy_alone(dir, env)
      assert.is_false(cli.alive(first[1]) or cli.alive(first[2]), "the frozen runner's script still runs")
      assert.equal(2, cli.version(srv))
    end)

    -- Renewals refused while the script runs: the runner stops the script
    -- itself once the lock would count as lost, and fails the run (lost).
    it("is stopped, with its group, when the lock it runs under can no longer be renewed #fakeonly", function()
      local dir = script_dir("guarded", GUARDED)
      finally(function() files.rm_rf(dir) end)
      local p = cli.start(cli.args(srv, dir, "run"), { COZY_MIGRATE_LEASE_SECONDS = "3" })
      finally(function() p:cleanup() end)
      local script = cli.pids(dir .. "/pids", 2)
      assert.truthy(script, p:stderr())
      srv:faults { { method = "PATCH", path = "leases/cozystack-migrations$", times = -1, status = 503 } }
      local r = p:wait(30)
      assert.equal(1, r.code, r.stderr)
      assert.matches("legacy script [^ ]*/1%-guarded stopped: the lock may no longer be ours %(not renewed in "
        .. "time%): its process group was stopped %(it was killed by signal 9%)", r.stderr)
      assert.truthy(all_gone(script), "the script's group outlived the stop")
      assert.truthy(#srv:fired() > 0)
      for _, action in ipairs(srv:fired()) do assert.equal("status", action) end
      assert.equal(1, cli.version(srv))
    end)
  end)
end)
