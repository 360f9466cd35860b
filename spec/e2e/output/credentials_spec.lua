-- No credential reaches any output: a proxy URL's password in the runner's
-- log (text and JSON), a bearer token and a URL's user-info in a legacy
-- script's output.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

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
      local r = cli.run({ "status", "--kubeconfig", kubeconfig, "--no-builtin", "--target", "1",
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
    srv:reset(cli.fixture(1))
    local dir = cli.migration_dir {}
    files.write(dir .. "/1-leaks", [[#!/bin/sh
echo "curl -H 'Authorization: Bearer eyJhbGciOi.secret-part' https://user:hunter2@registry.example/v2/"
echo "token is Bearer abc.def-ghi" >&2
kubectl() { :; }
exit 3
]])
    os.execute("chmod +x " .. cli.quote(dir .. "/1-leaks"))
    local r = cli.run(cli.args(srv, dir, "run"))
    files.rm_rf(dir)
    assert.equal(1, r.code, r.stderr)
    assert.matches("Authorization: ***", r.stderr, 1, true)
    assert.matches("token is Bearer ***", r.stderr, 1, true)
    for _, secret in ipairs({ "secret-part", "hunter2", "abc.def-ghi" }) do
      assert.not_matches(secret, r.stderr, 1, true)
    end
  end)
end)
