-- Migration 59-vmi-hotplug, end to end: the binary (COZY_MIGRATE_BIN, else
-- build/cozy-migrate) runs against the fake API server loaded with the
-- fixtures of spec/fixtures/59-vmi-hotplug/; every case asserts on the
-- server's final objects and on its request log.
local json = require "cozy.json"
local sandbox = require "cozy.sandbox"
local fake = require("spec.helpers").server
local fleet = require "spec.fixtures.59-vmi-hotplug.fleet"
local scenarios = require "spec.fixtures.59-vmi-hotplug.scenarios"
local generate = require "spec.fixtures.59-vmi-hotplug.generate"

local files = require("spec.helpers").files
local cli = require("spec.helpers").cli
local BIN = cli.bin
local MIGRATION = "migrations/59-vmi-hotplug.lua"
local FIXTURES = "spec/fixtures/59-vmi-hotplug/"
local VMS_PATH = "^/apis/kubevirt%.io/v1/namespaces/([^/]+)/virtualmachines/([^/]+)$"
local S = scenarios
local harness = require "spec.helpers"

---------------------------------------------------------------------------
-- Helpers

local function read(path)
  return assert(files.read(path), "cannot read " .. path)
end
local write = files.write

-- Runs the binary; returns exit status, stdout, stderr.
local function cozy(srv, args)
  local r = cli.shell(("%s %s --kubeconfig %s"):format(BIN, args, fake.quote(srv.kubeconfig)))
  assert(r.code < 128, "cozy-migrate was killed by a signal")
  return r.code, r.stdout, r.stderr
end

-- A fake API server loaded with a fixture: a path, or a List built with
-- fleet.lua (written out by generate.encode, which knows fleet's empty arrays).
local function start(fixture)
  if type(fixture) == "table" then
    local path = os.tmpname()
    write(path, generate.encode(fixture))
    local srv = fake.start { fixtures = { path }, tls = true, token = "t" }
    os.remove(path)
    return srv
  end
  return fake.start { fixtures = { fixture }, tls = true, token = "t" }
end

-- A cluster without these CRDs, on either server: the fixtures that play one
-- leave them out, but the real server always starts with KubeVirt's real
-- CRDs. Deletes them through the API (on the fake, where the fixture has none,
-- each DELETE answers 404) and forgets the requests that did it.
local function without_crds(srv, ...)
  for _, name in ipairs { ... } do srv:delete_crd(name) end
  srv:clear_requests()
end

local KUBEVIRT_CRDS = { "virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io", "kubevirts.kubevirt.io" }

local function version(srv)
  return srv:object("ConfigMap", "cozy-system", "cozystack-version").data.version
end

local function set_version(srv, v)
  local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/cozystack-version",
    { body = { data = { version = v } }, content_type = "application/merge-patch+json" })
  assert(res.status == 200, res.body)
end

-- Every stored object by "Kind ns/name".
local function by_key(objects)
  local out = {}
  for _, o in ipairs(objects) do
    out[o.kind .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name] = o
  end
  return out
end

local function vm_of(objects, key) return objects["VirtualMachine " .. key] end
local function vmi_of(objects, key) return objects["VirtualMachineInstance " .. key] end

