-- Fidelity of a rehearsal (issue 36): two servers loaded from one fixture;
-- `plan -o json` on A, `run` on B with the same migrations. Every object the
-- plan lists (created, changed, deleted) ends on B as the plan's "after"
-- predicted, server-set fields aside, unless the plan marks it inexact;
-- nothing changed on B that the plan did not list; A did not move at all.
-- The range: Lua steps and legacy scripts (spec/fixtures/plan_fidelity,
-- numbered as the spec assembles them in a temporary directory): a namespace
-- created then objects in it; a script labelling what an earlier step made;
-- a delete then a re-create (Lua and kubectl); kubectl's strategic merge
-- patch of a Deployment an earlier step created and another changed, and of
-- a live one an earlier step changed (merged three-way, held to it); a
-- script whose stamp (or not) decides what the next step sees. The #platform
-- case puts the platform's own scripts 44 and 45 at their numbers (read from
-- $COZY_PLATFORM_MIGRATIONS, never copied here; spec/helpers/differential.lua).
-- Runs on both servers; the real one (REAL_SERVER_SPECS) is what judges.
local differential = require("spec.helpers").differential
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local FIXTURES = "spec/fixtures/plan_fidelity/"
local q = files.quote

-- the scripts' kubectl: the one the kubectl specs use, first in PATH
local KUBECTL_DIR = fake.kubectl_path:match("^(.*)/[^/]+$")
local PATH = (KUBECTL_DIR and (files.absolute(KUBECTL_DIR) .. ":") or "") .. os.getenv("PATH")

local CAPI = "bootstrap.cluster.x-k8s.io"

local function namespace(name)
  return { apiVersion = "v1", kind = "Namespace", metadata = { name = name } }
end

-- Flux's HelmRelease CRD, as the platform installs it (the real server has its own)
local function hr_crd()
  for _, o in ipairs(json.decode(assert(files.read("spec/fixtures/55-fluxcd-addon-orphan/cluster.json"))).items) do
    if o.kind == "CustomResourceDefinition" then return o end
  end
end

local function helmrelease(name, shard)
  return { apiVersion = "helm.toolkit.fluxcd.io/v2", kind = "HelmRelease",
    metadata = { name = name, namespace = "tenant-a", labels = { ["sharding.fluxcd.io/key"] = shard } },
    spec = { interval = "5m", releaseName = name,
      chartRef = { kind = "ExternalArtifact", name = "cozystack-apps-" .. name, namespace = "cozy-system" } } }
end

-- Cluster API's bootstrap CRDs (platform script 45 pins their Helm-managed objects), open schema
local function capi_crd(plural, kind)
  return { apiVersion = "apiextensions.k8s.io/v1", kind = "CustomResourceDefinition",
    metadata = { name = plural .. "." .. CAPI },
    spec = { group = CAPI, scope = "Namespaced",
      names = { plural = plural, singular = kind:lower(), kind = kind, listKind = kind .. "List" },
      versions = { { name = "v1beta1", served = true, storage = true, schema = { openAPIV3Schema = { type = "object",
        properties = { spec = { type = "object", ["x-kubernetes-preserve-unknown-fields"] = true } } } } } } } }
end

local function bootstrap(kind, name, helm)
  local md = { name = name, namespace = "tenant-a", labels = { ["cluster.x-k8s.io/cluster-name"] = "kubernetes-alpha" },
    annotations = { ["meta.helm.sh/release-name"] = "kubernetes-alpha" } }
  if helm then md.labels["app.kubernetes.io/managed-by"] = "Helm" end
  local spec = kind == "KubeadmConfigTemplate" and { template = { spec = { joinConfiguration = {
    nodeRegistration = { name = "x" } } } } } or { joinConfiguration = { nodeRegistration = { name = "x" } } }
  return { apiVersion = CAPI .. "/v1beta1", kind = kind, metadata = md, spec = spec }
end

