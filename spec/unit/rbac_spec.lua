-- cozy.rbac: declared permissions -> rules, the engine's own, legacy scripts.
local rbac = require "cozy.rbac"
local discovery = require "cozy.runner.discovery"

local function lua_migration(perms)
  return { kind = "lua", definition = { permissions = perms } }
end

local function find(objects, kind, name, namespace)
  for _, o in ipairs(objects) do
    if o.kind == kind and o.metadata.name == name and o.metadata.namespace == namespace then return o end
  end
end

describe("cozy.rbac", function()
  it("groups declared permissions by group, resource/subresource and name, verbs sorted, per namespace", function()
    local rules = rbac.declared_rules({
      lua_migration({
        { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" },
        { verb = "list", group = "kubevirt.io", resource = "virtualmachines" },
        { verb = "update", group = "kubevirt.io", resource = "virtualmachines", subresource = "status" },
        { verb = "get", resource = "configmaps", namespace = "tenant-a", name = "settings" },
      }),
      lua_migration({ { verb = "get", group = "kubevirt.io", resource = "virtualmachines" } }),
    })
    assert.same({
      { apiGroups = { "kubevirt.io" }, resources = { "virtualmachines" }, verbs = { "get", "list", "patch" } },
      { apiGroups = { "kubevirt.io" }, resources = { "virtualmachines/status" }, verbs = { "update" } },
    }, rules[""])
    assert.same({ { apiGroups = { "" }, resources = { "configmaps" }, resourceNames = { "settings" },
      verbs = { "get" } } }, rules["tenant-a"])
  end)

  it("keeps only read verbs for the preflight", function()
    local rules = rbac.declared_rules({ lua_migration({
      { verb = "patch", group = "g", resource = "r" }, { verb = "list", group = "g", resource = "r" },
      { verb = "delete", group = "g", resource = "s" } }) }, true)
    assert.same({ { apiGroups = { "g" }, resources = { "r" }, verbs = { "list" } } }, rules[""])
  end)

  it("gives a check_only permission to the preflight alone, and to check's gate alone", function()
    local m = lua_migration({ { verb = "list", group = "g", resource = "r" },
      { verb = "list", group = "g", resource = "only-check", check_only = true } })
    assert.same({ { apiGroups = { "g" }, resources = { "r" }, verbs = { "list" } } }, rbac.declared_rules({ m })[""])
    assert.same({ { apiGroups = { "g" }, resources = { "only-check" }, verbs = { "list" } },
      { apiGroups = { "g" }, resources = { "r" }, verbs = { "list" } } }, rbac.declared_rules({ m }, true)[""])
    assert.equal(1, #discovery.permissions_for(m.definition, "run"))
    assert.equal(2, #discovery.permissions_for(m.definition, "check"))
  end)

  it("asks check to review the engine's own permissions as the Role grants them, named", function()
    local wanted = {}
    for _, p in ipairs(rbac.engine_permissions(false)) do
      wanted[#wanted + 1] = ("%s %s/%s %s"):format(p.verb, p.group, p.resource, p.name or "*")
    end
    table.sort(wanted)
    assert.same({ "create /configmaps *", "create coordination.k8s.io/leases *", "create events.k8s.io/events *",
      "get /configmaps cozystack-version", "get coordination.k8s.io/leases cozystack-migrations",
      "patch /configmaps cozystack-version", "patch coordination.k8s.io/leases cozystack-migrations" }, wanted)
  end)

  it("makes a Role in each other namespace a migration names, bound to the hook's account", function()
    local objects = rbac.objects({ lua_migration({ { verb = "get", resource = "secrets", namespace = "tenant-a" } }) },
      { namespace = "cozy-system" })
    local role = assert(find(objects, "Role", rbac.NAME, "tenant-a"))
    assert.same({ { apiGroups = { "" }, resources = { "secrets" }, verbs = { "get" } } }, role.rules)
    local binding = assert(find(objects, "RoleBinding", rbac.NAME, "tenant-a"))
    assert.same({ { kind = "ServiceAccount", name = rbac.NAME, namespace = "cozy-system" } }, binding.subjects)
  end)

  it("binds cluster-admin for a legacy script, and reports which", function()
    local legacy = { kind = "legacy", file = "/migrations/58" }
    local objects, found = rbac.objects({ lua_migration({}), legacy }, { namespace = "ns" })
    assert.same({ legacy }, found)
    assert.equal("cluster-admin", find(objects, "ClusterRoleBinding", rbac.CLUSTER_ADMIN_BINDING).roleRef.name)
    local pre = rbac.objects({ legacy }, { namespace = "ns", preflight = true })
    assert.is_nil(find(pre, "ClusterRoleBinding", rbac.CLUSTER_ADMIN_BINDING))
  end)

  it("refuses a permission with an unknown key or a non-string value", function()
    local run = function() end
    for _, bad in ipairs({ { verb = "get", resource = "r", verbs = "x" }, { verb = "get", resource = "r", namespace = 1 },
        { verb = "get", resource = "r", check_only = "yes" }, { verb = "get", resource = "r", check_only = false } }) do
      local ok, err = pcall(discovery.validate_definition, { description = "d", run = run, permissions = { bad } }, "f.lua")
      assert.is_false(ok)
      assert.matches("permissions%[1%]", err.message)
    end
    assert.is_table(discovery.validate_definition({ description = "d", run = run,
      permissions = { { verb = "get", resource = "r", check_only = true } } }, "f.lua"))
  end)
end)
