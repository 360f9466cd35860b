-- deploy/helm rendered by real Helm (spec/support/helm, v3.19.5) against the
-- real API server, whose state the chart's `lookup` reads (`helm template
-- --dry-run=server`), over a table of cluster states and values. Each row
-- asserts the rendered objects field by field; every render that yields
-- objects is then applied with `kubectl apply --dry-run=server`
-- (spec/support/kubectl, v1.34.2), so the API server judges each object.
--
-- The platform's own template (cozystack/cozystack,
-- packages/core/platform/templates/migration-hook.yaml) is what the hook Job
-- must match: its name, hook annotations, backoffLimit, pod label, env and
-- the normalisation of migrations.etcdAdoptSkipBackup.
--
-- Only the real server can host this (Helm's lookup and kubectl's server-side
-- dry run need a real API): it runs as real/spec/real/helm_chart.
local json = require "cozy.json"
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local HELM = "spec/support/helm"
local KUBECTL = "spec/support/kubectl"
local CHART = "deploy/helm"
local NS = "cozy-system"
local IMAGE = "ghcr.io/cozystack/cozy-migrate:0.1.0"
local RBAC_KINDS = { ServiceAccount = true, ClusterRole = true, ClusterRoleBinding = true, Role = true,
  RoleBinding = true }

local q = files.quote

-- YAML (one or more documents) -> array of tables, through python3-yaml
local function yaml_load(text)
  local r = cli.shell("python3 -c 'import sys, yaml, json; "
    .. "print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None]))'", text)
  assert(r.code == 0, "not valid YAML:\n" .. text .. "\n" .. r.stderr)
  return json.decode(r.stdout)
end

-- helm with its caches and config in `dir`, never the user's
local function helm(dir, args)
  return cli.shell(("HELM_CACHE_HOME=%s HELM_CONFIG_HOME=%s HELM_DATA_HOME=%s %s %s"):format(
    q(dir .. "/cache"), q(dir .. "/config"), q(dir .. "/data"), HELM, args))
end

-- Renders `chart` with the values file text `values` (nil: the chart's own
-- alone) against srv; `client_only` renders without the cluster, as a plain
-- `helm template` does. Returns the objects and the rendered text.
local function render(srv, values, opts)
  opts = opts or {}
  local dir = cli.tmpdir()
  finally(function() files.rm_rf(dir) end)
  local args = { "template", "cozystack", q(opts.chart or CHART), "--namespace", NS }
  if not opts.client_only then
    args[#args + 1] = "--dry-run=server --kubeconfig " .. q(srv.kubeconfig)
  end
  if values then
    files.write(dir .. "/values.yaml", values)
    args[#args + 1] = "--values " .. q(dir .. "/values.yaml")
  end
  local r = helm(dir, table.concat(args, " "))
  assert.equal(0, r.code, r.stderr)
  return yaml_load(r.stdout), r.stdout
end

-- The API server's verdict on a render: every object created in a
-- server-side dry run, none refused.
local function server_accepts(srv, text, objects)
  local r = cli.shell(("%s --kubeconfig %s apply --dry-run=server -f -"):format(KUBECTL, q(srv.kubeconfig)), text)
  assert.equal(0, r.code, r.stderr .. "\n" .. text)
  local created = select(2, r.stdout:gsub("created %(server dry run%)", ""))
  assert.equal(#objects, created, r.stdout)
end

local function find(objects, kind, name)
  for _, o in ipairs(objects) do
    if o.kind == kind and o.metadata.name == name then return o end
  end
  return nil
end

local function names(objects)
  local out = {}
  for _, o in ipairs(objects) do out[#out + 1] = o.kind .. "/" .. o.metadata.name end
  table.sort(out)
  return out
end

-- The RBAC objects of one component, as `cozy-migrate rbac` prints them:
-- helm's hook annotations are the chart's business, not the RBAC's.
local function rbac_of(objects, component)
  local out = {}
  for _, o in ipairs(objects) do
    if RBAC_KINDS[o.kind] and o.metadata.labels["app.kubernetes.io/component"] == component then
      o = json.decode(json.encode(o))
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

-- What `cozy-migrate rbac --all` prints for the built-in migrations, and with
-- `legacy` for a directory holding a legacy script too (cluster-admin).
local function generated(args, legacy)
  local env = { COZY_MIGRATE_MIGRATIONS = "" }
  local dir
  if legacy then
    dir = cli.tmpdir()
    files.write(dir .. "/58-old", "#!/bin/sh\nexit 0\n")
    args[#args + 1] = "--migrations"
    args[#args + 1] = dir
  end
  local r = cli.run(args, env)
  if dir then files.rm_rf(dir) end
  assert.equal(0, r.code, r.stderr)
  return json.decode(r.stdout).items
end

-- objects by "Kind/name": the chart's order is its own (cluster-admin last)
local function by_name(objects)
  local out = {}
  for _, o in ipairs(objects) do out[o.kind .. "/" .. o.metadata.name] = o end
  return out
end

local HOOK = { ["helm.sh/hook"] = "pre-upgrade,pre-install", ["helm.sh/hook-weight"] = "1",
  ["helm.sh/hook-delete-policy"] = "before-hook-creation" }

-- The hook Job, field by field; `want`: current, skip ("1"/"0"), legacy,
-- extra_env (a list appended after the chart's own), resources.
local function assert_job(job, want)
  assert.same(HOOK, job.metadata.annotations)
  assert.equal(NS, job.metadata.namespace)
  assert.equal(3, job.spec.backoffLimit)
  local tmpl = job.spec.template
  assert.equal("true", tmpl.metadata.labels["policy.cozystack.io/allow-to-apiserver"])
  local pod = tmpl.spec
  assert.equal("cozystack-migration-hook", pod.serviceAccountName)
  assert.equal("Never", pod.restartPolicy)
  assert.equal(60, pod.terminationGracePeriodSeconds)
  assert.same({ runAsNonRoot = true, runAsUser = 65532, runAsGroup = 65532,
    seccompProfile = { type = "RuntimeDefault" } }, pod.securityContext)
  assert.equal(1, #pod.containers)
  local c = pod.containers[1]
  assert.equal("migration", c.name)
  assert.equal(IMAGE, c.image)
  assert.equal("IfNotPresent", c.imagePullPolicy)
  assert.same({ "run" }, c.args)
  assert.equal("FallbackToLogsOnError", c.terminationMessagePolicy)
  local env = {
    { name = "NAMESPACE", value = NS },
    { name = "CURRENT_VERSION", value = want.current },
    { name = "TARGET_VERSION", value = "60" },
    { name = "ETCD_ADOPT_SKIP_BACKUP", value = want.skip },
    { name = "POD_NAME", valueFrom = { fieldRef = { fieldPath = "metadata.name" } } },
  }
  if want.legacy then env[#env + 1] = { name = "HOME", value = "/tmp" } end
  for _, e in ipairs(want.extra_env or {}) do env[#env + 1] = e end
  assert.same(env, c.env)
  assert.same(want.resources, c.resources)
  assert.same({ readOnlyRootFilesystem = true, allowPrivilegeEscalation = false,
    capabilities = { drop = { "ALL" } } }, c.securityContext)
  assert.same({ { name = "tmp", mountPath = "/tmp" } }, c.volumeMounts)
  assert.same({ { name = "tmp", emptyDir = {} } }, pod.volumes)
end

-- The preflight Job and its read-only RBAC.
local function assert_preflight(objects, want)
  local job = assert(find(objects, "Job", "cozystack-migration-preflight"))
  assert.same({ ["helm.sh/hook"] = "pre-upgrade,pre-install", ["helm.sh/hook-weight"] = "0",
    ["helm.sh/hook-delete-policy"] = "before-hook-creation" }, job.metadata.annotations)
  assert.equal(1, job.spec.backoffLimit)
  assert.equal("true", job.spec.template.metadata.labels["policy.cozystack.io/allow-to-apiserver"])
  local pod = job.spec.template.spec
  assert.equal("cozystack-migration-preflight", pod.serviceAccountName)
  assert.equal("Never", pod.restartPolicy)
  local c = pod.containers[1]
  assert.equal(IMAGE, c.image)
  assert.same({ "check", "--service-account", "cozystack-migration-hook" }, c.args)
  assert.equal("FallbackToLogsOnError", c.terminationMessagePolicy)
  assert.same({ { name = "NAMESPACE", value = NS }, { name = "TARGET_VERSION", value = "60" },
    { name = "POD_NAME", valueFrom = { fieldRef = { fieldPath = "metadata.name" } } } }, c.env)
  assert.same(want.resources, c.resources)
  assert.is_true(c.securityContext.readOnlyRootFilesystem)

  local got = rbac_of(objects, "preflight")
  assert.same(by_name(generated({ "rbac", "--all", "--preflight", "--namespace", NS, "--output", "json" })),
    by_name(got))
  -- read-only: reviews are the only writes, and the reviews are asked for
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
end

-- Every object a pending render holds, and the hook's RBAC exactly as
-- `cozy-migrate rbac --all` generates it (cluster-admin only for legacy).
local function assert_pending(objects, want)
  local expected = {}
  for _, o in ipairs(generated({ "rbac", "--all", "--namespace", NS, "--output", "json" }, want.legacy)) do
    expected[#expected + 1] = o.kind .. "/" .. o.metadata.name
  end
  expected[#expected + 1] = "Job/cozystack-migration-hook"
  if want.preflight then
    for _, o in ipairs(generated({ "rbac", "--all", "--preflight", "--namespace", NS, "--output", "json" })) do
      expected[#expected + 1] = o.kind .. "/" .. o.metadata.name
    end
    expected[#expected + 1] = "Job/cozystack-migration-preflight"
  end
  table.sort(expected)
  assert.same(expected, names(objects))

  assert_job(assert(find(objects, "Job", "cozystack-migration-hook")), want)
  local rbac = rbac_of(objects, "migration")
  assert.same(by_name(generated({ "rbac", "--all", "--namespace", NS, "--output", "json" }, want.legacy)),
    by_name(rbac))
  local admin = find(rbac, "ClusterRoleBinding", "cozystack-migration-hook-cluster-admin")
  assert.equal(want.legacy, admin ~= nil)
  for _, o in ipairs(rbac) do
    if o.roleRef and o.metadata.name ~= "cozystack-migration-hook-cluster-admin" then
      assert.are_not.equal("cluster-admin", o.roleRef.name)
    end
    -- before the preflight (0) and the Job (1), deleted once the upgrade's hooks succeeded
    local ann = {}
    for k, v in pairs(find(objects, o.kind, o.metadata.name).metadata.annotations) do
      if k:match("^helm%.sh/") then ann[k] = v end
    end
    assert.same({ ["helm.sh/hook"] = "pre-upgrade,pre-install", ["helm.sh/hook-weight"] = "-1",
      ["helm.sh/hook-delete-policy"] = "before-hook-creation,hook-succeeded" }, ann)
  end
  if want.preflight then assert_preflight(objects, want.preflight) end
end

-- deploy/helm/values.yaml's resources
local RESOURCES = { requests = { cpu = "100m", memory = "64Mi" }, limits = { memory = "256Mi" } }
local PREFLIGHT = { resources = { requests = { cpu = "50m", memory = "32Mi" }, limits = { memory = "128Mi" } } }

local function pending(current, skip, extra)
  local want = { current = current, skip = skip, legacy = false, preflight = PREFLIGHT, resources = RESOURCES }
  for k, v in pairs(extra or {}) do want[k] = v end
  return want
end

-- One row: the cluster's version ConfigMap (`version`: a number, "nodata" for
-- a ConfigMap without data, nil for none), the values file's text, and what
-- renders (nil: nothing at all).
local ROWS = {
  { "no ConfigMap (a fresh install): nothing, not even the ConfigMap (the platform's own template stamps it)",
    version = nil },
  { "a ConfigMap without data counts as version 0", version = "nodata", want = pending("0", "0") },
  { "version below the target", version = 59, want = pending("59", "0") },
  { "version at the target", version = 60 },
  { "version above the target", version = 61 },
  { "migrations.enabled false", version = 59, values = "migrations:\n  enabled: false\n" },
  { "etcdAdoptSkipBackup bool true", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: true\n",
    want = pending("59", "1") },
  { "etcdAdoptSkipBackup bool false", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: false\n",
    want = pending("59", "0") },
  { "etcdAdoptSkipBackup string \"true\"", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: \"true\"\n",
    want = pending("59", "1") },
  { "etcdAdoptSkipBackup string \"Yes\"", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: \"Yes\"\n",
    want = pending("59", "1") },
  { "etcdAdoptSkipBackup string \"1\"", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: \"1\"\n",
    want = pending("59", "1") },
  { "etcdAdoptSkipBackup string \"false\"", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: \"false\"\n",
    want = pending("59", "0") },
  { "etcdAdoptSkipBackup number 1", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: 1\n",
    want = pending("59", "1") },
  { "etcdAdoptSkipBackup number 0", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: 0\n",
    want = pending("59", "0") },
  { "etcdAdoptSkipBackup garbage", version = 59, values = "migrations:\n  etcdAdoptSkipBackup: \"sure, why not\"\n",
    want = pending("59", "0") },
  { "etcdAdoptSkipBackup absent (null removes the key)", version = 59,
    values = "migrations:\n  etcdAdoptSkipBackup: null\n", want = pending("59", "0") },
  { "legacyScripts on: cluster-admin for the run, HOME for kubectl", version = 58,
    values = "migrations:\n  legacyScripts: true\n", want = pending("58", "0", { legacy = true }) },
  { "legacyScripts off", version = 58, values = "migrations:\n  legacyScripts: false\n", want = pending("58", "0") },
  { "preflight off", version = 59, values = "migrations:\n  preflight:\n    enabled: false\n",
    want = pending("59", "0", { preflight = false }) },
  { "extraEnv after the chart's own", version = 59,
    values = "migrations:\n  extraEnv:\n    - name: COZY_EXTRA\n      value: x\n",
    want = pending("59", "0", { extra_env = { { name = "COZY_EXTRA", value = "x" } } }) },
}

-- The namespaces besides NS that the generated RBAC names (a migration's
-- Role in the namespace it works in): a platform cluster has them, and the
-- server-side dry run refuses an object in a namespace that does not exist.
local function rbac_namespaces()
  local seen, out = { [NS] = true }, {}
  for _, preflight in ipairs({ false, true }) do
    local args = { "rbac", "--all", "--namespace", NS, "--output", "json" }
    if preflight then args[#args + 1] = "--preflight" end
    for _, o in ipairs(generated(args)) do
      local ns = o.metadata.namespace
      if ns and not seen[ns] then
        seen[ns] = true
        out[#out + 1] = { apiVersion = "v1", kind = "Namespace", metadata = { name = ns } }
      end
    end
  end
  return out
end

local function fixture(version)
  local extra = rbac_namespaces()
  if version == "nodata" then
    extra[#extra + 1] = { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "cozystack-version", namespace = NS } }
    return cli.fixture(nil, extra)
  end
  return cli.fixture(version, extra)
end

describe("deploy/helm rendered by real Helm", function()
  local srv
  setup(function() srv = fake.start { server = "real", tls = true, token = "t", fixtures = { cli.fixture(59) } } end)
  teardown(function() if srv then srv:stop() end end)

  it("builds Helm v3.19.5 and kubectl v1.34.2, the control plane's release", function()
    local r = cli.shell(HELM .. " version --template '{{ .Version }}'")
    assert.equal(0, r.code, r.stderr)
    assert.equal("v3.19.5", r.stdout)
    r = cli.shell(KUBECTL .. " version --client -o json")
    assert.equal(0, r.code, r.stderr)
    assert.equal("v1.34.2", json.decode(r.stdout).clientVersion.gitVersion)
  end)

  for _, row in ipairs(ROWS) do
    it(row[1], function()
      srv:reset(fixture(row.version))
      local objects, text = render(srv, row.values)
      if not row.want then
        assert.same({}, names(objects))
        return
      end
      assert_pending(objects, row.want)
      server_accepts(srv, text, objects)
    end)
  end

  it("a plain `helm template` has no cluster to look up: it renders nothing, so each row's state is the server's",
    function()
      srv:reset(fixture(59))
      assert.same({}, names(render(srv, nil, { client_only = true })))
      assert.truthy(find(render(srv, nil), "Job", "cozystack-migration-hook"))
    end)

  it("passes migrations.parameters as environment of both Jobs, after the chart's own", function()
    srv:reset(fixture(59))
    local objects, text = render(srv, "migrations:\n  parameters:\n    ETCD_CRD_DIR: /etcd-operator-crds\n"
      .. "    SPEC_FLAG: true\n    SPEC_COUNT: 3\n")
    local want = { { name = "ETCD_CRD_DIR", value = "/etcd-operator-crds" }, { name = "SPEC_COUNT", value = "3" },
      { name = "SPEC_FLAG", value = "true" } }
    for _, name in ipairs({ "cozystack-migration-hook", "cozystack-migration-preflight" }) do
      local env = assert(find(objects, "Job", name)).spec.template.spec.containers[1].env
      local got = {}
      for _, e in ipairs(env) do
        if e.name:find("^SPEC_") or e.name == "ETCD_CRD_DIR" then got[#got + 1] = e end
      end
      assert.same(want, got)
    end
    server_accepts(srv, text, objects)
  end)

  it("refuses a migrations.parameters name that is not an environment variable name", function()
    srv:reset(fixture(59))
    local dir = cli.tmpdir()
    finally(function() files.rm_rf(dir) end)
    files.write(dir .. "/values.yaml", "migrations:\n  parameters:\n    bad-name: x\n")
    local r = helm(dir, ("template cozystack %s --namespace %s --dry-run=server --kubeconfig %s --values %s"):format(
      CHART, NS, q(srv.kubeconfig), q(dir .. "/values.yaml")))
    assert.equal(1, r.code, r.stdout)
    assert.matches('migrations.parameters: "bad-name" is not an environment variable name', r.stderr, 1, true)
  end)

  it("drops into a chart with the platform's values alone: its four keys render the hook", function()
    local dir = cli.tmpdir()
    finally(function() files.rm_rf(dir) end)
    assert.is_true(files.sh(("mkdir -p %s/templates && cp %s/templates/migration-hook.yaml %s/templates/"):format(
      q(dir), CHART, q(dir))) == 0)
    files.write(dir .. "/Chart.yaml", "apiVersion: v2\nname: platform\nversion: 1.0.0\n")
    files.write(dir .. "/values.yaml", "migrations:\n  enabled: false\n  image: " .. IMAGE
      .. "\n  targetVersion: 60\n  etcdAdoptSkipBackup: false\n")
    srv:reset(fixture(57))
    local objects, text = render(srv, "migrations:\n  enabled: true\n  etcdAdoptSkipBackup: \"yes\"\n",
      { chart = dir })
    -- the platform's scripts declare no permissions: cluster-admin, as the
    -- platform's hook binds; no resources and the default pull policy
    assert_pending(objects, { current = "57", skip = "1", legacy = true, preflight = { resources = nil },
      resources = nil })
    server_accepts(srv, text, objects)
  end)
end)