-- The one fixture both servers load: version 40, what the steps change, and what they must leave alone.
local FIXTURE = cli.fixture(40, {
  namespace("cozy-fluxcd"), namespace("tenant-a"), hr_crd(),
  capi_crd("kubeadmconfigtemplates", "KubeadmConfigTemplate"), capi_crd("kubeadmconfigs", "KubeadmConfig"),
  cli.configmap("old", { original = "yes" }),
  cli.configmap("replaced", { original = "yes" }),
  cli.configmap("untouched", { original = "yes" }),
  helmrelease("postgres-a", "shard1"), helmrelease("kafka-a", "tenants"),
  { apiVersion = "apps/v1", kind = "Deployment",
    metadata = { name = "flux-tenants", namespace = "cozy-fluxcd", labels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
    spec = { replicas = 1, selector = { matchLabels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
      template = { metadata = { labels = { ["app.kubernetes.io/name"] = "flux-tenants" } },
        spec = { containers = { { name = "manager", image = "ghcr.io/fluxcd/helm-controller:v1.3.0" } } } } } },
  -- live, labelled by a script (app=fidelity) and then patched by kubectl's strategic merge
  { apiVersion = "apps/v1", kind = "Deployment",
    metadata = { name = "api", namespace = "cozy-system", labels = { app = "fidelity" } },
    spec = { replicas = 1, selector = { matchLabels = { run = "api" } },
      template = { metadata = { labels = { run = "api" } }, spec = { containers = {
        { name = "app", image = "nginx:1.27", env = { { name = "MODE", value = "one" } } },
        { name = "sidecar", image = "busybox:1.36", args = { "sleep", "infinity" } } } } } } },
  bootstrap("KubeadmConfigTemplate", "kubernetes-alpha-md0", true),
  bootstrap("KubeadmConfigTemplate", "manual", false),
  bootstrap("KubeadmConfig", "kubernetes-alpha-cp", true),
})

-- A migrations directory: each { number, fixture file } copied as N-name
-- (N-name.lua for Lua), or { number, platform = n }: the platform's script n
-- as the file N, with its lib/ beside it as run-migrations.sh expects.
local function assemble(steps)
  local dir = cli.tmpdir()
  for _, s in ipairs(steps) do
    if s.platform then
      local script = differential.script(s.platform)
      -- copies made writable, so that the temporary directory can be removed
      assert(files.sh(("cp %s %s/%d && { test -d %s/lib || cp -R %s/lib %s/; } && chmod -R u+w %s"):format(q(script),
        q(dir), s[1], q(dir), q(script:match("^(.*)/[^/]+$")), q(dir), q(dir))) == 0)
    else
      local name = s[2]:gsub("%.lua$", "")
      local ext = s[2]:match("%.lua$") and ".lua" or ""
      assert(files.sh(("cp -p %s %s/%d-%s%s"):format(q(FIXTURES .. s[2]), q(dir), s[1], name, ext)) == 0)
    end
  end
  return dir
end

-- metadata the server sets, left out of both sides (changes.SERVER_SET)
local SERVER_SET = { "resourceVersion", "uid", "generation", "creationTimestamp", "managedFields", "selfLink",
  "deletionTimestamp" }

local function stripped(o)
  if type(o) ~= "table" then return o end
  o = json.decode(json.encode(o))
  for _, k in ipairs(SERVER_SET) do o.metadata[k] = nil end
  return o
end

local function key(group, kind, ns, name)
  return ("%s%s %s%s"):format(kind, (group and group ~= "") and ("." .. group) or "", ns and (ns .. "/") or "", name)
end

local function key_of(o)
  return key(o.apiVersion:match("^(.*)/") or "", o.kind, o.metadata.namespace, o.metadata.name)
end

-- What a run of the runner leaves beside its objects and what the control
-- plane keeps moving: the run's Events, the runner's Lease, the API
-- servers' own Leases.
local function bookkeeping(o)
  return o.kind == "Event" or (o.kind == "Lease" and (o.metadata.namespace == "kube-system"
    or o.metadata.name == "cozystack-migrations"))
end

-- Every stored object but the bookkeeping, by key, server-set metadata left out.
local function state(h)
  local out = {}
  for _, o in ipairs(h:objects()) do
    if not bookkeeping(o) then out[key_of(o)] = stripped(o) end
  end
  return out
end

local function show(v)
  if type(v) == "table" then return json.encode(v) end
  return tostring(v)
end

-- The paths where a and b differ, "path: a ~= b" each, in key order.
local function differences(a, b, path, out)
  out = out or {}
  if type(a) ~= "table" or type(b) ~= "table" then
    if a ~= b then out[#out + 1] = ("%s: %s ~= %s"):format(path, show(a), show(b)) end
    return out
  end
  local keys, seen = {}, {}
  for k in pairs(a) do if not seen[k] then seen[k] = true keys[#keys + 1] = k end end
  for k in pairs(b) do if not seen[k] then seen[k] = true keys[#keys + 1] = k end end
  table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
  for _, k in ipairs(keys) do differences(a[k], b[k], path .. "." .. tostring(k), out) end
  return out
end

-- The stamp: its version, and its history without the times and the runner's identity.
local function stamp_of(cm)
  local records = {}
  for _, r in ipairs(json.decode(cm.data.history or "[]")) do
    records[#records + 1] = { number = r.number, name = r.name, kind = r.kind, sha256 = r.sha256, from = r.from,
      to = r.to, result = r.result, version = r.version, reason = r.reason, outcome = r.outcome }
  end
  return { version = cm.data.version, history = records }
end

local STAMP = key("", "ConfigMap", "cozy-system", "cozystack-version")

local function plan(h, dir)
  return h:cli(cli.args(h.srv, dir, "plan", "-o", "json"), { PATH = PATH })
end

local function run(h, dir)
  return h:cli(cli.args(h.srv, dir, "run"), { PATH = PATH })
end

-- Rehearses dir on A and runs it on B; asserts fidelity. Returns the plan's
-- document, the objects by "action key", the inexact ones with their
-- reasons and differences, and B's state after.
local function rehearse_and_run(a, b, dir)
  local a_before = cli.stored_versions(a)
  local b_before = state(b)
  local p = plan(a, dir)
  -- A did not move at all (first: a write that reached it can also be why the plan failed)
  assert.same(a_before, cli.stored_versions(a))
  assert.equal(0, p.code, p.stdout .. p.stderr)
  local doc = json.decode(p.stdout)
  assert.equal(0, doc.exit)
  local r = run(b, dir)
  assert.equal(0, r.code, r.stdout .. r.stderr)
  local b_after = state(b)
  local listed, actions, inexact, wrong = {}, {}, {}, {}
  for _, o in ipairs(doc.objects) do
    local k = key(o.group, o.kind, o.namespace, o.name)
    listed[k] = true
    actions[#actions + 1] = o.action .. " " .. k
    local actual = b_after[k]
    local diffs
    if k == STAMP then
      -- the history's times and runner identity are the run's own
      diffs = differences(stamp_of(o.after), actual and stamp_of(actual), "stamp")
    elseif o.action == "deleted" then
      diffs = actual and { "deleted, but B holds " .. show(actual) } or {}
    else
      diffs = differences(stripped(o.after), actual, "")
    end
    if o.inexact then
      inexact[k] = { why = o.inexact, differences = diffs }
    elseif #diffs > 0 then
      wrong[#wrong + 1] = o.action .. " " .. k .. ":\n  " .. table.concat(diffs, "\n  ")
    end
  end
  -- every object the plan did not mark inexact ends as it predicted
  assert.same({}, wrong)
  -- nothing changed on B that the plan did not list
  local unlisted = {}
  for k, o in pairs(b_after) do
    if not listed[k] and #differences(b_before[k], o, "") > 0 then unlisted[#unlisted + 1] = k end
  end
  for k in pairs(b_before) do
    if not listed[k] and b_after[k] == nil then unlisted[#unlisted + 1] = k .. " (gone)" end
  end
  table.sort(unlisted)
  assert.same({}, unlisted)
  table.sort(actions)
  return { doc = doc, actions = actions, inexact = inexact, b = b_after, stderr = p.stderr .. r.stderr }
end

-- The objects marked inexact, each "key: why" with the reason cut at its first colon.
local function inexact_keys(res)
  local out = {}
  for k, v in pairs(res.inexact) do out[#out + 1] = k .. ": " .. v.why:match("^[^:]*") end
  table.sort(out)
  return out
end

-- Why each object is inexact: a ConfigMap of a namespace only the rehearsal
-- holds (validated in cozy-system). kubectl's apply of the stamp and its
-- strategic merge of api, live objects earlier steps changed, are merged
-- three-way; its strategic merge of web, which only the rehearsal holds, is
-- applied by the engine (containers and env by name); all held to their
-- prediction.
local INEXACT = {
  "ConfigMap fidelity-made/made: configmaps fidelity-made/made validated in namespace cozy-system",
}

describe("a rehearsal predicts the run", function()
  local a = harness.fake { fixtures = { FIXTURE } }
  local b = harness.fake { fixtures = { FIXTURE } }
  local dir
  after_each(function() if dir then files.rm_rf(dir) end dir = nil end)

  it("leaves the live object a script's kubectl delete names: its DeleteOptions body is a dry run too", function()
    -- kube-apiserver reads a DELETE's options from its body when it has one, and kubectl always sends one
    -- ({"propagationPolicy":"Background"}): dryRun=All in the query alone is not a dry run there
    dir = cli.migration_dir { ["40-deletes"] = table.concat({ "#!/bin/sh", "set -eu",
      'kubectl -n "$NAMESPACE" delete configmap untouched',
      [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"41"}}']], "" },
      "\n") }
    local before = cli.stored_versions(a)
    local p = plan(a, dir)
    assert.same(before, cli.stored_versions(a))
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local listed = {}
    for _, o in ipairs(json.decode(p.stdout).objects) do listed[#listed + 1] = o.action .. " " .. o.name end
    assert.same({ "changed cozystack-version", "deleted untouched" }, listed)
  end)

  it("object by object, over Lua steps and the spec's own legacy scripts", function()
    dir = assemble { { 40, "create.lua" }, { 41, "label" }, { 42, "replace" }, { 43, "strategic" }, { 44, "gate" },
      { 45, "observe.lua" } }
    local res = rehearse_and_run(a, b, dir)
    assert.same({
      "changed ConfigMap cozy-system/cozystack-version",
      "changed ConfigMap cozy-system/old",
      "changed ConfigMap cozy-system/replaced",
      "changed Deployment.apps cozy-system/api",
      "changed HelmRelease.helm.toolkit.fluxcd.io tenant-a/kafka-a",
      "created ConfigMap cozy-system/gate",
      "created ConfigMap cozy-system/observed",
      "created ConfigMap fidelity-made/made",
      "created Deployment.apps cozy-system/web",
      "created Namespace fidelity-made",
    }, res.actions)
    -- the gate found flux-tenants and stamped: the last step saw version 45 and five records
    assert.same({ decided = "stamped" }, res.b[key("", "ConfigMap", "cozy-system", "gate")].data)
    assert.same({ version = "45", records = "5", labelled = "3" },
      res.b[key("", "ConfigMap", "cozy-system", "observed")].data)
    assert.equal("46", res.b[STAMP].data.version)
    -- the strategic merges kept the sidecar and merged the container by name, as the plan predicted
    for _, name in ipairs { "web", "api" } do
      local c = res.b[key("apps", "Deployment", "cozy-system", name)].spec.template.spec.containers
      assert.same({ "app", "nginx:1.28", "LEVEL", "sidecar" }, { c[1].name, c[1].image, c[1].env[1].name, c[2].name })
    end
    assert.equal("by-script", res.b[key("apps", "Deployment", "cozy-system", "api")].metadata.labels.labelled)
    assert.same(INEXACT, inexact_keys(res))
  end)

  it("object by object, with the platform's scripts 44 and 45 at their numbers #platform", function()
    dir = assemble { { 40, "create.lua" }, { 41, "label" }, { 42, "replace" }, { 43, "strategic" },
      { 44, platform = 44 }, { 45, platform = 45 }, { 46, "gate" }, { 47, "observe.lua" } }
    local res = rehearse_and_run(a, b, dir)
    assert.same({
      "changed ConfigMap cozy-system/cozystack-version",
      "changed ConfigMap cozy-system/old",
      "changed ConfigMap cozy-system/replaced",
      "changed Deployment.apps cozy-system/api",
      "changed HelmRelease.helm.toolkit.fluxcd.io tenant-a/kafka-a",
      "changed KubeadmConfig.bootstrap.cluster.x-k8s.io tenant-a/kubernetes-alpha-cp",
      "changed KubeadmConfigTemplate.bootstrap.cluster.x-k8s.io tenant-a/kubernetes-alpha-md0",
      "created ConfigMap cozy-system/gate",
      "created ConfigMap cozy-system/observed",
      "created ConfigMap fidelity-made/made",
      "created Deployment.apps cozy-system/web",
      "created Namespace fidelity-made",
      "deleted Deployment.apps cozy-fluxcd/flux-tenants",
    }, res.actions)
    -- 44 removed flux-tenants (the HelmRelease step 41 moved off the tenants shard was the last on it), so the
    -- gate left the version at 46 and the last step saw it there, after seven records
    assert.same({ decided = "left" }, res.b[key("", "ConfigMap", "cozy-system", "gate")].data)
    assert.same({ version = "46", records = "7", labelled = "3" },
      res.b[key("", "ConfigMap", "cozy-system", "observed")].data)
    local st = stamp_of(res.b[STAMP])
    assert.equal("48", st.version)
    assert.equal("unstamped", st.history[7].result)
    assert.equal("keep", res.b[key(CAPI, "KubeadmConfigTemplate", "tenant-a", "kubernetes-alpha-md0")]
      .metadata.annotations["helm.sh/resource-policy"])
    assert.same(INEXACT, inexact_keys(res))
  end)
end)
