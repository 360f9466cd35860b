-- deploy/helm, rendered by spec/support/helm_template.lua (no helm binary
-- here) for the values each case sets: the hook Job is a drop-in for the
-- platform's migration-hook.yaml, its RBAC equals `cozy-migrate rbac --all`,
-- and the preflight Job runs `check` with read-only permissions.
local json = require "cozy.json"
local support = require "spec.helpers.cli"
local tpl = require "spec.support.helm_template"

local CHART = "deploy/helm"
local NS = "cozy-system"
local RBAC_KINDS = { ServiceAccount = true, ClusterRole = true, ClusterRoleBinding = true, Role = true,
  RoleBinding = true }

-- YAML (one or more documents) -> array of tables, through python3-yaml
local function yaml_load(text)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "w"))
  f:write(text)
  f:close()
  local p = io.popen("python3 -c 'import sys, yaml, json; "
    .. "print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))' " .. tmp)
  local out = p:read("a")
  local ok = p:close()
  os.remove(tmp)
  assert(ok, "not valid YAML:\n" .. text)
  return json.decode(out)
end

local function deep_merge(dst, src)
  for k, v in pairs(src) do
    if type(v) == "table" and type(dst[k]) == "table" and next(v) ~= nil and #v == 0 then
      deep_merge(dst[k], v)
    else
      dst[k] = v
    end
  end
  return dst
end

local function values(overrides)
  local f = assert(io.open(CHART .. "/values.yaml"))
  local v = yaml_load(f:read("a"))[1]
  f:close()
  return deep_merge(v, overrides or {})
end

