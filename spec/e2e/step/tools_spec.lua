-- A migration's declared tools (issue 38, item 2): `tools = { ... }` in its
-- table, found on PATH at discovery (missing: refused, exit 2), run by
-- ctx.tool with an argument vector and the step's kubeconfig, in its own
-- process group under the step's limit, stopped with the step; its output
-- logged with credentials redacted; in plan and check only the invocations
-- marked as the tool's own dry run run (a rehearsal's isolated), others are
-- refused and the plan says so. The tool is a test double: a shell script in
-- a directory put on PATH that records its argv and writes with kubectl.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local q = cli.quote

-- the stand-in for etcd-migrate: records its argv, acts on its first argument
local DOUBLE = [[#!/bin/sh
{ printf 'argv:'; for a in "$@"; do printf ' [%s]' "$a"; done; printf '\n'; } >>"$TOOL_DIR/calls"
case "$1" in
  adopt)
    printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s"},"data":{"by":"etcd-double"}}' "${2:-adopted}" \
      | "$KUBECTL" -n "$NAMESPACE" create -f - >/dev/null || exit 4
    echo '{"adopted":3}' ;;
  fail) echo "adopting member 2"; echo "error: member etcd-2 not healthy" >&2; exit 3 ;;
  hang) sleep 600 & echo $! >>"$TOOL_DIR/pids"; echo $$ >>"$TOOL_DIR/pids"; echo hanging; wait ;;
  leak)
    echo "token Bearer s3cr3t-t0ken-value"
    echo "Authorization: Basic dXNlcjpodW50ZXIy" >&2
    echo "endpoint https://admin:hunter2@etcd:2379" ;;
  kubeconfig) echo "server $("$KUBECTL" config view -o jsonpath='{.clusters[0].cluster.server}')"; echo "ns $NAMESPACE" ;;
  flagged)
    # as etcd-migrate: only the kubeconfig file its --kubeconfig names, never $KUBECONFIG
    kc=""; shift
    while [ $# -gt 0 ]; do
      case "$1" in --kubeconfig) kc=$2; shift ;; --kubeconfig=*) kc=${1#*=} ;; esac
      shift
    done
    [ -r "$kc" ] || { echo "no kubeconfig file: [$kc]" >&2; exit 5; }
    unset KUBECONFIG
    echo "flag server $("$KUBECTL" --kubeconfig="$kc" config view -o jsonpath='{.clusters[0].cluster.server}')"
    echo "flag reached $("$KUBECTL" --kubeconfig="$kc" -n cozy-system get configmap cozystack-version -o name)" ;;
esac
]]

