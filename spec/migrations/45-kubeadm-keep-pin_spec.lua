-- Migration 45-kubeadm-keep-pin on the spec harness, and beside the platform's
-- script 45 (spec/helpers/differential.lua): the same fixtures, run by both,
-- compared object by object. Differences are the shell's, listed in
-- docs/migrations/45-kubeadm-keep-pin.md with the case that shows each.
local harness = require "spec.helpers"
local differential = require("spec.helpers").differential

local GROUP = "bootstrap.cluster.x-k8s.io"

-- Cluster API's bootstrap CRDs, with an open schema
local function crd(plural, kind) return differential.crd(GROUP, "v1beta1", plural, kind) end

local function bootstrap(kind, ns, name, helm, keep)
  local md = { name = name, namespace = ns, labels = { ["cluster.x-k8s.io/cluster-name"] = "kubernetes-alpha" } }
  if helm then md.labels["app.kubernetes.io/managed-by"] = "Helm" end
  if keep then md.annotations = { ["helm.sh/resource-policy"] = "keep" } end
  md.annotations = md.annotations or {}
  md.annotations["meta.helm.sh/release-name"] = "kubernetes-alpha"
  local spec = kind == "KubeadmConfigTemplate" and { template = { spec = { joinConfiguration = { nodeRegistration = {} } } } }
    or { joinConfiguration = { nodeRegistration = {} } }
  return { apiVersion = GROUP .. "/v1beta1", kind = kind, metadata = md, spec = spec }
end

local function cluster(with_crds, ...)
  local objects = with_crds and { crd("kubeadmconfigtemplates", "KubeadmConfigTemplate"), crd("kubeadmconfigs", "KubeadmConfig") }
    or {}
  for _, o in ipairs { ... } do objects[#objects + 1] = o end
  return differential.cluster(45, { "cozy-system", "tenant-a" }, objects)
end

-- md0: Helm's, unpinned (pinned); md1: Helm's, pinned already; manual: not Helm's (left);
-- a KubeadmConfig of Helm's (pinned)
local FLEET = cluster(true,
  bootstrap("KubeadmConfigTemplate", "tenant-a", "kubernetes-alpha-md0", true, false),
  bootstrap("KubeadmConfigTemplate", "tenant-a", "kubernetes-alpha-md1", true, true),
  bootstrap("KubeadmConfigTemplate", "tenant-a", "manual", false, false),
  bootstrap("KubeadmConfig", "tenant-a", "kubernetes-alpha-cp", true, false))

local function policy(d, side, kind, name)
  return differential.field(d, side, kind .. " tenant-a/" .. name, "metadata", "annotations", "helm.sh/resource-policy")
end

local MD0_PATCH = "kubeadmconfigtemplates/kubernetes-alpha-md0(\\?|$)"

describe("migration 45-kubeadm-keep-pin", function()
  local h = harness.fake { fixtures = { FLEET } }

  it("its code is at most 1.5x its shell's (blank and comment lines not counted) #platform", function()
    local c = differential.line_counts(45, harness.migration_file(45))
    assert.equal(66, c.shell)
    assert(c.ratio <= 1.5, ("45: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("pins every Helm-managed one that is not pinned, as the shell does #platform", function()
    local d = differential.run(h, 45, FLEET)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.matches("patched=2 skipped=1 failures=0", d.shell.stdout, 1, true)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.equal("keep", policy(d, "port", "KubeadmConfigTemplate", "kubernetes-alpha-md0"))
    assert.equal("keep", policy(d, "port", "KubeadmConfig", "kubernetes-alpha-cp"))
    assert.is_nil(policy(d, "port", "KubeadmConfigTemplate", "manual"))
    assert.equal(2, #d.port.writes)
  end)

  it("writes nothing when all are pinned (the target state), as the shell #platform", function()
    local fleet = cluster(true, bootstrap("KubeadmConfigTemplate", "tenant-a", "kubernetes-alpha-md1", true, true),
      bootstrap("KubeadmConfigTemplate", "tenant-a", "manual", false, false))
    local d = differential.run(h, 45, fleet)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("has nothing to do when Cluster API's CRDs are absent, as the shell #platform", function()
    local d = differential.run(h, 45, cluster(false))
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.matches("kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io not served", d.port.result.log, 1, true)
    assert.same({}, differential.differences(d))
    assert.same({}, d.port.writes)
  end)

  it("one deleted between the list and its patch: gone on both; the shell fails the upgrade (its bug), the port goes on #platform", function()
    local d = differential.run(h, 45, FLEET, { faults = { { method = "PATCH", path = MD0_PATCH, delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.same({}, differential.differences(d))
    assert.equal(1, d.shell.code)
    assert.matches("failed to annotate kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io tenant-a/kubernetes-alpha-md0",
      d.shell.stderr, 1, true)
    assert.is_true(d.port.ok)
  end)

  it("a patch that keeps failing: the others pinned, then the step fails naming it, as the shell #fakeonly #platform", function()
    local d = differential.run(h, 45, FLEET,
      { faults = { { method = "PATCH", path = MD0_PATCH, times = -1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.equal("status", d.port.fired[1])
    assert.equal(1, d.shell.code)
    assert.is_false(d.port.ok)
    assert.matches("1 annotation(s) failed (kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io tenant-a/kubernetes-alpha-md0)",
      d.port.err.message, 1, true)
    assert.same({}, differential.differences(d))
    assert.equal("keep", policy(d, "port", "KubeadmConfig", "kubernetes-alpha-cp"))
  end)

  it("a list that fails once: the port retries and pins; the shell fails the upgrade (its bug) #fakeonly #platform", function()
    local d = differential.run(h, 45, FLEET,
      { faults = { { method = "GET", path = "/kubeadmconfigtemplates\\?", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(1, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ "KubeadmConfig tenant-a/kubernetes-alpha-cp", "KubeadmConfigTemplate tenant-a/kubernetes-alpha-md0" },
      differential.differences(d))
  end)

  it("is idempotent", function() assert.migration_idempotent(45) end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(45)
    assert.equal("keep", h:object("KubeadmConfig", "tenant-a", "kubernetes-alpha-cp").metadata.annotations["helm.sh/resource-policy"])
  end)

  it("check lists the patches run would make, and sends nothing", function()
    local res = h:migrate(45, { mode = "check" })
    assert.no_writes()
    local names = differential.finding_names(res, "verb resource name")
    assert.same({ "patch kubeadmconfigs kubernetes-alpha-cp", "patch kubeadmconfigtemplates kubernetes-alpha-md0" }, names)
  end)
end)
