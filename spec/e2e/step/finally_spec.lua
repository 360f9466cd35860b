-- A migration's compensation (issue 38, item 5): `finally = function(ctx)`
-- runs after the step however it ended (success, failure, its time limit,
-- SIGTERM), with its own deadline and write budget, its writes logged and
-- its end in the history; the lock is held (and renewed) while it runs and
-- released only after it. As 50's EXIT trap scales the etcd operator back
-- up, each migration here "scales down" a stand-in (ConfigMap
-- etcd-operator, replicas) and its finally scales it back up.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local q = cli.quote

local OPERATOR = cli.configmap("etcd-operator", { replicas = "1" })

-- A tool for finally to wait on: it returns once $TOOL_DIR/open exists.
local GATE = [[#!/bin/sh
echo $$ >>"$TOOL_DIR/pids"
echo "gate waiting"
while [ ! -e "$TOOL_DIR/open" ]; do sleep 0.05; done
]]

-- The migration 1-<name>: run scales the operator down, then `body`;
-- finally scales it back up, then `extra`.
local function setup_dir(name, body, extra)
  local dir = cli.tmpdir()
  assert(files.sh(("mkdir -p %s %s"):format(q(dir .. "/migrations"), q(dir .. "/bin"))) == 0)
  files.write(dir .. "/migrations/1-" .. name .. ".lua", ([[return {
  description = "adopts, scaling the operator down meanwhile",
  permissions = { { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" },
    { verb = "patch", group = "", resource = "configmaps", namespace = "cozy-system" },
    { verb = "create", group = "", resource = "configmaps", namespace = "cozy-system" } },
  tools = { "gate-double" },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:merge_patch(ctx.namespace, "etcd-operator", { data = { replicas = "0" } })
    ctx.log:info("operator scaled down")
    %s
  end,
  finally = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:merge_patch(ctx.namespace, "etcd-operator", { data = { replicas = "1" } })
    ctx.log:info("compensating")
    %s
  end,
}
]]):format(body or "", extra or ""))
  files.write(dir .. "/bin/gate-double", GATE)
  assert(files.sh("chmod +x " .. q(dir .. "/bin/gate-double")) == 0)
  return dir, { PATH = dir .. "/bin:" .. os.getenv("PATH"), TOOL_DIR = dir }
end

local function args(srv, dir, ...)
  return cli.args(srv, dir .. "/migrations", ...)
end

local function replicas(srv)
  return srv:object("ConfigMap", "cozy-system", "etcd-operator").data.replicas
end

-- The last record of the version's history.
local function last_record(srv)
  local h = cli.history(srv:object("ConfigMap", "cozy-system", "cozystack-version"))
  return h[#h]
end

-- finally's line comes before the lock's release in the log
local function before_release(stderr, line)
  local at, released = stderr:find(line, 1, true), stderr:find("lock released", 1, true)
  return at ~= nil and released ~= nil and at < released
end

describe("finally", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1, { OPERATOR }) } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1, { OPERATOR })) end)

  it("runs after a failed step: the operator is scaled back up, its write logged and in the history", function()
    local dir, env = setup_dir("fails", 'error("member etcd-2 not healthy")')
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches("member etcd-2 not healthy; version stays at 1", r.stderr, 1, true)
    assert.equal("1", replicas(srv))
    assert.matches("finally write method=PATCH [^\n]*path=/api/v1/namespaces/cozy%-system/configmaps/etcd%-operator "
      .. "phase=finally write=1", r.stderr)
    assert.is_true(before_release(r.stderr, "finally done"), r.stderr)
    local rec = last_record(srv)
    assert.equal("failed", rec.result)
    assert.same({ after = "migration", ended = "done", writes = 1 }, rec.finally)
    assert.equal(1, cli.version(srv))
  end)

  it("runs after a successful step too (as an EXIT trap does)", function()
    local dir, env = setup_dir("succeeds")
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    assert.equal("1", replicas(srv))
    assert.equal(2, cli.version(srv))
    assert.same({ after = "success", ended = "done", writes = 1 }, last_record(srv).finally)
  end)

  it("runs after the step's time limit", function()
    local dir, env = setup_dir("times-out", "while true do end")
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run", "--step-timeout", "1"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-times-out ran past its time limit of 1s", r.stderr, 1, true)
    assert.equal("1", replicas(srv))
    assert.same({ after = "timeout", ended = "done", writes = 1 }, last_record(srv).finally)
  end)

  it("runs after SIGTERM: its writes are sent though a stop is due, the run still stops", function()
    local dir, env = setup_dir("stopped", "while true do end")
    finally(function() files.rm_rf(dir) end)
    local p = cli.start(args(srv, dir, "run"), env)
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("operator scaled down", 1, true) end))
    assert.equal("0", replicas(srv))
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-stopped stopped by signal 15", r.stderr, 1, true)
    assert.equal("1", replicas(srv))
    assert.is_true(before_release(r.stderr, "finally done"), r.stderr)
    assert.equal("", cli.lease_holder(srv))
    local rec = last_record(srv)
    assert.equal("interrupted", rec.error.kind)
    assert.same({ after = "interrupted", ended = "done", writes = 1 }, rec.finally)
  end)

  it("is bounded by its own deadline: a finally that does not end fails the step", function()
    local dir, env = setup_dir("hangs", nil, "while true do end")
    finally(function() files.rm_rf(dir) end)
    env.COZY_MIGRATE_FINALLY_SECONDS = "1"
    local t0 = os.time()
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.is_true(os.time() - t0 < 20)
    assert.matches("1-hangs: the step succeeded but its finally failed: 1-hangs's finally ran past its time "
      .. "limit of 1s", r.stderr, 1, true)
    assert.equal("1", replicas(srv))
    -- the version stays: the next run runs the step and its finally again
    assert.equal(1, cli.version(srv))
    local rec = last_record(srv)
    assert.equal("failed", rec.result)
    assert.matches("^1%-hangs's finally ran past its time limit of 1s %(at [^)]*1%-hangs%.lua:17%)$", rec.finally.error)
    rec.finally.error = nil
    assert.same({ after = "success", ended = "timeout", writes = 1 }, rec.finally)
  end)

  it("is bounded by its write budget: the write past it is refused, unsent, even if caught", function()
    local creates = [[for i = 1, 25 do
      pcall(cms.create, cms, { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "f-" .. i, namespace = ctx.namespace } })
    end]]
    local dir, env = setup_dir("spends", 'error("adoption failed")', creates)
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    -- the step's own error stays the run's
    assert.matches("adoption failed; version stays at 1", r.stderr, 1, true)
    assert.matches("finally failed: 1-spends's finally: write budget of 20 writes spent: POST "
      .. "/api/v1/namespaces/cozy-system/configmaps refused, not sent", r.stderr, 1, true)
    -- 1 patch and 19 creates were sent, nothing after them
    for i = 1, 25 do
      local o = srv:object("ConfigMap", "cozy-system", "f-" .. i)
      if i <= 19 then assert.truthy(o, "f-" .. i) else assert.is_nil(o, "f-" .. i) end
    end
    local rec = last_record(srv).finally
    assert.equal("over budget", rec.ended)
    assert.equal(20, rec.writes)
    assert.equal("1", replicas(srv))
  end)

  it("holds and renews the lock while it runs; a second SIGTERM stops it, its tool with it", function()
    local dir, env = setup_dir("second", "while true do end", 'ctx:tool("gate-double")')
    finally(function() files.rm_rf(dir) end)
    env.COZY_MIGRATE_LEASE_SECONDS = "3"
    local p = cli.start(args(srv, dir, "run"), env)
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(20, function() return p:stderr():find("operator scaled down", 1, true) end))
    p:kill("TERM")
    assert.truthy(cli.poll(20, function() return p:stderr():find("gate waiting", 1, true) end), p:stderr())
    assert.equal("1", replicas(srv))
    -- the Lease is ours while finally runs, and renewed meanwhile
    local lease = cli.get_lease(srv)
    assert.truthy(lease.spec.holderIdentity ~= "", "the lock was released before finally ended")
    local renewed = lease.spec.renewTime
    assert.truthy(cli.poll(10, function()
      local now = cli.get_lease(srv).spec
      return now.renewTime ~= renewed and now.holderIdentity == lease.spec.holderIdentity
    end), "the Lease was not renewed while finally ran")
    local pid = tonumber((files.read(dir .. "/pids") or ""):match("%d+"))
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("finally failed: 1-second's finally stopped by signal 15 during tool gate-double", r.stderr, 1,
      true)
    assert.is_false(cli.alive(pid), "the tool survived")
    assert.equal("", cli.lease_holder(srv))
    local rec = last_record(srv)
    assert.equal("interrupted", rec.error.kind)
    assert.equal("interrupted", rec.finally.ended)
    assert.equal("1", replicas(srv))
  end)

  it("killed (SIGKILL) during finally: its tool goes with the runner, the next run runs step and finally again", function()
    local dir, env = setup_dir("killed", nil, 'ctx:tool("gate-double")')
    finally(function() files.rm_rf(dir) end)
    env.COZY_MIGRATE_LEASE_SECONDS = "3"
    local p = cli.start(args(srv, dir, "run"), env)
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(60, function() return p:stderr():find("gate waiting", 1, true) end), p:stderr())
    local first = tonumber((files.read(dir .. "/pids") or ""):match("%d+"))
    p:kill("KILL")
    p:wait(20)
    -- the guardian (core/guardian.c) ends the tool's group with the runner
    assert.truthy(cli.poll(20, function() return not cli.alive(first) end), "the tool outlived its runner")
    assert.equal(1, cli.version(srv))
    files.write(dir .. "/open", "")
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    assert.matches("finally done", r.stderr, 1, true)
    -- the tool ran twice: once per run of finally
    local runs = 0
    for _ in (files.read(dir .. "/pids") or ""):gmatch("%d+") do runs = runs + 1 end
    assert.equal(2, runs)
    assert.equal(2, cli.version(srv))
    assert.equal("1", replicas(srv))
    assert.same({ after = "success", ended = "done", writes = 1 }, last_record(srv).finally)
  end)

  it("is refused when not a function, and is not run by check", function()
    local dir, env = setup_dir("checked")
    finally(function() files.rm_rf(dir) end)
    files.write(dir .. "/migrations/1-checked.lua", [[return { description = "d", run = function() end,
      check = function(ctx) ctx:finding("info", "checked") end,
      finally = function(ctx) ctx.kube:resource("v1", "configmaps"):merge_patch(ctx.namespace, "etcd-operator",
        { data = { replicas = "9" } }) end,
      permissions = { { verb = "patch", group = "", resource = "configmaps" } } }]])
    local r = cli.run(args(srv, dir, "check"), env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal("1", replicas(srv))
    files.write(dir .. "/migrations/1-checked.lua", [[return { description = "d", run = function() end,
      finally = "scale up" }]])
    r = cli.run(args(srv, dir, "list"), env)
    assert.equal(2, r.code, r.stderr)
    assert.matches("finally must be a function(ctx) or absent", r.stderr, 1, true)
  end)
end)

