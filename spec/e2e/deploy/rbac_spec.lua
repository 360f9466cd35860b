-- `cozy-migrate rbac`: the least-privilege RBAC of the pending range (read
-- from the stamp) or of every migration (--all, no cluster needed).
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local NO_DIR = { COZY_MIGRATE_MIGRATIONS = "" }

local function find(items, kind, name)
  for _, o in ipairs(items) do
    if o.kind == kind and o.metadata.name == name then return o end
  end
end

local function granted(items, role)
  local out = {}
  for _, rule in ipairs(find(items, "ClusterRole", role or "cozystack-migration-hook").rules) do
    for _, verb in ipairs(rule.verbs) do
      for _, r in ipairs(rule.resources or rule.nonResourceURLs) do
        out[#out + 1] = verb .. " " .. r .. (rule.apiGroups and ("." .. rule.apiGroups[1]) or "")
      end
    end
  end
  table.sort(out)
  return out
end

local function legacy_dir()
  local dir = cli.tmpdir()
  for _, n in ipairs({ "57-old", "58-older" }) do
    local f = assert(io.open(dir .. "/" .. n, "w"))
    f:write("#!/bin/sh\nexit 0\n")
    f:close()
    os.execute("chmod +x " .. cli.quote(dir .. "/" .. n))
  end
  return dir
end

describe("cozy-migrate rbac", function()
  local srv
  setup(function()
    srv = fake.start{ fixtures = { cli.fixture(59) }, tls = true, token = "t" }
  end)
  teardown(function() srv:stop() end)

  local function at(version)
    srv:reset(cli.fixture(version))
  end

  it("--all needs no cluster, and prints YAML equal to its JSON", function()
    local r = cli.run({ "rbac", "--all", "--kubeconfig", "/nonexistent/kubeconfig" }, NO_DIR)
    assert.equal(0, r.code, r.stderr)
    local p = io.popen("python3 -c 'import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))' <<'EOF'\n"
      .. r.stdout .. "EOF\n")
    local from_yaml = json.decode(p:read("a"))
    p:close()
    local j = cli.run({ "rbac", "--all", "--output", "json" }, NO_DIR)
    assert.equal(0, j.code, j.stderr)
    assert.same(json.decode(j.stdout).items, from_yaml)
    -- the kinds, each once in order of first appearance: a built-in that declares a
    -- permission in another namespace adds a Role and RoleBinding there, no new kind
    assert.same({ "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding" },
      (function()
        local k, seen = {}, {}
        for _, o in ipairs(from_yaml) do
          if not seen[o.kind] then seen[o.kind] = true; k[#k + 1] = o.kind end
        end
        return k
      end)())
  end)

  it("grants the pending range's declared permissions, and only the engine's when nothing is pending", function()
    at(59)
    local r = cli.run({ "rbac", "--kubeconfig", srv.kubeconfig, "--output", "json" }, NO_DIR)
    assert.equal(0, r.code, r.stderr)
    local items = json.decode(r.stdout).items
    assert.same({ "create selfsubjectaccessreviews.authorization.k8s.io",
      "create selfsubjectreviews.authentication.k8s.io", "get /api", "get /api/*", "get /apis",
      "get /apis/*", "get /version",
      "get virtualmachines.kubevirt.io", "list virtualmachineinstances.kubevirt.io",
      "list virtualmachines.kubevirt.io", "patch virtualmachines.kubevirt.io" }, granted(items))
    local role = find(items, "Role", "cozystack-migration-hook")
    assert.equal("cozy-system", role.metadata.namespace)
    -- what only check() reads (59's KubeVirt CRs, check_only) is the preflight's alone
    r = cli.run({ "rbac", "--preflight", "--kubeconfig", srv.kubeconfig, "--output", "json" }, NO_DIR)
    assert.equal(0, r.code, r.stderr)
    local preflight = granted(json.decode(r.stdout).items, "cozystack-migration-preflight")
    assert.is_true(preflight[1] ~= nil)
    local has = {}
    for _, g in ipairs(preflight) do has[g] = true end
    assert.is_true(has["list kubevirts.kubevirt.io"], table.concat(preflight, ", "))
    assert.is_nil(has["patch virtualmachines.kubevirt.io"], table.concat(preflight, ", "))
    at(60)
    r = cli.run({ "rbac", "--kubeconfig", srv.kubeconfig, "--output", "json" }, NO_DIR)
    assert.equal(0, r.code, r.stderr)
    assert.same({ "create selfsubjectaccessreviews.authorization.k8s.io",
      "create selfsubjectreviews.authentication.k8s.io", "get /api", "get /api/*", "get /apis",
      "get /apis/*", "get /version" }, granted(json.decode(r.stdout).items))
  end)

  it("binds cluster-admin, loudly, when the pending range holds a legacy script, and not after it", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    at(57)
    local r = cli.run({ "rbac", "--kubeconfig", srv.kubeconfig, "--migrations", dir, "--output", "json" })
    assert.equal(0, r.code, r.stderr)
    assert.matches("WARNING: the range %(57%.%.59%) holds legacy script%(s%) .*57%-old, .*58%-older", r.stderr)
    local admin = find(json.decode(r.stdout).items, "ClusterRoleBinding", "cozystack-migration-hook-cluster-admin")
    assert.equal("cluster-admin", admin.roleRef.name)
    at(59)
    r = cli.run({ "rbac", "--kubeconfig", srv.kubeconfig, "--migrations", dir, "--output", "json" })
    assert.equal(0, r.code, r.stderr)
    assert.equal("", r.stderr)
    assert.is_nil(find(json.decode(r.stdout).items, "ClusterRoleBinding", "cozystack-migration-hook-cluster-admin"))
  end)

  it("refuses a bad --output with exit 2", function()
    local r = cli.run({ "rbac", "--all", "--output", "text" }, NO_DIR)
    assert.equal(2, r.code)
    assert.matches("%-%-output must be one of yaml|json", r.stderr)
  end)
end)
