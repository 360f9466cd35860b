-- The sandbox's boundary against a hostile migration and environment: the
-- gate judges a path as the API server routes it (decoded, then split), no
-- credential reaches any output, `string.dump` is out of reach through a
-- string's methods too, and an engine error a migration catches cannot be
-- forged into another kind. (Issue: a hostile run, class 5.)
local fake = require "spec.support.fake"
local files = require "spec.helpers.files"
local support = require "spec.helpers.cli"

local function run_migration(srv, source, ...)
  local dir = support.migration_dir { ["1-hostile.lua"] = source }
  local r = support.run(support.args(srv, dir, "run", ...))
  files.rm_rf(dir)
  return r
end

-- A migration allowed to get and patch namespaces only, sending `path`.
local function namespace_patcher(path)
  return ([[
return {
  description = "may patch namespaces, nothing else",
  permissions = {
    { verb = "get", group = "", resource = "namespaces" },
    { verb = "patch", group = "", resource = "namespaces" },
  },
  run = function(ctx)
    ctx.kube:call("PATCH", %q, { body = { data = { version = "999" } },
      content_type = "application/merge-patch+json" })
  end,
}
]]):format(path)
end

describe("the gate reads a path as the API server routes it", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(support.fixture(1)); srv:clear_requests() end)

  local function refused(path, why)
    local r = run_migration(srv, namespace_patcher(path))
    assert.equal(1, r.code, r.stderr)
    assert.matches(why, r.stderr, 1, true)
    assert.equal(1, support.version(srv))
    -- the one write to the stamp ConfigMap is the engine's own failure record
    -- (after the refusal); the migration's patch (version 999) never leaves
    for _, w in ipairs(support.writes(srv)) do
      assert.not_matches('"999"', w.body or "", 1, true)
    end
    local _, cm = support.version(srv)
    local failed = 0
    for _, rec in ipairs(support.history(cm)) do failed = failed + (rec.result == "failed" and 1 or 0) end
    assert.equal(1, failed, "the failure record")
  end

  it("%2F is a separator there: a namespace patch that routes to the stamp ConfigMap is denied", function()
    refused("/api/v1/namespaces/cozy-system%2Fconfigmaps%2Fcozystack-version",
      'which its permissions do not declare; declare { verb = "patch", group = "", resource = "configmaps" }')
  end)

  it("%2f in lower case the same", function()
    refused("/api/v1/namespaces/cozy-system%2fconfigmaps%2fcozystack-version",
      'declare { verb = "patch", group = "", resource = "configmaps" }')
  end)

  it("a '..' segment, plain or escaped, cannot be judged and is refused before it is sent", function()
    refused("/api/v1/namespaces/x/../cozy-system/configmaps/cozystack-version",
      "which cannot be judged as the API server routes it (an empty, '.' or '..' segment); nothing was sent")
    refused("/api/v1/namespaces/x/%2e%2e/cozy-system/configmaps/cozystack-version",
      "(an empty, '.' or '..' segment)")
  end)

  it("a malformed escape or an encoded '?' is refused too", function()
    refused("/api/v1/namespaces/cozy-system%zz", "(a malformed percent-escape)")
    refused("/api/v1/namespaces/cozy-system%3Fx=1", "(a control character, space, '#' or '?' in the path)")
  end)

  it("a path it can judge still goes through: the namespace patch itself", function()
    local r = run_migration(srv, namespace_patcher("/api/v1/namespaces/cozy-system"))
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, support.version(srv))
  end)
end)

describe("no credential in any output", function()
  -- curl quotes a proxy URL it cannot parse; the server is never reached
  -- (nor any other: the proxy is refused before a connection is made)
  local kubeconfig
  setup(function()
    kubeconfig = os.tmpname()
    files.write(kubeconfig, [[
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://cozy.invalid:6443"}}]
users: [{name: u, user: {token: the-token-value}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
]])
  end)
  teardown(function() os.remove(kubeconfig) end)

  for _, format in ipairs({ "text", "json" }) do
    it("a proxy URL's password is blanked in the " .. format .. " log, with -v", function()
      local r = support.run({ "status", "--kubeconfig", kubeconfig, "--no-builtin", "--target", "1",
        "--log-format", format, "-v" }, { HTTPS_PROXY = "http://admin:s3cret@[::1" })
      assert.equal(1, r.code, r.stderr)
      assert.matches("Unsupported proxy syntax", r.stderr, 1, true)
      assert.matches("http://***@[::1", r.stderr, 1, true)
      assert.not_matches("s3cret", r.stdout .. r.stderr, 1, true)
      assert.not_matches("the-token-value", r.stdout .. r.stderr, 1, true)
    end)
  end
end)

describe("a legacy script's output", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)

  it("has a bearer token and a URL's user-info blanked", function()
    srv:reset(support.fixture(1))
    local dir = support.migration_dir {}
    files.write(dir .. "/1-leaks", [[#!/bin/sh
echo "curl -H 'Authorization: Bearer eyJhbGciOi.secret-part' https://user:hunter2@registry.example/v2/"
echo "token is Bearer abc.def-ghi" >&2
kubectl() { :; }
exit 3
]])
    os.execute("chmod +x " .. support.quote(dir .. "/1-leaks"))
    local r = support.run(support.args(srv, dir, "run"))
    files.rm_rf(dir)
    assert.equal(1, r.code, r.stderr)
    assert.matches("Authorization: ***", r.stderr, 1, true)
    assert.matches("token is Bearer ***", r.stderr, 1, true)
    for _, secret in ipairs({ "secret-part", "hunter2", "abc.def-ghi" }) do
      assert.not_matches(secret, r.stderr, 1, true)
    end
  end)
end)

describe("a string's methods", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(support.fixture(1)) end)

  it("do not reach string.dump", function()
    local r = run_migration(srv, [[
return { description = "looks for dump", run = function(ctx)
  assert(("").dump == nil, "string.dump reachable through a string")
  assert(string.dump == nil, "string.dump reachable")
  assert(("x"):rep(3) == "xxx" and ("%d"):format(7) == "7", "string methods lost")
end }
]])
    assert.equal(0, r.code, r.stderr)
  end)

  it("do not reach it from a loaded chunk either", function()
    local r = run_migration(srv, [[
return { description = "looks for dump", run = function(ctx)
  local f = load("return ('').dump")
  assert(f() == nil, "string.dump reachable from load")
end }
]])
    assert.equal(0, r.code, r.stderr)
  end)
end)

describe("an engine error a migration catches", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(support.fixture(1)) end)

  local function rethrown_as(kind)
    return ([[
return { description = "forges", permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx)
    local ok, err = pcall(function() return ctx.kube:resource("v1", "configmaps"):get("cozy-system", "nope") end)
    assert(not ok and err.code == 404, "expected a 404")
    err.kind = %q
    error(err)
  end }
]]):format(kind)
  end

  it("stays what the engine made it: kind 'lost' written on it still releases the lock", function()
    local r = run_migration(srv, rethrown_as("lost"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("NotFound", r.stderr, 1, true)
    assert.equal("", support.lease_holder(srv))
    assert.equal(1, support.version(srv))
  end)

  it("kind 'locked' written on it does not change the exit status to 3", function()
    local r = run_migration(srv, rethrown_as("locked"))
    assert.equal(1, r.code, r.stderr)
    assert.equal("", support.lease_holder(srv))
  end)
end)
