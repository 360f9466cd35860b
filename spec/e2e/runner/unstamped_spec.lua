-- The stamp rule (issue 25 item 2, issue 28's "leave the version"): a step
-- that runs to its end but leaves the version where it was. By default the
-- run goes on to the next step, as the platform's run-migrations.sh does
-- (its loop runs every script of the range and checks no stamp), with a
-- WARN line and a history record that says the step did not stamp;
-- --strict-stamp fails the run there instead.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

-- a legacy script N that patches ConfigMap runner-test (data.sN = ran) and
-- stamps `stamps` (nil: exits 0 without stamping, as the platform's
-- best-effort scripts do when some of their patches failed)
local function script(n, stamps)
  local lines = { "#!/bin/sh", "set -euo pipefail",
    ('kubectl -n "$NAMESPACE" patch configmap runner-test --type merge -p \'{"data":{"s%d":"ran"}}\' >/dev/null')
      :format(n) }
  if stamps then
    lines[#lines + 1] = ('kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge '
      .. '-p \'{"data":{"version":"%d"}}\' >/dev/null'):format(stamps)
  else
    lines[#lines + 1] = ('echo "WARN: 1 patch(es) failed; leaving CURRENT_VERSION at %d for retry on next upgrade."')
      :format(n)
  end
  return table.concat(lines, "\n") .. "\n"
end

-- a Lua migration N that records it ran and, with `leave`, leaves the version
local function lua(n, leave)
  return ([[
return {
  description = "step %d",
  permissions = { { verb = "patch", group = "", resource = "configmaps" } },
  run = function(ctx)
    ctx.kube:resource("v1", "configmaps"):merge_patch(ctx.namespace, "runner-test", { data = { s%d = "ran" } })
    ctx:outcome { failed = %s }
    %s
  end,
}
]]):format(n, n, leave and "3" or "0", leave and 'return ctx:leave_version("3 namespaces failed")' or "")
end

local function ran(srv)
  return srv:object("ConfigMap", "cozy-system", "runner-test").data
end

describe("a step that leaves the version", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  local dir
  after_each(function() if dir then files.rm_rf(dir) end dir = nil end)

  local function fixture(version)
    srv:reset(cli.fixture(version, { cli.configmap("runner-test", { first = "done" }) }))
  end

  it("legacy, by default: WARN, a history record that says so, and the run goes on as run-migrations.sh goes on", function()
    dir = cli.migration_dir { ["1-stamps"] = script(1, 2), ["2-leaves"] = script(2), ["3-stamps"] = script(3, 4) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "4"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("WARN  step did not stamp: the version stays, the run goes on to the next step", r.stderr, 1, true)
    assert.matches("reason=\"" .. dir .. "/2-leaves exited 0 without stamping 3\"", r.stderr, 1, true)
    -- the script after the unstamped one ran and stamped its own version, as under run-migrations.sh
    assert.same({ first = "done", s1 = "ran", s2 = "ran", s3 = "ran" }, ran(srv))
    local v, cm = cli.version(srv)
    assert.equal(4, v)
    local h = cli.history(cm)
    assert.equal(3, #h)
    assert.same({ 1, 2 }, { h[1].from, h[1].to })
    assert.is_nil(h[1].result)
    assert.same({ 2, 3, "unstamped", 2, dir .. "/2-leaves exited 0 without stamping 3" },
      { h[2].from, h[2].to, h[2].result, h[2].version, h[2].reason })
    assert.same({ 3, 4 }, { h[3].from, h[3].to })
    assert.is_nil(h[3].result)
    -- the end of the run says which step the next upgrade will not retry
    assert.matches("1 step(s) did not stamp: version is 4, target 4", r.stderr, 1, true)
    assert.matches("stamped_past=2", r.stderr, 1, true)
  end)

  it("legacy, stamping with `kubectl apply` as the platform's lib does: the history and the label stay", function()
    -- the platform's stamp: a labelled manifest applied under kubectl's default field manager
    local function applies(n, stamps)
      if not stamps then return script(n) end
      return script(n, nil):gsub('echo "WARN[^\n]*\n$', "") .. ([[
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: cozystack-version
  namespace: $NAMESPACE
  labels:
    platform.cozystack.io/no-delete: "true"
data:
  version: "%d"
EOF
]]):format(stamps)
    end
    dir = cli.migration_dir { ["1-applies"] = applies(1, 2), ["2-leaves"] = applies(2), ["3-applies"] = applies(3, 4) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "4"))
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(4, v)
    assert.equal("true", cm.metadata.labels["platform.cozystack.io/no-delete"])
    local h = cli.history(cm)
    assert.same({ "1-applies", "2-leaves", "3-applies" }, { h[1].name, h[2].name, h[3].name })
    assert.same({ "unstamped", 2 }, { h[2].result, h[2].version })
    assert.is_nil(h[3].result)
  end)

  it("legacy, last in the range: the version stays and the next run retries it", function()
    dir = cli.migration_dir { ["1-stamps"] = script(1, 2), ["2-leaves"] = script(2) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("retried_next_upgrade=2", r.stderr, 1, true)
    assert.matches("unstamped=1", r.stderr, 1, true)
    local v, cm = cli.version(srv)
    assert.equal(2, v)
    assert.equal("unstamped", cli.history(cm)[2].result)
    local st = cli.run(cli.args(srv, dir, "status", "--target", "3"))
    assert.equal(0, st.code, st.stderr)
    assert.matches("2 -> 3  2-leaves", st.stdout, 1, true)
    assert.matches("        not stamped: the version stayed at 2 (" .. dir .. "/2-leaves exited 0 without stamping 3)",
      st.stdout, 1, true)
    -- the next upgrade: the version is 2, so 2 runs again (and now stamps)
    files.write(dir .. "/2-leaves", script(2, 3))
    r = cli.run(cli.args(srv, dir, "run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    v, cm = cli.version(srv)
    assert.equal(3, v)
    local h = cli.history(cm)
    assert.same({ 3, 2, 3 }, { #h, h[3].from, h[3].to })
    assert.is_nil(h[3].result)
  end)

  it("legacy, under --strict-stamp: the run fails at the unstamped step and nothing after it runs", function()
    dir = cli.migration_dir { ["1-stamps"] = script(1, 2), ["2-leaves"] = script(2), ["3-stamps"] = script(3, 4) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "4", "--strict-stamp"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("legacy script " .. dir .. "/2-leaves exited 0 but did not stamp 3 (version is 2) and "
      .. "--strict-stamp is set", r.stderr, 1, true)
    assert.equal(2, cli.version(srv))
    assert.is_nil(ran(srv).s3)
  end)

  it("legacy, a version the script does not own fails closed in both modes", function()
    dir = cli.migration_dir { ["1-jumps"] = script(1, 7), ["2-stamps"] = script(2, 3) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "3"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("legacy script " .. dir .. "/1-jumps exited 0 but did not stamp 2 (version is 7)", r.stderr, 1, true)
    assert.is_nil(ran(srv).s2)
  end)

  it("Lua, ctx.leave_version: recorded with its outcome, the run goes on; --strict-stamp fails it", function()
    dir = cli.migration_dir { ["1-leaves.lua"] = lua(1, true), ["2-stamps.lua"] = lua(2) }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "3"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("reason=\"3 namespaces failed\"", r.stderr, 1, true)
    assert.same({ first = "done", s1 = "ran", s2 = "ran" }, ran(srv))
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    local h = cli.history(cm)
    assert.same({ 1, 2, "unstamped", 1, "3 namespaces failed", 3 },
      { h[1].from, h[1].to, h[1].result, h[1].version, h[1].reason, h[1].outcome.counts.failed })
    assert.is_nil(h[2].result)

    fixture(1)
    r = cli.run(cli.args(srv, dir, "run", "--target", "3", "--strict-stamp"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("migration 1-leaves left the version unstamped (3 namespaces failed) and --strict-stamp is set; "
      .. "version stays at 1", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    assert.is_nil(ran(srv).s2)
  end)

  -- #fakeonly: the refusal is a fault rule (a 422 status) only the fake plays
  it("docs/engine-api.md's leave_version example: one namespace refused, the version left, the rest labelled #fakeonly",
    function()
    local doc = assert(files.read("docs/engine-api.md"))
    local at = assert(doc:find("\n### Leaving the version: `ctx.leave_version`\n", 1, true))
    dir = cli.migration_dir { ["1-label-tenants.lua"] = assert(doc:match("```lua\n(.-)```", at)) }
    local function ns(name, labels)
      return { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels } }
    end
    srv:reset(cli.fixture(1, { ns("tenant-a", { tenant = "a" }), ns("tenant-b", { tenant = "b" }),
      ns("kube-public") }))
    srv:faults { { method = "PATCH", path = "/api/v1/namespaces/tenant-b", times = -1,
      status = { code = 422, reason = "Invalid", message = "refused for the example" } } }
    local r = cli.run(cli.args(srv, dir, "run", "--target", "2"))
    assert.equal(0, r.code, r.stderr)
    assert.truthy(#srv:fired { method = "PATCH" } >= 1, "the refusal never fired")
    assert.matches("namespace tenant-b not labelled", r.stderr, 1, true)
    local label = "example.cozystack.io/tenant"
    assert.equal("true", srv:object("Namespace", nil, "tenant-a").metadata.labels[label])
    assert.is_nil(srv:object("Namespace", nil, "tenant-b").metadata.labels[label])
    assert.is_nil((srv:object("Namespace", nil, "kube-public").metadata.labels or {})[label])
    local v, cm = cli.version(srv)
    assert.equal(1, v)
    local h = cli.history(cm)[1]
    assert.same({ "unstamped", 1, "1 namespace(s) failed: tenant-b", 1, 1 },
      { h.result, h.version, h.reason, h.outcome.counts.patched, h.outcome.counts.failed })
  end)

  it("Lua, ctx.leave_version refuses a reason that says nothing", function()
    dir = cli.migration_dir { ["1-empty.lua"] = lua(1):gsub("ctx:outcome", 'ctx:leave_version("  ")\n    ctx:outcome') }
    fixture(1)
    local r = cli.run(cli.args(srv, dir, "run", "--target", "2"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("ctx:leave_version(reason): reason must be a non-empty string", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
  end)
end)
