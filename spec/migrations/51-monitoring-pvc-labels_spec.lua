-- Migration 51-monitoring-pvc-labels on the spec harness (spec/README.md): the storage
-- PVCs of each cozystack-managed VMCluster and VLCluster get the cluster's
-- apps.cozystack.io/application.name; no other PVC changes.
local harness = require "spec.helpers"
local differential = harness.differential

local KEY = "apps.cozystack.io/application.name"

local function crd(plural, kind)
  return differential.crd("operator.victoriametrics.com", "v1beta1", plural, kind, { open = "object" })
end
local VMCLUSTERS, VLCLUSTERS = crd("vmclusters", "VMCluster"), crd("vlclusters", "VLCluster")

local function cluster(kind, ns, name, app)
  return { apiVersion = "operator.victoriametrics.com/v1beta1", kind = kind, metadata = { name = name, namespace = ns },
    spec = { managedMetadata = app and { labels = { [KEY] = app } } or nil } }
end
local function pvc(ns, name, app)
  return { apiVersion = "v1", kind = "PersistentVolumeClaim",
    metadata = { name = name, namespace = ns, labels = app and { [KEY] = app } or nil },
    spec = { accessModes = { "ReadWriteOnce" }, resources = { requests = { storage = "1Gi" } } } }
end
local ns = differential.namespace