local PERMS = [[permissions = { { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" },
    { verb = "create", group = "", resource = "configmaps", namespace = "cozy-system" } },]]

-- A migrations directory with 1-<name>.lua holding `body` (the table's
-- fields after description), and a bin directory with the double as
-- etcd-double. Returns dir, the env for cozy-migrate.
local function setup_dir(name, body)
  local dir = cli.tmpdir()
  assert(files.sh(("mkdir -p %s %s"):format(q(dir .. "/migrations"), q(dir .. "/bin"))) == 0)
  files.write(dir .. "/migrations/1-" .. name .. ".lua", ("return {\n  description = %q,\n  %s\n}\n")
    :format(name, body))
  files.write(dir .. "/bin/etcd-double", DOUBLE)
  assert(files.sh("chmod +x " .. q(dir .. "/bin/etcd-double")) == 0)
  local env = { PATH = dir .. "/bin:" .. os.getenv("PATH"), TOOL_DIR = dir,
    KUBECTL = files.absolute(fake.kubectl_path) }
  return dir, env
end

local function args(srv, dir, ...)
  return cli.args(srv, dir .. "/migrations", ...)
end

local function cm(srv, name)
  return srv:object("ConfigMap", "cozy-system", name)
end

describe("declared tools", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  it("runs a tool with an argument vector (no shell) and the step's kubeconfig; its stdout captured", function()
    local dir, env = setup_dir("adopt", PERMS .. [[
  tools = { "etcd-double" },
  run = function(ctx)
    local r = ctx:tool("etcd-double", { "adopt", "adopted", "two words", "$(touch pwned)", ";", "*" }, { capture = true })
    ctx:outcome { status = r.status, adopted = r.stdout:match('"adopted":(%d+)') }
    ctx:tool("etcd-double", { "kubeconfig" })
  end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    assert.equal("argv: [adopt] [adopted] [two words] [$(touch pwned)] [;] [*]\nargv: [kubeconfig]\n",
      files.read(dir .. "/calls"))
    assert.is_nil(files.read("pwned"))
    assert.equal("etcd-double", cm(srv, "adopted").data.by)
    -- its kubeconfig is the engine's one cluster and namespace
    assert.matches("server " .. srv.url:gsub("%p", "%%%0"), r.stderr)
    assert.matches("ns cozy-system", r.stderr, 1, true)
    assert.matches("running tool.*tool=etcd%-double", r.stderr)
    assert.equal(2, cli.version(srv))
    local rec = cli.history(cm(srv, "cozystack-version"))[1]
    assert.same({ status = 0, adopted = "3" }, rec.outcome.counts)
  end)

  it("refuses a migration whose tool is not on PATH (exit 2); list and check name it", function()
    local dir, env = setup_dir("missing", [[tools = { "etcd-double", "etcd-migrate-nowhere" },
  run = function(ctx) ctx:tool("etcd-double", { "adopt" }) end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(2, r.code, r.stderr)
    assert.matches("1%-missing%.lua: declared tool etcd%-migrate%-nowhere not found in PATH", r.stderr)
    assert.is_nil(files.read(dir .. "/calls"))
    assert.equal(1, cli.version(srv))
    local l = cli.run(args(srv, dir, "list"), env)
    assert.equal(0, l.code, l.stderr)
    assert.matches("\n     tool etcd-double (" .. dir .. "/bin/etcd-double)\n", l.stdout, 1, true)
    assert.matches("\n     tool etcd-migrate-nowhere (missing)\n", l.stdout, 1, true)
    local c = cli.run(args(srv, dir, "check"), env)
    assert.equal(1, c.code, c.stdout .. c.stderr)
    assert.matches("declared tool etcd%-migrate%-nowhere not found in PATH", c.stdout)
  end)

  it("kubeconfig_flag puts the step's kubeconfig file in argv: --flag PATH or --flag=PATH", function()
    local dir, env = setup_dir("flag", PERMS .. [[
  tools = { "etcd-double" },
  run = function(ctx)
    ctx:tool("etcd-double", { "flagged" }, { kubeconfig_flag = "--kubeconfig" })
    ctx:tool("etcd-double", { "flagged" }, { kubeconfig_flag = "--kubeconfig=" })
  end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    local calls = files.read(dir .. "/calls")
    local spaced, joined = calls:match("^argv: %[flagged%] %[%-%-kubeconfig%] %[([^]]+)%]\n"
      .. "argv: %[flagged%] %[%-%-kubeconfig=([^]]+)%]\n$")
    assert.is_not_nil(spaced, calls)
    assert.is_not_nil(joined, calls)
    -- a file of the step's own, which reached the step's server, removed once the tool ended
    local _, servers = r.stderr:gsub("flag server " .. srv.url:gsub("%p", "%%%0"), "")
    assert.equal(2, servers, r.stderr)
    local _, reached = r.stderr:gsub("flag reached configmap/cozystack%-version", "")
    assert.equal(2, reached, r.stderr)
    assert.is_nil(files.read(spaced))
    assert.is_nil(files.read(joined))
  end)

  it("kubeconfig_flag in a rehearsal: the file names the overlay endpoint, as a legacy script's", function()
    local dir, env = setup_dir("flagplan", PERMS .. [[
  tools = { "etcd-double" },
  run = function(ctx)
    ctx:tool("etcd-double", { "flagged" }, { dry_run = true, kubeconfig_flag = "--kubeconfig" })
  end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "plan"), env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local server = r.stderr:match("flag server (%S+)")
    assert.is_not_nil(server, r.stderr)
    assert.not_equal(srv.url, server)
    assert.matches("flag reached configmap/cozystack-version", r.stderr, 1, true)
  end)

  it("refuses a malformed kubeconfig_flag before the tool runs", function()
    for _, bad in ipairs { "'--kube config'", "true", "'kubeconfig'", "'--kubeconfig==x'" } do
      local dir, env = setup_dir("badflag", ([[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "flagged" }, { kubeconfig_flag = %s }) end,]]):format(bad))
      local r = cli.run(args(srv, dir, "run"), env)
      assert.equal(1, r.code, r.stderr)
      assert.matches("option kubeconfig_flag must be a command-line option", r.stderr, 1, true)
      assert.is_nil(files.read(dir .. "/calls"))
      files.rm_rf(dir)
    end
  end)

  it("a tool's declared access: granted by rbac, shown by list and check, judged in a rehearsal", function()
    local dir, env = setup_dir("access", [[
  tools = { ["etcd-double"] = { "get,create configmaps -n cozy-system", "list etcdclusters.etcd.aenix.io" } },
  run = function(ctx) ctx:tool("etcd-double", { "adopt", "rehearsed" }, { dry_run = true }) end,]])
    finally(function() files.rm_rf(dir) end)
    -- the rehearsed tool's create is covered by its access alone (no `permissions`)
    local r = cli.run(args(srv, dir, "plan"), env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("object created: ConfigMap cozy-system/rehearsed", r.stdout, 1, true)
    local may = "may get,create configmaps -n cozy-system, list etcdclusters.etcd.aenix.io"
    local l = cli.run(args(srv, dir, "list"), env)
    assert.equal(0, l.code, l.stderr)
    assert.matches("     tool etcd-double (" .. dir .. "/bin/etcd-double); " .. may .. "\n", l.stdout, 1, true)
    local c = cli.run(args(srv, dir, "check"), env)
    assert.matches("tools: etcd-double (" .. dir .. "/bin/etcd-double); " .. may, c.stdout, 1, true)
    local rb = cli.run(args(srv, dir, "rbac", "-o", "json"), env)
    assert.equal(0, rb.code, rb.stderr)
    assert.matches('"resources":["configmaps"]', rb.stdout:gsub("%s", ""), 1, true)
    assert.matches('"resources":["etcdclusters"]', rb.stdout:gsub("%s", ""), 1, true)
  end)

  it("refuses a tool's access line it cannot read, naming it (exit 2)", function()
    for line, why in pairs {
      ['"get"'] = 'tools.etcd-double[1]: "VERBS RESOURCE [-n NAMESPACE]"',
      ['"get pvc"'] = "tools.etcd-double[1]: a resource name as kubectl takes it: pvc",
      ['"Get pods"'] = 'tools.etcd-double[1]: a verb is a lowercase word: "Get"',
      ['"get pods in x"'] = 'tools.etcd-double[1]: "VERBS RESOURCE [-n NAMESPACE]"',
      ["42"] = 'tools.etcd-double[1]: a string "VERBS RESOURCE [-n NAMESPACE]"',
    } do
      local dir, env = setup_dir("badaccess", ([[tools = { ["etcd-double"] = { %s } },
  run = function() end,]]):format(line))
      local r = cli.run(args(srv, dir, "list"), env)
      assert.equal(2, r.code, r.stderr)
      assert.matches(why, r.stderr, 1, true)
      files.rm_rf(dir)
    end
  end)

  it("refuses a tool found through a relative PATH element, as the exec plugin's lookup does", function()
    local dir, env = setup_dir("relative", [[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "adopt" }) end,]])
    finally(function() files.rm_rf(dir) end)
    env.PATH = "bin:" .. os.getenv("PATH")
    local r = cli.shell(("cd %s && env PATH=%s TOOL_DIR=%s %s run --kubeconfig %s --no-builtin --migrations migrations")
      :format(q(dir), q(env.PATH), q(dir), q(files.absolute(cli.bin)), q(files.absolute(srv.kubeconfig))))
    assert.equal(2, r.code, r.stderr)
    assert.matches("declared tool etcd%-double found in PATH as bin/etcd%-double, relative to the current "
      .. "directory", r.stderr)
    assert.is_nil(files.read(dir .. "/calls"))
  end)

  it("refuses a bad declaration and an undeclared or malformed call", function()
    local dir, env = setup_dir("bad", [[tools = { "../bin/etcd-double" }, run = function() end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "list"), env)
    assert.equal(2, r.code, r.stderr)
    assert.matches("tools%[1%] must be a command name", r.stderr)
    files.write(dir .. "/migrations/1-bad.lua", [[return { description = "d", tools = { "etcd-double" },
      run = function(ctx) ctx:tool("kubectl", { "get", "pods" }) end }]])
    r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches("ctx.tool: kubectl is not declared in the migration's tools", r.stderr, 1, true)
    files.write(dir .. "/migrations/1-bad.lua", [[return { description = "d", tools = { "etcd-double" },
      run = function(ctx) ctx:tool("etcd-double", { "adopt", "a\0b" }) end }]])
    r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches("argv[2] must be a string without NUL bytes", r.stderr, 1, true)
    assert.is_nil(files.read(dir .. "/calls"))
  end)

  it("fails the step when the tool fails, quoting its last stderr line; the version stays", function()
    local dir, env = setup_dir("fails", [[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "fail" }) end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches('tool etcd%-double exited with status 3, its last stderr line: "error: member etcd%-2 not '
      .. 'healthy"; version stays at 1', r.stderr)
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
    -- allow_failure: the status is the migration's to judge
    files.write(dir .. "/migrations/1-fails.lua", [[return { description = "d", tools = { "etcd-double" },
      run = function(ctx)
        local r = ctx:tool("etcd-double", { "fail" }, { allow_failure = true })
        ctx:outcome { status = r.status }
      end }]])
    r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    local history = cli.history(cm(srv, "cozystack-version"))
    assert.same({ status = 3 }, history[#history].outcome.counts)
  end)

  it("stops a hanging tool at the step's time limit, with everything it started", function()
    local dir, env = setup_dir("hangs", [[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "hang" }) end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run", "--step-timeout", "2"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1%-hangs ran past its time limit of 2s during tool etcd%-double: its process group was "
      .. "stopped; version stays at 1", r.stderr)
    for _, pid in ipairs(cli.pids(dir .. "/pids", 2)) do assert.is_false(cli.alive(pid), "pid " .. pid .. " survived") end
    assert.equal(1, cli.version(srv))
    assert.equal("", cli.lease_holder(srv))
  end)

  it("stops the tool's whole group on SIGTERM; the run exits 1 and releases the lock", function()
    local dir, env = setup_dir("stopped", [[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "hang" }) end,]])
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(args(srv, dir, "run"), env)
    finally(function() p:cleanup() end)
    local started = cli.pids(dir .. "/pids", 2)
    assert.truthy(cli.poll(20, function() return p:stderr():find("hanging", 1, true) end), p:stderr())
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1%-stopped stopped by signal 15 during tool etcd%-double: its process group was stopped; "
      .. "version stays at 1", r.stderr)
    for _, pid in ipairs(started) do assert.is_false(cli.alive(pid), "pid " .. pid .. " survived") end
    assert.equal("", cli.lease_holder(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("logs the tool's output with credentials redacted", function()
    local dir, env = setup_dir("leaks", [[tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "leak" }) end,]])
    finally(function() files.rm_rf(dir) end)
    for _, format in ipairs({ "text", "json" }) do
      local r = cli.run(args(srv, dir, "run", "--log-format", format), env)
      assert.equal(0, r.code, r.stderr)
      assert.matches("token Bearer ***", r.stderr, 1, true)
      assert.matches("Authorization: ***", r.stderr, 1, true)
      assert.matches("endpoint https://***@etcd:2379", r.stderr, 1, true)
      for _, secret in ipairs({ "s3cr3t", "dXNlcjpodW50ZXIy", "hunter2" }) do
        assert.is_nil(r.stderr:find(secret, 1, true), secret .. " shown")
      end
      srv:reset(cli.fixture(1))
    end
  end)

  it("plan runs only the invocations marked dry_run, isolated; the others are not run and the plan says so", function()
    local dir, env = setup_dir("plans", PERMS .. [[
  tools = { "etcd-double" },
  run = function(ctx)
    ctx:tool("etcd-double", { "adopt", "rehearsed" }, { dry_run = true })
    ctx:tool("etcd-double", { "adopt", "applied" })
  end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "plan"), env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("step 1: 1-plans (lua): not rehearsed: tool etcd-double run without dry-run marking; it was "
      .. "not run", r.stdout, 1, true)
    assert.matches("rehearsal: steps 0 exact, 0 inexact, 1 not rehearsed", r.stdout, 1, true)
    -- the marked one ran, its write kept in the rehearsal's overlay
    assert.equal("argv: [adopt] [rehearsed]\n", files.read(dir .. "/calls"))
    assert.matches("object created: ConfigMap cozy-system/rehearsed", r.stdout, 1, true)
    assert.is_nil(cm(srv, "rehearsed"))
    assert.is_nil(cm(srv, "applied"))
    assert.equal(1, cli.version(srv))
  end)

  it("judges a rehearsed tool's requests by the migration's permissions, as its own", function()
    local dir, env = setup_dir("undeclared", [[
  permissions = { { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" } },
  tools = { "etcd-double" },
  run = function(ctx) ctx:tool("etcd-double", { "adopt", "rehearsed" }, { dry_run = true }) end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "plan"), env)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 (1-undeclared) would fail: migration 1-undeclared sent POST "
      .. "/api/v1/namespaces/cozy-system/configmaps, which its permissions do not declare", r.stdout, 1, true)
    assert.is_nil(r.stdout:find("object created", 1, true))
    assert.is_nil(cm(srv, "rehearsed"))
  end)

  it("check runs only the marked invocations; an unmarked one is a blocking finding", function()
    local dir, env = setup_dir("checks", PERMS .. [[
  tools = { "etcd-double" },
  run = function() end,
  check = function(ctx)
    local r = ctx:tool("etcd-double", { "kubeconfig" }, { dry_run = true, capture = true })
    ctx:finding("info", "tool said " .. r.stdout:match("ns (%S+)"))
    ctx:tool("etcd-double", { "adopt", "checked" })
  end,]])
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "check"), env)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("tool said cozy-system", r.stdout, 1, true)
    assert.matches("tool etcd-double run without dry-run marking: not run in check", r.stdout, 1, true)
    assert.matches("tools: etcd-double (" .. dir .. "/bin/etcd-double)", r.stdout, 1, true)
    assert.equal("argv: [kubeconfig]\n", files.read(dir .. "/calls"))
    assert.is_nil(cm(srv, "checked"))
  end)
end)
