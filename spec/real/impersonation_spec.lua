-- Impersonation under real RBAC (issue 35, class 4): a kubeconfig user's
-- `as` makes the real kube-apiserver authorize every request as that user,
-- not as the base credentials. The base credentials are the admin's
-- (system:masters, which may do anything): impersonating a user without
-- RBAC, the same command is refused, naming that user; the engine's
-- account, which may not impersonate, is refused the impersonation itself.
-- Before, `as` was ignored and both ran as the base credentials. The fake
-- authorizes no impersonated user: this runs as real/spec/real/impersonation.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

describe("impersonation under real RBAC", function()
  local srv, dir
  setup(function()
    assert(os.getenv("COZY_SPEC_SERVER") == "real", "spec/real/ runs against the real server only")
    srv = fake.start { fixtures = { cli.fixture(1) } }
    dir = cli.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then files.rm_rf(dir) end
  end)

  -- `path`'s kubeconfig with `lines` added after its user's token
  local function with_user_lines(path, lines, name)
    local text = assert(files.read(path))
    local out, n = text:gsub("\n(    token: [^\n]*)", "\n%1\n" .. table.concat(lines, "\n"), 1)
    assert(n == 1, "the kubeconfig has no token line: " .. text)
    local out_path = dir .. "/" .. name
    files.write(out_path, out)
    return out_path
  end

  it("acts as the impersonated user: what the admin may do is refused to a user without RBAC", function()
    local status = { "--no-builtin", "--target", "2", "status" }
    local r = cli.run { "--kubeconfig", srv.kubeconfig, table.unpack(status) }
    assert.equal(0, r.code, r.stderr)
    local as_bob = with_user_lines(srv.kubeconfig, { "    as: nobody-bob" }, "bob")
    r = cli.run { "--kubeconfig", as_bob, table.unpack(status) }
    assert.equal(1, r.code, r.stderr)
    assert.matches('User "nobody-bob" cannot get resource "configmaps"', r.stderr, 1, true)
    -- the same user in system:masters may again
    local as_master = with_user_lines(srv.kubeconfig, { "    as: nobody-bob", "    as-groups: [system:masters]" },
      "bob-master")
    r = cli.run { "--kubeconfig", as_master, table.unpack(status) }
    assert.equal(0, r.code, r.stderr)
  end)

  it("is refused to base credentials that may not impersonate", function()
    local account = cli.account_kubeconfig(srv, "cozy-system", "no-impersonation")
    local path = with_user_lines(account.kubeconfig, { "    as: admin" }, "account-as-admin")
    local r = cli.run { "--kubeconfig", path, "--no-builtin", "--target", "2", "status" }
    assert.equal(1, r.code, r.stderr)
    assert.matches('cannot impersonate resource "users"', r.stderr, 1, true)
  end)
end)
