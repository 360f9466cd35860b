-- `cozy-migrate run` against the fake API server: bootstrap, ordered steps
-- with stamps and history, fail closed, invalid sets refused without a write.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local LABEL = "platform.cozystack.io/no-delete"

describe("cozy-migrate run", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(nil) } } end)
  teardown(function() srv:stop() end)
  after_each(function() srv:clear_requests() end)

  it("bootstraps a fresh install at the target and runs nothing", function()
    srv:reset(cli.fixture(nil))
    local r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    assert.equal("true", cm.metadata.labels[LABEL])
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "runner-test"))
    assert.matches("fresh install", r.stderr)
    -- with $TARGET_VERSION the bootstrap stamps that
    srv:reset(cli.fixture(nil))
    r = cli.run(cli.args(srv, "two", "run"), { TARGET_VERSION = "7" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(7, cli.version(srv))
  end)

  it("runs two steps in order, stamping each with its history record in one write", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(3, v)
    assert.equal("true", cm.metadata.labels[LABEL])
    local t = srv:object("ConfigMap", "cozy-system", "runner-test")
    assert.same({ first = "done", second = "done:2->3" }, t.data)
    local h = cli.history(cm)
    assert.equal(2, #h)
    assert.same({ 1, "1-first", 1, 2, "lua" }, { h[1].number, h[1].name, h[1].from, h[1].to, h[1].kind })
    assert.same({ 2, "2-second", 2, 3 }, { h[2].number, h[2].name, h[2].from, h[2].to })
    assert.equal(64, #h[1].sha256)
    assert.is_string(h[1].started); assert.is_string(h[1].finished); assert.is_string(h[1].engine)
    assert.is_string(h[1].runner)
    -- the stamps: one guarded JSON patch per step, version 2 then 3
    local stamps = srv:requests{ method = "PATCH", path = "configmaps/cozystack%-version$" }
    assert.equal(2, #stamps)
    local versions = {}
    for i, s in ipairs(stamps) do
      local ops = json.decode(s.body)
      assert.equal("application/json-patch+json", s.content_type)
      assert.same({ op = "test", path = "/metadata/resourceVersion" }, { op = ops[1].op, path = ops[1].path })
      for _, op in ipairs(ops) do
        if op.path == "/data/version" then versions[i] = op.value end
      end
      assert.equal(200, s.status)
    end
    assert.same({ "2", "3" }, versions)
    assert.matches("summary", r.stderr)
    assert.matches("steps=2", r.stderr)
    -- a second run has nothing to do and writes nothing
    srv:clear_requests()
    r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(0, r.code, r.stderr)
    assert.same({}, cli.writes(srv))
  end)

  it("refuses to run on a malformed history, and never replaces it", function()
    srv:reset(cli.fixture(1))
    local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/cozystack-version",
      { body = { data = { history = "[1,2,3]" } }, content_type = "application/merge-patch+json" })
    assert.equal(200, res.status, res.body)
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("data.history must be a JSON array of step records, found an array whose entry 1 is not a record",
      r.stderr, 1, true)
    assert.same({}, cli.writes(srv))
    local v, cm = cli.version(srv)
    assert.equal(1, v)
    assert.equal("[1,2,3]", cm.data.history)
    -- status still answers, with the same text as a warning
    r = cli.run(cli.args(srv, "two", "status"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("warning: ConfigMap cozy-system/cozystack-version: data.history must be", r.stdout, 1, true)
  end)

  it("fails closed: earlier stamps stay, nothing past the failing step", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, "fail", "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("step 2 refuses to continue", r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(2, v)
    -- step 1's record, and the failed attempt at step 2 (runner/failure_spec.lua)
    local h = cli.history(cm)
    assert.same({ "1-first", "2-fails" }, { h[1].name, h[2].name })
    assert.same({ json.null, "failed" }, { h[1].result or json.null, h[2].result })
    local t = srv:object("ConfigMap", "cozy-system", "runner-test")
    assert.equal("tried", t.data.failing)
    assert.is_nil(t.data.never)
    -- the lock was released even so
    local lease = srv:object("Lease.coordination.k8s.io", "cozy-system", "cozystack-migrations")
    assert.equal("", lease.spec.holderIdentity or "")
    -- a rerun starts at the failing step again
    r = cli.run(cli.args(srv, "fail", "run"))
    assert.equal(1, r.code)
    assert.equal(2, cli.version(srv))
  end)

  for _, case in ipairs({
    { "gap", 1, "no migration for version 2" },
    { "dup", 1, "duplicate migration number 1" },
    { "syntax", 1, "2%-broken.lua:4:" },
    { "shape", 1, "2%-no%-run.lua: run must be a function" },
  }) do
    it("refuses an invalid set (" .. case[1] .. ") with exit 2 and no write", function()
      srv:reset(cli.fixture(case[2]))
      srv:clear_requests()
      local r = cli.run(cli.args(srv, case[1], "run"))
      assert.equal(2, r.code, r.stderr)
      assert.matches(case[3], r.stderr)
      assert.same({}, cli.writes(srv))
      assert.equal(case[2], cli.version(srv))
    end)
  end

  it("never goes down and honours $TARGET_VERSION and --target", function()
    srv:reset(cli.fixture(5))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "run"))
    assert.equal(0, r.code, r.stderr)
    assert.matches("never goes down", r.stderr)
    assert.same({}, cli.writes(srv))
    assert.equal(5, cli.version(srv))

    srv:reset(cli.fixture(1))
    r = cli.run(cli.args(srv, "two", "run"), { TARGET_VERSION = "2" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
    r = cli.run(cli.args(srv, "two", "run", "--target", "3"), { TARGET_VERSION = "2" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(3, cli.version(srv))
  end)

  it("reads the version from the ConfigMap and only cross-checks $CURRENT_VERSION", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, "two", "run"), { CURRENT_VERSION = "2", NAMESPACE = "cozy-system" })
    assert.equal(0, r.code, r.stderr)
    assert.matches("CURRENT_VERSION differs", r.stderr)
    assert.equal(3, cli.version(srv))
    assert.equal("done", srv:object("ConfigMap", "cozy-system", "runner-test").data.first)
  end)

  it("restores the no-delete label", function()
    srv:reset(cli.fixture(1, nil, { other = "kept" }))
    local r = cli.run(cli.args(srv, "two", "run", "--target", "2"))
    assert.equal(0, r.code, r.stderr)
    local _, cm = cli.version(srv)
    assert.same({ other = "kept", [LABEL] = "true" }, cm.metadata.labels)
  end)

  it("uses --namespace / $NAMESPACE for the stamp and the lock", function()
    srv:reset({ { apiVersion = "v1", kind = "Namespace", metadata = { name = "other" } },
      { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cozystack-version", namespace = "other" },
        data = { version = "1" } } })
    local r = cli.run(cli.args(srv, "two", "run", "--target", "2"), { NAMESPACE = "other" })
    assert.equal(0, r.code, r.stderr)
    assert.equal("2", srv:object("ConfigMap", "other", "cozystack-version").data.version)
    assert.truthy(srv:object("Lease.coordination.k8s.io", "other", "cozystack-migrations"))
  end)

  it("logs one JSON object per line with --log-format json", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, "two", "run", "--log-format", "json"))
    assert.equal(0, r.code, r.stderr)
    local msgs = {}
    for _, line in ipairs(cli.lines(r.stderr)) do
      local obj = json.decode(line)
      assert.is_string(obj.ts); assert.is_string(obj.level)
      msgs[#msgs + 1] = obj.msg
      if obj.msg == "summary" then
        assert.equal(2, obj.steps)
        assert.is_number(obj.writes); assert.is_number(obj.retries); assert.is_number(obj.conflicts)
      end
      if obj.msg == "creating runner-test" then assert.equal("1-first", obj.migration) end
    end
    assert.truthy(table.concat(msgs, "|"):find("creating runner-test", 1, true))
  end)

  it("exits 2 for a configuration error", function()
    local r = cli.run({ "run", "--kubeconfig", "/nonexistent/kubeconfig", "--no-builtin", "--migrations", "spec/fixtures/runner/two" })
    assert.equal(2, r.code, r.stderr)
  end)
end)