-- Renders the chart against a cluster whose version ConfigMap holds
-- `version` (nil: a fresh install); returns the objects.
local function render(version, overrides)
  local lookups = {}
  local files = tpl.render_chart(CHART, {
    values = values(overrides), namespace = NS,
    lookup = function(api_version, kind, namespace, name)
      lookups[#lookups + 1] = table.concat({ api_version, kind, namespace, name }, " ")
      if api_version == "v1" and kind == "ConfigMap" and namespace == NS and name == "cozystack-version"
          and version then
        return { metadata = { name = name, namespace = NS }, data = { version = tostring(version) } }
      end
      return nil
    end,
  })
  local objects = {}
  for _, name in ipairs((function()
    local names = {}
    for n in pairs(files) do names[#names + 1] = n end
    table.sort(names)
    return names
  end)()) do
    for _, o in ipairs(yaml_load(files[name])) do
      o._file = name
      objects[#objects + 1] = o
    end
  end
  return objects, lookups
end

local function find(objects, kind, name)
  for _, o in ipairs(objects) do
    if o.kind == kind and o.metadata.name == name then return o end
  end
  return nil
end

-- The RBAC objects of one component, as `cozy-migrate rbac` prints them:
-- helm's hook annotations are the chart's business, not the RBAC's.
local function rbac_of(objects, component)
  local out = {}
  for _, o in ipairs(objects) do
    if RBAC_KINDS[o.kind] and o.metadata.labels["app.kubernetes.io/component"] == component then
      o._file = nil
      local ann = o.metadata.annotations or {}
      for k in pairs(ann) do
        if k:match("^helm%.sh/") then ann[k] = nil end
      end
      if next(ann) == nil then o.metadata.annotations = nil end
      out[#out + 1] = o
    end
  end
  return out
end

local function generated(args, env)
  local r = support.run(args, env or { COZY_MIGRATE_MIGRATIONS = "" })
  assert.equal(0, r.code, r.stderr)
  return json.decode(r.stdout).items, r.stderr
end

local function env_of(container)
  local out = {}
  for _, e in ipairs(container.env) do out[e.name] = e.value or e.valueFrom end
  return out
end

describe("deploy/helm", function()
  it("renders the migration Job as the platform's hook, when the stamp is below the target", function()
    local objects, lookups = render(59, { migrations = { targetVersion = 60,
      extraEnv = { { name = "ETCD_ADOPT_SKIP_BACKUP", value = "true" } } } })
    assert.truthy(#lookups > 0)
    local job = assert(find(objects, "Job", "cozystack-migration-hook"))
    assert.same({ ["helm.sh/hook"] = "pre-upgrade,pre-install", ["helm.sh/hook-weight"] = "1",
      ["helm.sh/hook-delete-policy"] = "before-hook-creation" }, job.metadata.annotations)
    assert.equal(NS, job.metadata.namespace)
    assert.equal(3, job.spec.backoffLimit)
    local pod = job.spec.template.spec
    assert.equal("Never", pod.restartPolicy)
    assert.equal("cozystack-migration-hook", pod.serviceAccountName)
    assert.is_true(pod.securityContext.runAsNonRoot)
    local c = pod.containers[1]
    assert.same({ "run" }, c.args)
    assert.is_true(c.securityContext.readOnlyRootFilesystem)
    local env = env_of(c)
    assert.equal(NS, env.NAMESPACE)
    assert.equal("59", env.CURRENT_VERSION)
    assert.equal("60", env.TARGET_VERSION)
    assert.equal("true", env.ETCD_ADOPT_SKIP_BACKUP)
    assert.same({ fieldRef = { fieldPath = "metadata.name" } }, env.POD_NAME)
    assert.truthy(c.resources.requests.cpu and c.resources.requests.memory and c.resources.limits.memory)
    -- a clean stop: the request in flight (--request-timeout default 30 s)
    -- and the bounded lock release (two attempts of at most 5 s)
    assert.is_true(pod.terminationGracePeriodSeconds > 30 + 2 * 5, tostring(pod.terminationGracePeriodSeconds))
    -- the hook's RBAC exists before the preflight (0) and the Job (1), only for the run
    for _, o in ipairs(rbac_of(render(59), "migration")) do assert.truthy(o) end
    -- a read-only root with scratch space; HOME there only for legacy scripts' kubectl
    assert.same({ { name = "tmp", mountPath = "/tmp" } }, c.volumeMounts)
    assert.same({ { name = "tmp", emptyDir = {} } }, pod.volumes)
    assert.is_nil(env.HOME)
    local legacy_job = find(render(58, { migrations = { legacyScripts = true } }), "Job", "cozystack-migration-hook")
    assert.equal("/tmp", env_of(legacy_job.spec.template.spec.containers[1]).HOME)
    local sa = find(objects, "ServiceAccount", "cozystack-migration-hook")
    assert.equal("-1", sa.metadata.annotations["helm.sh/hook-weight"])
    assert.equal("before-hook-creation,hook-succeeded", sa.metadata.annotations["helm.sh/hook-delete-policy"])
  end)

  it("renders no Job when up to date, disabled, or on a fresh install (which gets the ConfigMap at the target)", function()
    for _, case in ipairs({ { 60 }, { 61 }, { 59, { migrations = { enabled = false } } }, { nil } }) do
      local objects = render(case[1], case[2])
      assert.is_nil(find(objects, "Job", "cozystack-migration-hook"), tostring(case[1]))
      assert.is_nil(find(objects, "Job", "cozystack-migration-preflight"), tostring(case[1]))
      assert.same({}, rbac_of(objects, "migration"))
      assert.same({}, rbac_of(objects, "preflight"))
    end
    local fresh = render(nil)
    local cm = assert(find(fresh, "ConfigMap", "cozystack-version"))
    assert.equal("60", cm.data.version)
    assert.equal("true", cm.metadata.labels["platform.cozystack.io/no-delete"])
    assert.equal("keep", cm.metadata.annotations["helm.sh/resource-policy"])
    assert.is_nil(find(render(59), "ConfigMap", "cozystack-version"))
  end)

  it("carries exactly the RBAC `cozy-migrate rbac --all` generates, without cluster-admin", function()
    local want = generated({ "rbac", "--all", "--namespace", NS, "--output", "json" })
    local got = rbac_of(render(59), "migration")
    assert.same(want, got)
    for _, o in ipairs(got) do
      assert.is_false(o.roleRef ~= nil and o.roleRef.name == "cluster-admin", o.metadata.name)
    end
  end)

  it("binds cluster-admin only with migrations.legacyScripts, as `rbac --all` does for legacy scripts", function()
    local dir = support.tmpdir()
    finally(function() os.execute("rm -rf " .. support.quote(dir)) end)
    local f = assert(io.open(dir .. "/58-old", "w"))
    f:write("#!/bin/sh\nexit 0\n")
    f:close()
    os.execute("chmod +x " .. support.quote(dir .. "/58-old"))
    local want, stderr = generated({ "rbac", "--all", "--namespace", NS, "--output", "json", "--migrations", dir })
    assert.matches("WARNING: .*58%-old.*cluster%-admin", stderr)
    local got = rbac_of(render(58, { migrations = { legacyScripts = true } }), "migration")
    assert.same(want, got)
    local admin = find(got, "ClusterRoleBinding", "cozystack-migration-hook-cluster-admin")
    assert.equal("cluster-admin", admin.roleRef.name)
    assert.same({ { kind = "ServiceAccount", name = "cozystack-migration-hook", namespace = NS } }, admin.subjects)
  end)

  it("gates the upgrade with a preflight Job at weight 0 running check, with read-only permissions", function()
    local objects = render(59, { migrations = { legacyScripts = true } })
    local job = assert(find(objects, "Job", "cozystack-migration-preflight"))
    assert.equal("0", job.metadata.annotations["helm.sh/hook"] and job.metadata.annotations["helm.sh/hook-weight"])
    assert.equal("pre-upgrade,pre-install", job.metadata.annotations["helm.sh/hook"])
    local pod = job.spec.template.spec
    assert.equal("Never", pod.restartPolicy)
    assert.equal("cozystack-migration-preflight", pod.serviceAccountName)
    local c = pod.containers[1]
    assert.same({ "check", "--service-account", "cozystack-migration-hook" }, c.args)
    assert.is_true(c.securityContext.readOnlyRootFilesystem)
    assert.equal("60", env_of(c).TARGET_VERSION)

    local got = rbac_of(objects, "preflight")
    assert.same(generated({ "rbac", "--all", "--preflight", "--namespace", NS, "--output", "json" }), got)
    local reviews = { selfsubjectaccessreviews = true, subjectaccessreviews = true }
    local saw_review = {}
    for _, o in ipairs(got) do
      if o.roleRef then
        assert.equal("cozystack-migration-preflight", o.roleRef.name)
        assert.same({ { kind = "ServiceAccount", name = "cozystack-migration-preflight", namespace = NS } }, o.subjects)
      end
      for _, rule in ipairs(o.rules or {}) do
        for _, verb in ipairs(rule.verbs) do
          local resource = rule.resources and rule.resources[1]
          if verb == "create" and rule.apiGroups[1] == "authorization.k8s.io" and reviews[resource] then
            saw_review[resource] = true
          else
            assert.is_true(verb == "get" or verb == "list" or verb == "watch",
              ("%s %s grants %s"):format(o.kind, o.metadata.name, verb))
          end
        end
      end
    end
    assert.same(reviews, saw_review)
  end)

  it("the preflight's check reviews the hook's account with SubjectAccessReviews", function()
    local fake = require "spec.support.fake"
    local srv = fake.start{ fixtures = { "spec/fixtures/59-vmi-hotplug/cluster.json" }, tls = true, token = "t",
      deny = { "patch:kubevirt.io:virtualmachines" } }
    finally(function() srv:stop() end)
    local r = support.run({ "check", "--service-account", "cozystack-migration-hook", "--kubeconfig", srv.kubeconfig,
      "--output", "json" }, { NAMESPACE = NS, TARGET_VERSION = "60", COZY_MIGRATE_MIGRATIONS = "" })
    assert.equal(1, r.code, r.stderr)
    local report = json.decode(r.stdout)
    assert.is_true(report.blocked)
    local blocked = {}
    for _, f in ipairs(report.findings) do
      if f.severity == "block" then blocked[#blocked + 1] = f.message end
    end
    assert.equal(1, #blocked, table.concat(blocked, "; "))
    assert.matches("not allowed: patch virtualmachines%.kubevirt%.io", blocked[1])
    local sar, ssar = 0, 0
    for _, req in ipairs(srv:requests{ method = "POST" }) do
      if req.path:match("/subjectaccessreviews$") then
        sar = sar + 1
        local body = json.decode(req.body)
        assert.equal("system:serviceaccount:cozy-system:cozystack-migration-hook", body.spec.user)
      elseif req.path:match("selfsubjectaccessreviews") then
        ssar = ssar + 1
      end
    end
    assert.is_true(sar > 0)
    assert.equal(0, ssar)
    assert.same({}, support.writes(srv))
  end)

  it("keeps the generated RBAC templates in step with generate-rbac.lua", function()
    local dir = support.tmpdir()
    finally(function() os.execute("rm -rf " .. support.quote(dir)) end)
    local ok = os.execute(("COZY_MIGRATE_MIGRATIONS= %s lua %s/generate-rbac.lua %s >/dev/null"):format(
      support.quote(support.bin), CHART, support.quote(dir)))
    assert.is_true(ok)
    for _, name in ipairs({ "rbac.yaml", "preflight-rbac.yaml" }) do
      assert.equal(support.slurp(dir .. "/" .. name), support.slurp(CHART .. "/templates/" .. name),
        name .. " is stale: run build/cozy-migrate lua deploy/helm/generate-rbac.lua")
    end
  end)
end)