-- docs/authoring.md's "A tool and a compensation", run as printed with a
-- stand-in etcd-migrate: its dry run prints what it would adopt, --apply
-- creates a ConfigMap with the step's kubeconfig (or fails, ETCD_FAIL set).
describe("docs/authoring.md's tool and compensation example", function()
  local ETCD_MIGRATE = [[#!/bin/sh
printf '%s\n' "$*" >>"$TOOL_DIR/calls"
case " $* " in
  *" --apply "*)
    if [ -n "$ETCD_FAIL" ]; then echo "error: member etcd-2 not healthy" >&2; exit 2; fi
    printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"adopted"},"data":{"members":"2"}}' \
      | "$KUBECTL" -n cozy-etcd create -f - >/dev/null || exit 4
    echo "adopted 2" ;;
  *) echo "dry run: would adopt 2" ;;
esac
]]
  local FIXTURE = cli.fixture(1, {
    { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-etcd" } },
    { apiVersion = "apps/v1", kind = "Deployment", metadata = { name = "etcd-operator", namespace = "cozy-etcd" },
      spec = { replicas = 1, selector = { matchLabels = { app = "etcd-operator" } },
        template = { metadata = { labels = { app = "etcd-operator" } },
          spec = { containers = { { name = "operator", image = "etcd-operator:v1" } } } } } },
  })
  local srv, dir, env
  setup(function() srv = fake.start { fixtures = { FIXTURE } } end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:reset(FIXTURE)
    local guide = assert(files.read("docs/authoring.md"))
    local at = assert(guide:find("\n## A tool and a compensation\n", 1, true))
    dir = cli.tmpdir()
    assert(files.sh(("mkdir -p %s %s"):format(q(dir .. "/migrations"), q(dir .. "/bin"))) == 0)
    files.write(dir .. "/migrations/1-etcd-adopt.lua", assert(guide:match("```lua\n(.-)```", at)))
    files.write(dir .. "/bin/etcd-migrate", ETCD_MIGRATE)
    assert(files.sh("chmod +x " .. q(dir .. "/bin/etcd-migrate")) == 0)
    env = { PATH = dir .. "/bin:" .. os.getenv("PATH"), TOOL_DIR = dir, KUBECTL = files.absolute(fake.kubectl_path) }
  end)
  after_each(function() files.rm_rf(dir) end)

  local function operator_replicas()
    return srv:object("Deployment.apps", "cozy-etcd", "etcd-operator").spec.replicas
  end

  it("adopts: the dry run, then --apply; the operator scaled back up; the outcome recorded", function()
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(0, r.code, r.stderr)
    assert.equal("--namespace cozy-etcd\n--namespace cozy-etcd --apply\n", files.read(dir .. "/calls"))
    assert.equal("2", srv:object("ConfigMap", "cozy-etcd", "adopted").data.members)
    assert.equal(1, operator_replicas())
    assert.equal(2, cli.version(srv))
    local rec = last_record(srv)
    assert.same({ adopted = 2 }, rec.outcome.counts)
    assert.same({ after = "success", ended = "done", writes = 1 }, rec.finally)
  end)

  it("a failing tool fails the step; finally scales the operator back up; the version stays", function()
    env.ETCD_FAIL = "1"
    local r = cli.run(args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    assert.matches('tool etcd-migrate exited with status 2, its last stderr line: "error: member etcd-2 not '
      .. 'healthy"; version stays at 1', r.stderr, 1, true)
    assert.equal(1, operator_replicas())
    assert.equal(1, cli.version(srv))
    assert.same({ after = "failed", ended = "done", writes = 1 }, last_record(srv).finally)
  end)

  it("plan runs the dry run and says the --apply is not rehearsed", function()
    local before = cli.stored_versions(srv)
    local r = cli.run(args(srv, dir, "plan"), env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    -- the scale-down and finally's scale-up went out as dry runs only: nothing stored moved
    assert.same(before, cli.stored_versions(srv))
    local sent = {}
    for _, w in ipairs(cli.writes(srv)) do
      if w.path:match("/deployments/etcd%-operator$") then sent[#sent + 1] = tostring(w.query) end
    end
    -- (the second, to an object the rehearsal holds, validated as a dry-run PUT of the overlay's result)
    assert.same({ "dryRun=All", "dryRun=All" }, sent)
    assert.matches("finally done", r.stdout .. r.stderr, 1, true)
    assert.equal("--namespace cozy-etcd\n", files.read(dir .. "/calls"))
    assert.matches("not rehearsed: tool etcd-migrate run without dry-run marking; it was not run", r.stdout, 1, true)
    assert.equal(1, operator_replicas())
    assert.is_nil(srv:object("ConfigMap", "cozy-etcd", "adopted"))
  end)
end)