-- tenant-root: the managed VMCluster "monitoring" (one PVC already labelled), a user's own
-- VMCluster, the managed VLCluster "logs"; tenant-a: the managed VMCluster "my.db", whose
-- dot the shell's regex reads as any character, beside the PVC of an unmanaged "myxdb".
local OBJECTS = {
  ns("cozy-system"), ns("tenant-root"), ns("tenant-a"),
  cluster("VMCluster", "tenant-root", "monitoring", "monitoring"),
  cluster("VMCluster", "tenant-root", "user-own", nil),
  cluster("VLCluster", "tenant-root", "logs", "logs"),
  cluster("VMCluster", "tenant-a", "my.db", "mydb"),
  cluster("VMCluster", "tenant-a", "myxdb", nil),
  pvc("tenant-root", "vmstorage-db-vmstorage-monitoring-0"),
  pvc("tenant-root", "vmstorage-db-vmstorage-monitoring-1", "monitoring"),
  pvc("tenant-root", "vmselect-cachedir-vmselect-monitoring-0", "stale"),
  pvc("tenant-root", "vminsert-monitoring-0"),
  pvc("tenant-root", "vmstorage-db-vmstorage-user-own-0"),
  pvc("tenant-root", "data-vlstorage-logs-0"),
  pvc("tenant-a", "vmstorage-db-vmstorage-my.db-0"),
  pvc("tenant-a", "vmstorage-db-vmstorage-myxdb-0"),
}
local function fixture(with_crds, objects)
  local items = with_crds and { VMCLUSTERS, VLCLUSTERS } or {}
  for _, o in ipairs(objects or OBJECTS) do items[#items + 1] = o end
  return items
end
local CLUSTER = fixture(true)

-- What run must leave: each PVC's label (nil: none).
local WANT = {
  ["tenant-root/vmstorage-db-vmstorage-monitoring-0"] = "monitoring",
  ["tenant-root/vmstorage-db-vmstorage-monitoring-1"] = "monitoring",
  ["tenant-root/vmselect-cachedir-vmselect-monitoring-0"] = "monitoring",
  ["tenant-root/data-vlstorage-logs-0"] = "logs",
  ["tenant-a/vmstorage-db-vmstorage-my.db-0"] = "mydb",
}
local PATCHED = { "tenant-a/vmstorage-db-vmstorage-my.db-0", "tenant-root/data-vlstorage-logs-0",
  "tenant-root/vmselect-cachedir-vmselect-monitoring-0", "tenant-root/vmstorage-db-vmstorage-monitoring-0" }

local function pvc_labels(h)
  return differential.objects_of(h, "PersistentVolumeClaim", function(o) return (o.metadata.labels or {})[KEY] or false end)
end
local function want_labels()
  local out = {}
  for _, o in ipairs(OBJECTS) do
    if o.kind == "PersistentVolumeClaim" then
      local k = o.metadata.namespace .. "/" .. o.metadata.name
      out[k] = WANT[k] or false
    end
  end
  return out
end
local function patched(h) return differential.patched(h, "/namespaces/([^/]+)/persistentvolumeclaims/([^/]+)$") end

describe("migration 51-monitoring-pvc-labels", function()
  local h = harness.fake { fixtures = { CLUSTER } }

  it("labels the managed clusters' storage PVCs, the dot in a name a dot, and no other PVC", function()
    local res = h:migrate(51)
    assert.same(want_labels(), pvc_labels(h))
    assert.same(PATCHED, patched(h))
    assert.same({ failed = 0 }, res.outcome.counts)
    assert.is_nil(res.outcome.leave)
    assert.matches("tenant%-root/user%-own has no apps.cozystack.io/application.name", res.log)
  end)

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(51)
    assert.same(want_labels(), pvc_labels(h))
  end)

  it("declares every permission it uses #fakeonly", function()
    assert.permissions_complete(51)
    assert.same(want_labels(), pvc_labels(h))
  end)

  it("check lists the PVCs run would label, and writes nothing", function()
    local res = h:migrate(51, { mode = "check" })
    assert.no_writes()
    local names = differential.finding_names(res, "namespace/name")
    assert.same(PATCHED, names)
  end)

  it("has nothing to do when neither CRD is present", function()
    h:reset(fixture(false, { ns("cozy-system"), ns("tenant-root"), pvc("tenant-root", "vmstorage-db-vmstorage-monitoring-0") }))
    h.srv:delete_crd("vmclusters.operator.victoriametrics.com")   -- a real server keeps CRDs across resets
    h.srv:delete_crd("vlclusters.operator.victoriametrics.com")
    h:mark()
    local res = h:migrate(51)
    assert.no_writes()
    assert.matches("vmclusters.operator.victoriametrics.com not present", res.log)
    assert.matches("vlclusters.operator.victoriametrics.com not present", res.log)
    assert.is_nil(res.outcome.leave)
  end)

  it("PVCs already in the target state are not written", function()
    -- every PVC as run leaves it, the unlabelled ones left out (run writes none of them)
    local items = fixture(true, {})
    for _, o in ipairs(OBJECTS) do
      local want = o.kind == "PersistentVolumeClaim" and WANT[o.metadata.namespace .. "/" .. o.metadata.name]
      if want then items[#items + 1] = pvc(o.metadata.namespace, o.metadata.name, want)
      elseif o.kind ~= "PersistentVolumeClaim" then items[#items + 1] = o end
    end
    h:reset(items)
    h:migrate(51)
    assert.no_writes()
  end)

  it("a PVC deleted between the list and its patch is skipped, the others labelled", function()
    h:faults { { method = "PATCH", path = "/persistentvolumeclaims/data-vlstorage-logs-0(\\?|$)", delete = true } }
    local res = h:migrate(51)
    assert.same({ "delete" }, h:fired())
    local want = want_labels()
    want["tenant-root/data-vlstorage-logs-0"] = nil
    assert.same(want, pvc_labels(h))
    assert.is_nil(res.outcome.leave)
  end)

  it("a list that fails once is retried, and the work done #fakeonly", function()
    h:faults { { method = "GET", path = "/vmclusters(\\?|$)", times = 1, status = 500 } }
    local res = h:migrate(51)
    assert.same({ "status" }, h:fired())
    assert.same(want_labels(), pvc_labels(h))
    assert.is_nil(res.outcome.leave)
  end)

  it("a list that keeps failing leaves the version #fakeonly", function()
    h:faults { { method = "GET", path = "/vlclusters(\\?|$)", times = -1, status = { code = 500, message = "etcd down" } } }
    local res = h:migrate(51)
    assert.is_true(#h:fired() >= 1)
    assert.equal("a list failed: etcd down", res.outcome.leave)
  end)

  it("a patch that keeps failing is logged, the others labelled, and the version left #fakeonly", function()
    h:faults { { method = "PATCH", path = "/persistentvolumeclaims/vmstorage-db-vmstorage-monitoring-0(\\?|$)", times = -1,
      status = { code = 500, message = "etcd down" } } }
    local res = h:migrate(51)
    assert.is_true(#h:fired { method = "PATCH" } >= 1)
    local want = want_labels()
    want["tenant-root/vmstorage-db-vmstorage-monitoring-0"] = false
    assert.same(want, pvc_labels(h))
    assert.same({ failed = 1 }, res.outcome.counts)
    assert.equal("1 PVC(s) not labelled", res.outcome.leave)
  end)
end)

-- Beside the platform's script 51 (spec/helpers/differential.lua): the same fixtures
-- run by both, compared object by object (docs/migrations/51-monitoring-pvc-labels.md).
describe("migration 51-monitoring-pvc-labels beside the platform's script #platform", function()
  local h = harness.fake { fixtures = { CLUSTER } }
  local MYXDB = "PersistentVolumeClaim tenant-a/vmstorage-db-vmstorage-myxdb-0"

  it("its code is at most 1.5x its shell's (blank and comment lines not counted)", function()
    local c = differential.line_counts(51, harness.migration_file(51))
    assert.equal(40, c.shell)
    assert(c.ratio <= 1.5, ("51: %d Lua code lines for %d shell lines"):format(c.lua, c.shell))
  end)

  it("labels the same PVCs, but the shell also labels another cluster's PVC through the dot in my.db (its bug)", function()
    local d = differential.run(h, 51, CLUSTER)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok, tostring(d.port.err))
    assert.same({ MYXDB }, differential.differences(d))
    assert.equal("mydb", d.shell.objects[MYXDB].metadata.labels[KEY])
    assert.is_nil((d.port.objects[MYXDB].metadata.labels or {})[KEY])
  end)

  it("both CRDs absent: both do nothing", function()
    local d = differential.run(h, 51, fixture(false, { ns("cozy-system"), ns("tenant-root"),
      pvc("tenant-root", "vmstorage-db-vmstorage-monitoring-0") }), { before = function(hh)
      hh.srv:delete_crd("vmclusters.operator.victoriametrics.com")
      hh.srv:delete_crd("vlclusters.operator.victoriametrics.com")
    end })
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok, tostring(d.port.err))
    assert.same({}, differential.differences(d))
  end)

  it("a PVC deleted before its patch: the shell fails the step (its bug), the port skips it", function()
    local d = differential.run(h, 51, CLUSTER,
      { faults = { { method = "PATCH", path = "/persistentvolumeclaims/data-vlstorage-logs-0(\\?|$)", delete = true } } })
    assert.same({ "delete" }, d.shell.fired)
    assert.same({ "delete" }, d.port.fired)
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ MYXDB }, differential.differences(d))
  end)

  it("a list that fails once: the shell skips every VMCluster and stamps (its bug), the port retries #fakeonly", function()
    local d = differential.run(h, 51, CLUSTER,
      { faults = { { method = "GET", path = "/vmclusters(\\?|$)", times = 1, status = 500 } } })
    assert.same({ "status" }, d.shell.fired)
    assert.same({ "status" }, d.port.fired)
    assert.equal(0, d.shell.code, d.shell.stderr)
    assert.is_true(d.port.ok)
    assert.same({ "PersistentVolumeClaim tenant-a/vmstorage-db-vmstorage-my.db-0",
      "PersistentVolumeClaim tenant-root/vmselect-cachedir-vmselect-monitoring-0",
      "PersistentVolumeClaim tenant-root/vmstorage-db-vmstorage-monitoring-0" }, differential.differences(d))
  end)

  it("a patch that keeps failing: the shell fails and labels none after it (its bug), the port goes on #fakeonly", function()
    local d = differential.run(h, 51, CLUSTER, { faults = { { method = "PATCH",
      path = "/persistentvolumeclaims/vmstorage-db-vmstorage-monitoring-0(\\?|$)", times = -1, status = 500 } } })
    assert.equal("status", d.shell.fired[1])
    assert.equal("status", d.port.fired[1])
    assert.is_not.equal(0, d.shell.code)
    assert.is_true(d.port.ok)
    assert.same({ MYXDB, "PersistentVolumeClaim tenant-root/data-vlstorage-logs-0" }, differential.differences(d))
  end)
end)