-- The VM PATCHes the server answered, as "ns/name" in order, with their bodies.
local function vm_patches(srv)
  local out = {}
  for _, e in ipairs(srv:requests { method = "PATCH" }) do
    local ns, name = tostring(e.path):match(VMS_PATH)
    if ns then out[#out + 1] = { key = ns .. "/" .. name, body = e.body, status = e.status } end
  end
  return out
end

local function writes_to_kubevirt(srv)
  local out = {}
  for _, e in ipairs(srv:requests()) do
    if e.method ~= "GET" and tostring(e.path):find("/apis/kubevirt.io/", 1, true) then out[#out + 1] = e end
  end
  return out
end

local function names(items)
  local out = {}
  for i, item in ipairs(items or {}) do out[i] = item.name end
  return out
end

local function slice(t, from, to)
  local out = {}
  for i = from, to or #t do out[#out + 1] = t[i] end
  return out
end

local function by_name(items, name)
  for _, item in ipairs(items or {}) do
    if item.name == name then return item end
  end
end

local function template(vm) return vm.spec.template.spec end
local function disks_of(vm) return ((template(vm).domain or {}).devices or {}).disks end

-- The VM minus what the migration may change: the two appended lists and
-- the bookkeeping the server moves on every write.
local function outside_the_lists(vm)
  local c = fleet.deep_copy(vm)
  c.metadata.resourceVersion, c.metadata.generation, c.metadata.managedFields = nil, nil, nil
  local spec = c.spec.template.spec
  spec.volumes = nil
  if spec.domain and spec.domain.devices then spec.domain.devices.disks = nil end
  return c
end

-- The log lines of stderr that contain `text`.
local function lines_with(stderr, text)
  local out = {}
  for line in stderr:gmatch("[^\n]+") do
    if line:find(text, 1, true) then out[#out + 1] = line end
  end
  return out
end

local function copy_line(key, volumes)
  return ("VM %s: adding hotplugged volumes %s to the VM spec"):format(key, table.concat(volumes, ","))
end

local function sorted(t)
  local c = slice(t, 1)
  table.sort(c)
  return c
end

local function keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

---------------------------------------------------------------------------
describe("migration 59-vmi-hotplug", function()
  it("loads in the sandbox with a one-line description, check and run", function()
    local m = assert(sandbox.load(read(MIGRATION), MIGRATION))
    assert.is_string(m.description)
    assert.is_nil(m.description:find("\n"))
    assert.is_function(m.check)
    assert.is_function(m.run)
  end)

  it("keeps the committed fixture files in step with generate.lua", function()
    for _, file in ipairs(generate.texts()) do
      assert.equal(file[2], read(file[1]), file[1] .. " is stale: run generate.lua")
    end
  end)
end)

---------------------------------------------------------------------------
describe("migration 59 on the spec harness", function()
  local h = harness.fake { fixtures = { FIXTURES .. "cluster.json" } }

  it("is idempotent: a second run sends no write", function()
    assert.migration_idempotent(59)
    -- the first run did copy: one PATCH per VM that needs it
    local n = 0
    for _ in pairs(S.expected_copies) do n = n + 1 end
    assert.equal(n, #h:writes { all = true, method = "PATCH", path = VMS_PATH })
  end)

  -- allow-list mode and conflict faults: the fake's alone
  it("declares every permission it uses (check and run under exactly the RBAC it is granted) #fakeonly", function()
    assert.permissions_complete(59)
  end)
end)

---------------------------------------------------------------------------
describe("run on a cluster with VMI-only hotplugged volumes", function()
  local srv, before, after, code, stderr, _

  setup(function()
    srv = start(FIXTURES .. "cluster.json")
    before = by_key(srv:objects())
    code, _, stderr = cozy(srv, "run")
    after = by_key(srv:objects())
  end)
  teardown(function() if srv then srv:stop() end end)

  it("succeeds and stamps 60", function()
    assert.equal(0, code, stderr)
    assert.equal("60", version(srv))
  end)

  it("patches exactly the VMs that need the copy, once each, guarded by their resourceVersion", function()
    local patched = {}
    for _, p in ipairs(vm_patches(srv)) do
      assert.equal(200, p.status)
      assert.is_nil(patched[p.key], p.key .. " patched twice")
      patched[p.key] = true
      local ops = json.decode(p.body)
      assert.same({ op = "test", path = "/metadata/resourceVersion",
                    value = vm_of(before, p.key).metadata.resourceVersion }, ops[1])
      for i = 2, #ops do assert.equal("add", ops[i].op) end
    end
    assert.same(keys(S.expected_copies), keys(patched))
  end)

  it("costs one list of VMs, one of VMIs and one PATCH per VM: no VM is read on its own", function()
    local lists = {}
    for _, e in ipairs(srv:requests { method = "GET" }) do
      assert.is_nil(tostring(e.path):match(VMS_PATH), e.path)
      local plural = tostring(e.path):match("^/apis/kubevirt%.io/v1/(%a+)$")
      if plural then lists[plural] = (lists[plural] or 0) + 1 end
    end
    assert.same({ virtualmachines = 1, virtualmachineinstances = 1 }, lists)
  end)

  it("appends the VMI's volumes and disks verbatim and in VMI order, after the VM's own", function()
    for key, want in pairs(S.expected_copies) do
      local old, new, vmi = vm_of(before, key), vm_of(after, key), vmi_of(before, key)
      local old_volumes, old_disks = template(old).volumes or {}, disks_of(old) or {}
      assert.same(old_volumes, slice(template(new).volumes, 1, #old_volumes), key)
      assert.same(old_disks, slice(disks_of(new), 1, #old_disks), key)
      local added_volumes, added_disks = slice(template(new).volumes, #old_volumes + 1),
                                         slice(disks_of(new), #old_disks + 1)
      assert.same(want.volumes, names(added_volumes), key)
      assert.same(want.disks, names(added_disks), key)
      for _, v in ipairs(added_volumes) do assert.same(by_name(vmi.spec.volumes, v.name), v, key) end
      for _, d in ipairs(added_disks) do assert.same(by_name(vmi.spec.domain.devices.disks, d.name), d, key) end
    end
  end)

  it("copies both hotpluggable kinds and not the non-hotpluggable VMI volume", function()
    local vm = vm_of(after, "tenant-a/vm-both-kinds")
    assert.same({ name = S.CSI_A, dataVolume = { name = S.CSI_A, hotpluggable = true } },
                by_name(template(vm).volumes, S.CSI_A))
    assert.same({ name = "scratch-data", persistentVolumeClaim = { claimName = "scratch-data", hotpluggable = true } },
                by_name(template(vm).volumes, "scratch-data"))
    assert.is_nil(by_name(template(vm).volumes, "old-data"))
    assert.is_nil(by_name(disks_of(vm), "old-data"))
  end)

  it("keeps each copied disk's serial and bus", function()
    local vm = vm_of(after, "tenant-a/vm-both-kinds")
    assert.same(fleet.csi_disk(S.CSI_A), by_name(disks_of(vm), S.CSI_A))
    assert.same({ name = "scratch-data", disk = { bus = "scsi" }, serial = "SCRATCH01" },
                by_name(disks_of(vm), "scratch-data"))
  end)

  it("does not add a disk the VM already names", function()
    local old, new = vm_of(before, "tenant-a/vm-disk-present"), vm_of(after, "tenant-a/vm-disk-present")
    assert.same(disks_of(old), disks_of(new))
    assert.truthy(by_name(template(new).volumes, S.CSI_DISK_PRESENT))
  end)

  it("adds the ISO volume but not the cdrom disk in the CD-ROM inject shape", function()
    local old, new = vm_of(before, "tenant-a/vm-cdrom"), vm_of(after, "tenant-a/vm-cdrom")
    assert.same(disks_of(old), disks_of(new))
    assert.same({ name = "cdrom", dataVolume = { name = "virtio-win-iso", hotpluggable = true } },
                template(new).volumes[#template(new).volumes])
  end)

  it("creates the volumes and disks lists of a VM template that has none", function()
    assert.is_nil(template(vm_of(before, "tenant-c/vm-bare")).volumes)
    assert.is_nil(disks_of(vm_of(before, "tenant-c/vm-bare")))
    local vm = vm_of(after, "tenant-c/vm-bare")
    assert.same({ fleet.csi_volume(S.CSI_BARE) }, template(vm).volumes)
    assert.same({ fleet.csi_disk(S.CSI_BARE) }, disks_of(vm))
    local ops
    for _, p in ipairs(vm_patches(srv)) do
      if p.key == "tenant-c/vm-bare" then ops = json.decode(p.body) end
    end
    assert.same({ "test", "add", "add" }, { ops[1].op, ops[2].op, ops[3].op })
    -- one add creates each list (in either order: the ops are independent)
    local paths = { ops[2].path, ops[3].path }
    table.sort(paths)
    assert.same({ "/spec/template/spec/domain/devices/disks", "/spec/template/spec/volumes" }, paths)
  end)

  it("copies a LUN disk and a volume named unlike its claim as they are", function()
    local vm = vm_of(after, "tenant-c/vm-lun")
    assert.same({ name = "shared-lun", persistentVolumeClaim = { claimName = "pvc-shared-block-7d9f", hotpluggable = true } },
                by_name(template(vm).volumes, "shared-lun"))
    assert.same({ name = "shared-lun", lun = { bus = "scsi", reservation = true } }, by_name(disks_of(vm), "shared-lun"))
  end)

  it("joins VMIs to VMs by namespace and name", function()
    assert.truthy(by_name(template(vm_of(after, "tenant-a/worker-0")).volumes, S.CSI_WORKER_A))
    assert.same(vm_of(before, "tenant-b/worker-0"), vm_of(after, "tenant-b/worker-0"))
  end)

  it("changes nothing of a VM outside the two appended lists", function()
    for key in pairs(S.expected_copies) do
      assert.same(outside_the_lists(vm_of(before, key)), outside_the_lists(vm_of(after, key)), key)
    end
  end)

  it("leaves every other object exactly as it was", function()
    for key, old in pairs(before) do
      local vm_key = key:match("^VirtualMachine (.*)$")
      local changed = (vm_key and S.expected_copies[vm_key]) or key == "ConfigMap cozy-system/cozystack-version"
      if not changed then assert.same(old, after[key], key) end
    end
  end)

  it("leaves alone a complete VM and the VMIs that are not in scope", function()
    for _, key in ipairs({
      "tenant-a/vm-complete",                                   -- already complete
      "tenant-b/vm-failed", "tenant-b/vm-pending",              -- not Running
      "tenant-b/vm-no-phase", "tenant-b/vm-succeeded", "tenant-b/vm-unknown",
      "tenant-c/vm-uid-mismatch",                               -- reference to an earlier VM
      "tenant-c/web",                                           -- name of a VMIRS owning a VMI
      "tenant-c/vm-differs", "tenant-c/vm-stopped", "tenant-a/vm-pending-request",
    }) do
      assert.truthy(vm_of(before, key), key)
      assert.same(vm_of(before, key), vm_of(after, key), key)
    end
    -- an orphan VMI and a VMI whose VM is gone: no VM appears, nothing is written
    assert.is_nil(vm_of(after, "tenant-b/orphan-vmi"))
    assert.is_nil(vm_of(after, "tenant-b/vm-deleted"))
    for _, e in ipairs(writes_to_kubevirt(srv)) do
      assert.equal("PATCH", e.method)
      assert.truthy(tostring(e.path):match(VMS_PATH), e.path)
    end
  end)

  it("logs one line per VM and a summary with counts", function()
    for key, want in pairs(S.expected_copies) do
      assert.equal(1, #lines_with(stderr, copy_line(key, want.volumes)), key)
    end
    assert.equal(7, #lines_with(stderr, ": adding hotplugged volumes "))
    assert.equal(1, #lines_with(stderr, "updated 7 VMs: 8 volumes, 6 disks copied from their VMIs; 3 VMs already complete"))
  end)

  it("writes nothing on a second run and says so", function()
    set_version(srv, "59")
    srv:clear_requests()
    local again, _, err = cozy(srv, "run")
    assert.equal(0, again, err)
    assert.same({}, vm_patches(srv))
    assert.same({}, writes_to_kubevirt(srv))
    assert.equal(1, #lines_with(err, "nothing to update: no running VMI holds a hotplugged volume missing from its VM spec"))
    assert.equal("60", version(srv))
  end)
end)

---------------------------------------------------------------------------
describe("run without KubeVirt", function()
  it("only stamps when the VirtualMachine CRD is absent", function()
    local srv <close> = start(FIXTURES .. "no-kubevirt.json")
    without_crds(srv, table.unpack(KUBEVIRT_CRDS))
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    assert.equal("60", version(srv))
    -- only discovery asks about KubeVirt's group: no object of it is read
    for _, e in ipairs(srv:requests()) do
      assert.is_nil(tostring(e.path):find("/apis/kubevirt.io/v1/", 1, true), e.path)
    end
    assert.equal(1, #lines_with(stderr, "CRD virtualmachines.kubevirt.io is absent: KubeVirt is not installed"))
  end)

  it("only stamps when the VirtualMachineInstance CRD is absent", function()
    local srv <close> = start(FIXTURES .. "no-vmi-crd.json")
    without_crds(srv, "virtualmachineinstances.kubevirt.io")
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    assert.equal("60", version(srv))
    assert.same({}, writes_to_kubevirt(srv))
    assert.equal(1, #lines_with(stderr, "CRD virtualmachineinstances.kubevirt.io is absent"))
  end)
end)

---------------------------------------------------------------------------
describe("run fails closed", function()
  local srv
  setup(function() srv = start(FIXTURES .. "cluster.json") end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function() srv:reset(FIXTURES .. "cluster.json") end)

  for _, case in ipairs({
    { "the discovery read", { method = "GET", path = [[^/apis/kubevirt\.io/v1$]] } },
    { "the VM list", { method = "GET", path = [[/virtualmachines\?]] } },
    { "the VMI list", { method = "GET", path = [[/virtualmachineinstances\?]] } },
    { "a VM patch", { method = "PATCH", path = [[/virtualmachines/]] } },
  }) do
    it("when " .. case[1] .. " fails: exit 1, nothing stamped #fakeonly", function()
      local rule = fleet.deep_copy(case[2])
      rule.status = { code = 403, reason = "Forbidden", message = "injected: " .. case[1] }
      rule.times = -1
      srv:faults { rule }
      local code, _, stderr = cozy(srv, "run")
      assert.equal(1, code, stderr)
      assert.equal("59", version(srv))
      assert.truthy(stderr:find("injected: " .. case[1], 1, true), stderr)
      -- a 403 is final: each request that met it was not retried (patches
      -- in flight together each meet it once; the first failure starts no more)
      local fired = srv:fired()
      assert.is_true(#fired >= 1)
      for _, f in ipairs(fired) do assert.equal("status", f) end
      local seen = {}
      for _, p in ipairs(vm_patches(srv)) do
        assert.equal(403, p.status)
        assert.is_nil(seen[p.key], "patched twice: " .. tostring(p.key))
        seen[p.key] = true
      end
      if case[2].method ~= "PATCH" then assert.equal(1, #fired) end
    end)
  end

  it("refuses before its first write when a copied disk's bootOrder collides", function()
    srv:reset(FIXTURES .. "check-blocks.json")
    local code, _, stderr = cozy(srv, "run")
    assert.equal(1, code, stderr)
    assert.equal("59", version(srv))
    assert.same({}, vm_patches(srv))
    assert.truthy(stderr:find("VM tenant-a/vm-boot-collision: disk pvc-boot bootOrder 1 is already used by disk system", 1, true), stderr)
  end)
end)

---------------------------------------------------------------------------
-- a concurrent writer between the list and the patch (on the real server, a
-- real write the front makes just before the patch passes)
describe("run under concurrent writers", function()
  local srv
  setup(function() srv = start(FIXTURES .. "cluster.json") end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function() srv:reset(FIXTURES .. "cluster.json") end)

  it("re-reads a VM that changed before its patch and still gets the copy in", function()
    local key = "tenant-a/vm-both-kinds"
    local before = by_key(srv:objects())
    srv:faults { { method = "PATCH", path = "/virtualmachines/vm-both-kinds$", times = 1,
                   bump = { merge = { status = { printableStatus = "Migrating" } } } } }
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    assert.equal("60", version(srv))
    local statuses = {}
    for _, p in ipairs(vm_patches(srv)) do
      if p.key == key then statuses[#statuses + 1] = p.status end
    end
    assert.same({ 422, 200 }, statuses) -- the failed resourceVersion test, then the recomputed patch
    assert.same({ "bump" }, srv:fired())
    local old, new = vm_of(before, key), vm_of(by_key(srv:objects()), key)
    assert.same({ S.CSI_A, "scratch-data" }, names(slice(template(new).volumes, #template(old).volumes + 1)))
    assert.same({ S.CSI_A, "scratch-data" }, names(slice(disks_of(new), #disks_of(old) + 1)))
    assert.equal("Migrating", new.status.printableStatus)
    assert.equal(1, #lines_with(stderr, copy_line(key, S.expected_copies[key].volumes)))
  end)

  it("recomputes from the fresh VM: a volume someone else added meanwhile is not added again", function()
    local key = "tenant-a/vm-both-kinds"
    local old = vm_of(by_key(srv:objects()), key)
    local vmi = vmi_of(by_key(srv:objects()), key)
    -- a user persists the CSI volume (volume and disk) between our list and our patch
    local volumes, disks = fleet.deep_copy(template(old).volumes), fleet.deep_copy(disks_of(old))
    volumes[#volumes + 1] = by_name(vmi.spec.volumes, S.CSI_A)
    disks[#disks + 1] = by_name(vmi.spec.domain.devices.disks, S.CSI_A)
    srv:faults { { method = "PATCH", path = "/virtualmachines/vm-both-kinds$", times = 1,
                   bump = { merge = { spec = { template = { spec = {
                     volumes = volumes, domain = { devices = { disks = disks } } } } } } } } }
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    local new = vm_of(by_key(srv:objects()), key)
    assert.same({ S.CSI_A, "scratch-data" }, names(slice(template(new).volumes, #template(old).volumes + 1)))
    assert.same({ S.CSI_A, "scratch-data" }, names(slice(disks_of(new), #disks_of(old) + 1)))
    local last
    for _, p in ipairs(vm_patches(srv)) do if p.key == key then last = json.decode(p.body) end end
    assert.equal(3, #last) -- test, then scratch-data's volume and disk only
    assert.same({ "bump" }, srv:fired())
    assert.equal(1, #lines_with(stderr, copy_line(key, { "scratch-data" })))
  end)
end)

---------------------------------------------------------------------------
-- a deleter between the list and the patch (on the real server, a real delete)
describe("run against a VM deleted between the list and its patch", function()
  it("skips that VM, copies into the others, and stamps", function()
    local srv <close> = start(FIXTURES .. "cluster.json")
    local gone = "tenant-a/vm-both-kinds"
    srv:faults { { method = "PATCH", path = "/virtualmachines/vm-both-kinds$", delete = true } }
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    assert.equal("60", version(srv))
    assert.is_nil(vm_of(by_key(srv:objects()), gone))
    assert.equal(1, #lines_with(stderr, "VM " .. gone .. ": deleted since the list, nothing to copy"))
    -- one attempt at the deleted VM, no retry; every other copy still made
    local attempts, patched = 0, {}
    for _, p in ipairs(vm_patches(srv)) do
      if p.key == gone then
        attempts = attempts + 1
        assert.equal(404, p.status)
      else
        assert.equal(200, p.status)
        patched[p.key] = true
      end
    end
    assert.equal(1, attempts)
    assert.same({ "delete" }, srv:fired())
    for key in pairs(S.expected_copies) do
      if key ~= gone then assert.is_true(patched[key], key) end
    end
  end)

  it("still fails closed on any other error of that patch #fakeonly", function()
    local srv <close> = start(FIXTURES .. "cluster.json")
    srv:faults { { method = "PATCH", path = "/virtualmachines/vm-both-kinds$",
                   status = { code = 403, message = "forbidden by policy" } } }
    local code, _, stderr = cozy(srv, "run")
    assert.equal(1, code, stderr)
    assert.equal("59", version(srv))
    assert.matches("forbidden by policy", stderr, 1, true)
    assert.same({ "status" }, srv:fired())
  end)
end)

---------------------------------------------------------------------------
describe("run on unusual templates", function()
  it("appends to empty volumes and disks lists", function()
    local items = fleet.base({ "tenant-a" })
    fleet.pair(items, { namespace = "tenant-a", name = "vm-empty-lists", vm = { volumes = fleet.A {}, disks = fleet.A {} },
      extra_volumes = { fleet.csi_volume("pvc-x") }, extra_disks = { fleet.csi_disk("pvc-x") } })
    local srv <close> = start(fleet.list(items))
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    local ops = json.decode(vm_patches(srv)[1].body)
    local paths = { ops[2].path, ops[3].path }
    table.sort(paths)
    assert.same({ "/spec/template/spec/domain/devices/disks/-", "/spec/template/spec/volumes/-" }, paths)
    local vm = srv:object("VirtualMachine", "tenant-a", "vm-empty-lists")
    assert.same({ fleet.csi_volume("pvc-x") }, template(vm).volumes)
    assert.same({ fleet.csi_disk("pvc-x") }, disks_of(vm))
  end)

  -- KubeVirt's schema requires domain.devices; the migration still creates it
  -- rather than send a patch that cannot apply. A real server refuses to
  -- store such a VM ("devices: Required value"): the fake's alone.
  it("creates domain.devices with the disks when the template has none #fakeonly", function()
    local items = fleet.base({ "tenant-a" })
    fleet.pair(items, { namespace = "tenant-a", name = "vm-no-devices", vm = { devices = false },
      extra_volumes = { fleet.csi_volume("pvc-x") }, extra_disks = { fleet.csi_disk("pvc-x") } })
    local srv <close> = start(fleet.list(items))
    local code, _, stderr = cozy(srv, "run")
    assert.equal(0, code, stderr)
    local vm = srv:object("VirtualMachine", "tenant-a", "vm-no-devices")
    assert.same({ disks = { fleet.csi_disk("pvc-x") } }, template(vm).domain.devices)
    assert.same(fleet.csi_volume("pvc-x"), template(vm).volumes[#template(vm).volumes])
  end)
end)

---------------------------------------------------------------------------
describe("plan", function()
  it("words each copy as what it would do, and says with -v why each VMI with hotplugged volumes is left alone", function()
    local srv <close> = start(FIXTURES .. "cluster.json")
    local code, _, stderr = cozy(srv, "plan -v")
    assert.equal(0, code, stderr)
    local not_running = ": its next start is built from the VM spec"
    for vmi, why in pairs({
      ["tenant-b/orphan-vmi"] = "it has no controller ownerReference and no VM of its name",
      ["tenant-c/web-x7k2p"] = "its controller ownerReference is not of kind VirtualMachine",
      ["tenant-b/vm-deleted"] = "its VM vm-deleted is gone",
      ["tenant-b/vm-failed"] = "it is not Running (phase Failed)" .. not_running,
      ["tenant-b/vm-pending"] = "it is not Running (phase Pending)" .. not_running,
      ["tenant-b/vm-succeeded"] = "it is not Running (phase Succeeded)" .. not_running,
      ["tenant-b/vm-no-phase"] = "it is not Running (phase none)" .. not_running,
      ["tenant-b/vm-unknown"] = "it is not Running (phase Unknown)" .. not_running,
      ["tenant-c/vm-uid-mismatch"] = "its ownerReference names uid " .. fleet.uid("an earlier vm-uid-mismatch"),
      ["tenant-c/vm-stopped-rescue"] = "it is not named like its owner VM vm-stopped",
    }) do
      assert.equal(1, #lines_with(stderr, ("VMI %s left alone: %s"):format(vmi, why)), vmi)
    end
    assert.equal(10, #lines_with(stderr, " left alone: "))
    for key, want in pairs(S.expected_copies) do
      assert.equal(1, #lines_with(stderr, ("VM %s: would add hotplugged volumes %s to the VM spec")
        :format(key, table.concat(want.volumes, ","))), key)
    end
  end)

end)

---------------------------------------------------------------------------
describe("check", function()
  -- This migration's findings from `check --output json`, as "severity message".
  local function findings(stdout)
    local report = json.decode(stdout)
    local out = {}
    for _, f in ipairs(report.findings) do
      if f.migration == "59-vmi-hotplug" then out[#out + 1] = f.severity .. " " .. f.message end
    end
    return out, report
  end

  -- Nothing but reads (and the access reviews check asks the server for).
  local function assert_read_only(srv)
    for _, e in ipairs(srv:requests()) do
      if e.method ~= "GET" then
        assert.equal("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", e.path)
      end
    end
  end

  it("lists each volume run would copy, and warns about what the upgrade can still break", function()
    local srv <close> = start(FIXTURES .. "cluster.json")
    -- the server's uid of the VM (a real server assigns its own; the VMI's
    -- reference to an earlier VM is not a fixture object's and stays as given)
    local vm_uid = srv:object("VirtualMachine", "tenant-c", "vm-uid-mismatch").metadata.uid
    assert.not_equal(fleet.uid("an earlier vm-uid-mismatch"), vm_uid)
    local code, stdout, stderr = cozy(srv, "check --output json")
    assert.equal(0, code, stderr)
    local got = findings(stdout)
    assert.same(sorted({
      "info tenant-a/vm-both-kinds " .. S.CSI_A,
      "info tenant-a/vm-both-kinds scratch-data",
      "info tenant-a/vm-cdrom cdrom",
      "info tenant-a/vm-disk-present " .. S.CSI_DISK_PRESENT,
      "info tenant-a/worker-0 " .. S.CSI_WORKER_A,
      "info tenant-b/vm-noncontroller pvc-noncontroller",
      "info tenant-c/vm-bare " .. S.CSI_BARE,
      "info tenant-c/vm-lun shared-lun",
      "warn VM tenant-a/vm-pending-request has pending status.volumeRequests (add pvc-new):"
        .. " it can get stuck once the HotplugVolumes gate is off",
      "warn VM tenant-c/vm-differs: hotplug volume data differs between the VM and its VMI:"
        .. " it will be unplugged and plugged again",
      "warn VMI tenant-b/vm-unknown is in phase Unknown and holds hotplugged volumes pvc-unknown missing"
        .. " from its VM spec: they are not copied, and are unplugged if it comes back Running",
      ("info VMI tenant-c/vm-uid-mismatch is left alone: its ownerReference names uid %s but VM"
        .. " vm-uid-mismatch has uid %s"):format(fleet.uid("an earlier vm-uid-mismatch"), vm_uid),
      "info VMI tenant-c/vm-stopped-rescue is left alone: it is not named like its owner VM vm-stopped",
    }), sorted(got))
    assert_read_only(srv)
    assert.equal("59", version(srv))
  end)

  -- The query joins on the owner's name only; the migration also wants the
  -- owner's uid and the VMI's own name to match, as virt-controller does. And
  -- the query skips a VMI without a controller reference, which virt-controller
  -- adopts into the VM of its name (spec/real/hotplug_oracle_spec.lua).
  it("lists what the seed's optional query lists, minus the VMIs virt-controller would not pair with the VM, plus those it adopts", function()
    local srv <close> = start(FIXTURES .. "cluster.json")
    local _, stdout = cozy(srv, "check --output json")
    local copies = {}
    for _, f in ipairs(findings(stdout)) do
      local line = f:match("^info ([%w-]+/[%w-]+ [%w-]+)$")
      if line then copies[#copies + 1] = line end
    end
    local seed = srv:kubectl("get", "vm,vmi", "--all-namespaces", "--output", "json")
    assert.is_true(seed.ok, seed.stderr)
    local path = os.tmpname()
    write(path, seed.stdout)
    local p = io.popen("jq --raw-output --from-file spec/fixtures/59-vmi-hotplug/seed-query.jq " .. fake.quote(path))
    local listed = {}
    for line in p:read("a"):gmatch("[^\n]+") do
      if line ~= "tenant-c/vm-uid-mismatch pvc-uid-mismatch" and line ~= "tenant-c/vm-stopped pvc-rescue" then
        listed[#listed + 1] = line
      end
    end
    p:close()
    os.remove(path)
    listed[#listed + 1] = "tenant-b/vm-noncontroller pvc-noncontroller"
    assert.same(sorted(listed), sorted(copies))
  end)

  it("blocks on a disabled DeclarativeHotplugVolumes gate and a colliding bootOrder", function()
    local srv <close> = start(FIXTURES .. "check-blocks.json")
    local code, stdout, stderr = cozy(srv, "check --output json")
    assert.equal(1, code, stderr)
    local got, report = findings(stdout)
    assert.is_true(report.blocked)
    local blocks = {}
    for _, f in ipairs(got) do
      if f:match("^block ") then blocks[#blocks + 1] = f end
    end
    assert.same(sorted({
      "block KubeVirt cozy-kubevirt/kubevirt lists DeclarativeHotplugVolumes in disabledFeatureGates:"
        .. " with HotplugVolumes gone it is the only hotplug path",
      "block VM tenant-a/vm-boot-collision: disk pvc-boot bootOrder 1 is already used by disk system;"
        .. " KubeVirt's admission would refuse the copy",
    }), sorted(blocks))
    assert_read_only(srv)
  end)

  -- KubeVirt's HandleDeclarativeVolumes returns at once for such a VM
  -- (issue 24's oracle): nothing is unplugged, so 59 writes nothing.
  it("leaves a VM with updateVolumesStrategy Migration alone, and warns naming its VMI-only volumes", function()
    local items = fleet.base({ "tenant-a" })
    local vm = fleet.pair(items, { namespace = "tenant-a", name = "vm-migrating",
      extra_volumes = { fleet.csi_volume("pvc-migrating") }, extra_disks = { fleet.csi_disk("pvc-migrating") } })
    vm.spec.updateVolumesStrategy = "Migration"
    local srv <close> = start(fleet.list(items))
    local code, stdout, stderr = cozy(srv, "check --output json")
    assert.equal(0, code, stderr)
    assert.same({ "warn VM tenant-a/vm-migrating has updateVolumesStrategy Migration, which declarative hotplug leaves"
      .. " alone: hotplugged volumes pvc-migrating of its VMI are not copied, and are unplugged if the strategy changes",
      "info no running VMI holds a hotplugged volume missing from its VM spec" }, (findings(stdout)))
    local run_code, _, run_err = cozy(srv, "run")
    assert.equal(0, run_code, run_err)
    assert.same({}, vm_patches(srv))
  end)

  it("says so when KubeVirt is not installed", function()
    local srv <close> = start(FIXTURES .. "no-kubevirt.json")
    without_crds(srv, table.unpack(KUBEVIRT_CRDS))
    local code, stdout, stderr = cozy(srv, "check --output json")
    assert.equal(0, code, stderr)
    assert.same({ "info CRD virtualmachines.kubevirt.io is absent: KubeVirt is not installed, nothing to copy" },
                (findings(stdout)))
  end)
end)
