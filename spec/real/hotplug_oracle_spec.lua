-- Migration 59 judged by KubeVirt's own code (issue 24). For each fleet, on
-- the real kube-apiserver with KubeVirt's real CRDs:
--   (a) hotplug-oracle (spec/support/README.md): what KubeVirt v1.9.0's
--       declarative hotplug reconcile would remove from each Running VMI;
--   (b) `cozy-migrate check`, then `run` of 59;
--   (c) the oracle again.
-- Asserted: after the run reconcile unplugs no volume a VM does not list (the
-- only removals left are replacements the check names: a VM whose volume of
-- that name differs); every VMI is as it was; 59 changed exactly the VMs (a)
-- named, and every one of (a) it left alone is named by a check finding;
-- check's copy findings are exactly (a)'s removals; every VM 59 wrote passes
-- KubeVirt's own VM admitter (its validating webhook, called as a function by
-- hotplug-oracle --admit), as an UPDATE from what the VM was before the run.
--
-- Only the real server can host this (the oracle is KubeVirt's Go client and
-- code): it runs as real/spec/real/hotplug_oracle, on the real server whatever
-- COZY_SPEC_SERVER says.
local json = require "cozy.json"
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local fleet = require "spec.fixtures.59-vmi-hotplug.fleet"
local scenarios = require "spec.fixtures.59-vmi-hotplug.scenarios"
local generate = require "spec.fixtures.59-vmi-hotplug.generate"

local A, pair = fleet.A, fleet.pair
local ORACLE = "spec/support/hotplug-oracle"

local function sorted(t)
  table.sort(t)
  return t
end

local function keys(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  return sorted(out)
end

-- The oracle's verdicts by "ns/name".
local function oracle(srv)
  local r = cli.shell(("%s --kubeconfig %s --output json"):format(ORACLE, fake.quote(srv.kubeconfig)))
  assert.equal(0, r.code, r.stderr)
  local out = {}
  for _, v in ipairs(json.decode(r.stdout)) do out[v.vm] = v end
  return out
end

-- The gates the admitter runs with besides DeclarativeHotplugVolumes. The
-- seed's tenant-c/vm-lun runs a VMI with a LUN disk with reservation, which
-- KubeVirt's VMI admitter admits only with PersistentReservation on: the
-- cluster the fixtures describe has it on, though their KubeVirt CR omits it.
local GATES = { "PersistentReservation" }

-- KubeVirt's VM admitter on the VMs now (or opts.names), each as an UPDATE
-- from its state in opts.old (a VirtualMachineList file; none: from itself);
-- {allowed, message, causes} by "ns/name".
local function admission(srv, opts)
  opts = opts or {}
  local args = { "--admit" }
  for _, gate in ipairs(GATES) do args[#args + 1] = "--feature-gate " .. gate end
  if opts.old then args[#args + 1] = "--old " .. fake.quote(opts.old) end
  for _, name in ipairs(opts.names or {}) do args[#args + 1] = name end
  local r = cli.shell(("%s --kubeconfig %s %s"):format(ORACLE, fake.quote(srv.kubeconfig), table.concat(args, " ")))
  assert.equal(0, r.code, r.stderr)
  local out = {}
  for _, v in ipairs(json.decode(r.stdout)) do out[v.vm] = v.admission end
  return out
end

local function cozy(srv, args)
  local r = cli.shell(("%s %s --kubeconfig %s"):format(cli.bin, args, fake.quote(srv.kubeconfig)))
  assert(r.code < 128, "cozy-migrate was killed by a signal")
  return r
end

-- Every stored object: srv:objects() with room for a large fleet, which a
-- loaded machine serves slowly (its 30 s ran out under a load average of 24).
local function objects(srv)
  local res = srv:request("GET", "/_fake/objects", { token = false, timeout = 900 })
  assert.equal(200, res.status, res.body .. (res.error or ""))
  return res.json.items
end

-- Every object of a kind, of those listed, by "ns/name".
local function of_kind(list, kind)
  local out = {}
  for _, o in ipairs(list) do
    if o.kind == kind then out[o.metadata.namespace .. "/" .. o.metadata.name] = o end
  end
  return out
end

-- What reconcile and 59 touch of a VM or VMI spec: volumes and disks.
local function storage(spec)
  spec = spec or {}
  return json.encode({ volumes = spec.volumes or {}, disks = ((spec.domain or {}).devices or {}).disks or {} })
end

local function vm_storage(vm) return storage(vm.spec.template and vm.spec.template.spec) end

-- 59's check findings (severity, message) before the run.
local function check(srv)
  local r = cozy(srv, "check --output json")
  local out = {}
  for _, f in ipairs(json.decode(r.stdout).findings) do
    if f.migration == "59-vmi-hotplug" then out[#out + 1] = f end
  end
  return out, r
end

-- A finding's message names the VM or VMI "ns/name" as a word.
local function names_key(f, key)
  return (" " .. f.message .. " "):find("[ :]" .. key:gsub("%p", "%%%0") .. "[ :]") ~= nil
end

local function write_fleet(list)
  local path = os.tmpname()
  files.write(path, generate.encode(list))
  return path
end

-- (a), check, run, (c) on one fleet; returns what the assertions and the
-- counts need.
local function prove(srv, fixture)
  -- srv:reset with room for a large fleet, which a loaded machine loads slowly
  local res = srv:request("POST", "/_fake/reset", { body = files.read(fixture), token = false, timeout = 900 })
  assert.equal(200, res.status, res.body .. (res.error or ""))
  local r = {}
  local stored = objects(srv)
  r.vms_before, r.vmis_before = of_kind(stored, "VirtualMachine"), of_kind(stored, "VirtualMachineInstance")
  r.before = oracle(srv)
  -- the VMs as the API serves them before the run: the old side of each
  -- UPDATE the admitter judges
  local vms = srv:request("GET", "/apis/kubevirt.io/v1/virtualmachines")
  assert.equal(200, vms.status, vms.body)
  local old = os.tmpname()
  files.write(old, vms.body)
  r.admission_before = admission(srv)
  r.findings = check(srv)
  r.run = cozy(srv, "run")
  stored = objects(srv)
  r.vms_after, r.vmis_after = of_kind(stored, "VirtualMachine"), of_kind(stored, "VirtualMachineInstance")
  r.after = oracle(srv)
  r.admission = admission(srv, { old = old })
  os.remove(old)
  r.changed = {}
  for key, vm in pairs(r.vms_after) do
    if vm_storage(vm) ~= vm_storage(r.vms_before[key]) then r.changed[key] = true end
  end
  r.losing = {} -- (a): VMs whose VMI reconcile would take a volume or disk from
  for key, v in pairs(r.before) do
    if #v.removes.volumes + #v.removes.disks > 0 then r.losing[key] = true end
  end
  return r
end

local function finding_naming(r, key)
  for _, f in ipairs(r.findings) do
    if names_key(f, key) then return f end
  end
end

-- The assertions of issue 24, on one proven fleet.
local function assert_proven(r)
  assert.equal(0, r.run.code, r.run.stderr)
  -- every VMI's volumes and disks are what they were
  assert.same(keys(r.vmis_before), keys(r.vmis_after))
  for key, vmi in pairs(r.vmis_before) do
    assert.equal(storage(vmi.spec), storage(r.vmis_after[key].spec), "VMI " .. key .. " changed")
  end
  -- after: no volume a VM does not list is unplugged; a removal left is a
  -- replacement (the VM lists that name with other contents) check named
  for key, v in pairs(r.after) do
    local listed = {}
    for _, vol in ipairs(r.vms_after[key].spec.template.spec.volumes or {}) do listed[vol.name] = true end
    for _, name in ipairs(v.removes.volumes) do
      assert.is_true(listed[name] == true, ("after the run reconcile unplugs %s from %s, which its VM lacks"):format(name, key))
    end
    if #v.removes.volumes + #v.removes.disks > 0 then
      assert.is_truthy(finding_naming(r, key), "no check finding names " .. key .. ", whose VMI reconcile still changes")
    end
  end
  -- 59 changed only VMs (a) named; every one of (a) it left alone, check named
  for key in pairs(r.changed) do
    assert.is_true(r.losing[key] == true, "59 changed VM " .. key .. ", whose VMI reconcile would not take anything from")
  end
  for key in pairs(r.losing) do
    if not r.changed[key] then
      assert.is_truthy(finding_naming(r, key), "59 left " .. key .. " alone and no check finding names it")
    end
  end
  -- check's copy findings ("info ns/name volume") are exactly (a)'s removals
  -- of volumes the VM lacks
  local listed, expected = {}, {}
  for _, f in ipairs(r.findings) do
    local key, volume = f.message:match("^([%w.-]+/[%w.-]+) ([%w.-]+)$")
    if f.severity == "info" and key then listed[#listed + 1] = key .. " " .. volume end
  end
  for key, v in pairs(r.before) do
    local in_vm = {}
    for _, vol in ipairs(r.vms_before[key].spec.template.spec.volumes or {}) do in_vm[vol.name] = true end
    for _, name in ipairs(v.removes.volumes) do
      if not in_vm[name] then expected[#expected + 1] = key .. " " .. name end
    end
  end
  assert.same(sorted(expected), sorted(listed))
  -- every VM 59 wrote passes KubeVirt's VM admitter, or KubeVirt refused it
  -- before the run for exactly the causes it refuses it for now: a VM KubeVirt
  -- never admitted (no live cluster holds one), to which 59 added no cause
  for key in pairs(r.changed) do
    local a, b = r.admission[key], r.admission_before[key]
    if not (a and a.allowed) then
      local why = ("KubeVirt's VM admitter refuses what 59 wrote to %s: %s"):format(key, a and a.message or "no verdict")
      assert.is_true(b ~= nil and not b.allowed, why)
      assert.same(b.causes, a.causes, why)
    end
  end
end

-- The per-fleet numbers issue 24's closing note asks for.
local function counts(name, r)
  local losses, replacements, admitted, refused_before = 0, 0, 0, 0
  for key in pairs(r.changed) do
    if r.admission[key].allowed then admitted = admitted + 1 end
    if not r.admission_before[key].allowed then refused_before = refused_before + 1 end
  end
  for key, v in pairs(r.after) do
    local listed = {}
    for _, vol in ipairs(r.vms_after[key].spec.template.spec.volumes or {}) do listed[vol.name] = true end
    for _, n in ipairs(v.removes.volumes) do
      if listed[n] then replacements = replacements + 1 else losses = losses + 1 end
    end
  end
  io.stderr:write(("hotplug-oracle %s: %d VMs would lose a volume before, %d VMs changed by 59 (%d of them admitted by"
    .. " KubeVirt's VM admitter after, %d refused before), %d volumes lost after (%d replaced: VM and VMI differ)\n")
    :format(name, #keys(r.losing), #keys(r.changed), admitted, refused_before, losses, replacements))
end

---------------------------------------------------------------------------
-- Fleets

-- Every edge case 59's spec knows, beyond the seed's cluster: a VMI with no
-- ownerReference at all next to a VM of its name (virt-controller adopts it),
-- hotplug PVC and DataVolume volumes with disks present and absent, a VM with
-- updateVolumesStrategy Migration (declarative hotplug leaves it alone).
local function edge_cases()
  local list = scenarios.cluster()
  local items = list.items
  items[#items + 1] = fleet.namespace("tenant-e")
  pair(items, { namespace = "tenant-e", name = "vm-no-owner", vmi = { owner = A {} },
    extra_volumes = { fleet.csi_volume("pvc-no-owner") }, extra_disks = { fleet.csi_disk("pvc-no-owner") } })
  local vm = pair(items, { namespace = "tenant-e", name = "vm-migration-strategy",
    extra_volumes = { fleet.csi_volume("pvc-migration-strategy") }, extra_disks = { fleet.csi_disk("pvc-migration-strategy") } })
  vm.spec.updateVolumesStrategy = "Migration"
  pair(items, { namespace = "tenant-e", name = "vm-pvc-no-disk", extra_volumes = { fleet.pvc_volume("pvc-only-volume") } })
  return list
end

-- A seeded fleet of `count` VMs (and VMIs whose VM is gone) mixing every case; deterministic (a fixed
-- linear congruential sequence), so a failure names the same VM every run.
local function seeded(count)
  local items = fleet.base({ "fleet-0", "fleet-1", "fleet-2", "fleet-3" })
  local state = 24
  local function pick(n)
    state = (state * 1103515245 + 12345) & 0x7fffffff
    return state % n + 1
  end
  local cases = {
    function(ns, name) pair(items, { namespace = ns, name = name }) end, -- complete
    function(ns, name) pair(items, { namespace = ns, name = name,       -- DataVolume, disk absent from VM
      extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } }) end,
    function(ns, name) pair(items, { namespace = ns, name = name,       -- PVC
      extra_volumes = { fleet.pvc_volume("data-" .. name) }, extra_disks = { fleet.scsi_disk("data-" .. name) } }) end,
    function(ns, name)                                                  -- disk present in the VM
      local vm = pair(items, { namespace = ns, name = name, extra_volumes = { fleet.csi_volume("pvc-" .. name) } })
      local d = vm.spec.template.spec.domain.devices.disks
      d[#d + 1] = fleet.csi_disk("pvc-" .. name)
    end,
    function(ns, name) pair(items, { namespace = ns, name = name,       -- a non-hotplug volume only on the VMI
      extra_volumes = { { name = "old-" .. name, persistentVolumeClaim = { claimName = "old-" .. name } } },
      extra_disks = { { name = "old-" .. name, disk = { bus = "virtio" } } } }) end,
    function(ns, name) pair(items, { namespace = ns, name = name, phase = ({ "Pending", "Failed", "Succeeded", "Unknown" })[pick(4)],
      extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } }) end,
    function(ns, name) pair(items, { namespace = ns, name = name, vmi = { owner = A {} }, -- no owner: adopted
      extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } }) end,
    function(ns, name)                                                  -- uid mismatch
      local vm = fleet.vm({ namespace = ns, name = name })
      items[#items + 1] = vm
      items[#items + 1] = fleet.vmi({ namespace = ns, name = name, vm = vm, phase = "Running",
        owner = A { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", name = name,
                      uid = fleet.uid("earlier " .. ns .. "/" .. name), controller = true, blockOwnerDeletion = true } },
        extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } })
    end,
    function(ns, name)                                                  -- VM gone
      items[#items + 1] = fleet.vmi({ namespace = ns, name = name, phase = "Running",
        owner = A { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", name = name,
                      uid = fleet.uid("gone " .. ns .. "/" .. name), controller = true, blockOwnerDeletion = true } },
        extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } })
      return false -- no VM
    end,
    function(ns, name)                                                  -- differs between VM and VMI
      local vm = fleet.vm({ namespace = ns, name = name,
        volumes = A { fleet.system_volume(name), fleet.cloudinit_volume(name),
                      { name = "data", dataVolume = { name = "data-v2-" .. name, hotpluggable = true } } },
        disks = A { fleet.system_disk(1), fleet.cloudinit_disk(), fleet.scsi_disk("data") } })
      items[#items + 1] = vm
      local running_as = fleet.deep_copy(vm)
      running_as.spec.template.spec.volumes[3] = { name = "data", dataVolume = { name = "data-v1-" .. name, hotpluggable = true } }
      items[#items + 1] = fleet.vmi({ namespace = ns, name = name, vm = running_as, phase = "Running" })
      items[#items].metadata.ownerReferences[1].uid = vm.metadata.uid
    end,
    function(ns, name)                                                  -- updateVolumesStrategy: Migration
      local vm = pair(items, { namespace = ns, name = name,
        extra_volumes = { fleet.csi_volume("pvc-" .. name) }, extra_disks = { fleet.csi_disk("pvc-" .. name) } })
      vm.spec.updateVolumesStrategy = "Migration"
    end,
  }
  local vms, i = 0, 0
  while vms < count do
    i = i + 1
    if cases[pick(#cases)](("fleet-%d"):format(i % 4), ("vm-%04d"):format(i)) ~= false then vms = vms + 1 end
  end
  return fleet.list(items)
end

---------------------------------------------------------------------------

describe("migration 59 against KubeVirt v1.9.0's declarative hotplug reconcile", function()
  local srv
  setup(function() srv = fake.start { server = "real", tls = true, token = "t" } end)
  teardown(function() if srv then srv:stop() end end)

  it("the oracle sees the seed's losses and writes nothing to the server", function()
    srv:reset("spec/fixtures/59-vmi-hotplug/cluster.json")
    srv:clear_requests()
    local before = oracle(srv)
    assert.is_true(admission(srv)["tenant-a/vm-complete"].allowed)
    -- a VMI-only DataVolume and PVC volume, with its disk: both taken
    assert.same({ "pvc-3f1c9a52-8d0e-4b7e-9c1a-5d2e7f0a1b3c", "scratch-data" },
                before["tenant-a/vm-both-kinds"].removes.volumes)
    assert.same({ "pvc-3f1c9a52-8d0e-4b7e-9c1a-5d2e7f0a1b3c", "scratch-data" },
                before["tenant-a/vm-both-kinds"].removes.disks)
    -- not Running, another VM's uid, a VM complete: untouched by reconcile
    for _, key in ipairs { "tenant-b/vm-failed", "tenant-b/vm-unknown", "tenant-c/vm-uid-mismatch", "tenant-a/vm-complete" } do
      assert.is_nil(before[key], key)
    end
    for _, e in ipairs(srv:requests()) do assert.equal("GET", e.method, e.path) end
  end)

  for _, case in ipairs {
    { name = "seed fixtures (cluster.json)", fixture = function() return "spec/fixtures/59-vmi-hotplug/cluster.json" end },
    { name = "every edge case", fixture = function() return write_fleet(edge_cases()) end },
    { name = "seeded 1,000-VM fleet", fixture = function() return write_fleet(seeded(1000)) end },
  } do
    it(case.name .. ": after 59, reconcile unplugs nothing the VM lacks, and 59 and check agree with it", function()
      local fixture = case.fixture()
      local r = prove(srv, fixture)
      if fixture:find("^/tmp") then os.remove(fixture) end
      counts(case.name, r)
      assert_proven(r)
    end)
  end

  -- The control: the admitter check above can fail. KubeVirt refuses a disk
  -- with no volume of its name and a bootOrder two disks share, and its
  -- cause names the disk.
  it("KubeVirt's VM admitter refuses a disk with no volume and a duplicate bootOrder, naming the disk", function()
    local list = scenarios.cluster()
    local items = list.items
    items[#items + 1] = fleet.namespace("tenant-x")
    local ghost = fleet.vm({ namespace = "tenant-x", name = "vm-disk-no-volume" })
    local disks = ghost.spec.template.spec.domain.devices.disks
    disks[#disks + 1] = fleet.csi_disk("pvc-ghost")
    items[#items + 1] = ghost
    items[#items + 1] = fleet.vm({ namespace = "tenant-x", name = "vm-boot-twice",
      disks = A { fleet.system_disk(1), fleet.system_disk(1) } })
    items[#items].spec.template.spec.domain.devices.disks[2].name = "cloudinitdisk"
    local fixture = write_fleet(list)
    local res = srv:request("POST", "/_fake/reset", { body = files.read(fixture), token = false, timeout = 900 })
    os.remove(fixture)
    assert.equal(200, res.status, res.body .. (res.error or ""))
    local a = admission(srv, { names = { "tenant-x/vm-disk-no-volume", "tenant-x/vm-boot-twice", "tenant-a/vm-complete" } })
    assert.is_true(a["tenant-a/vm-complete"].allowed, a["tenant-a/vm-complete"].message)
    assert.is_false(a["tenant-x/vm-disk-no-volume"].allowed)
    assert.same({ { type = "FieldValueInvalid", field = "spec.template.spec.domain.devices.disks[2].name",
                    message = "spec.template.spec.domain.devices.disks[2].Name 'pvc-ghost' not found." } },
                a["tenant-x/vm-disk-no-volume"].causes)
    assert.is_false(a["tenant-x/vm-boot-twice"].allowed)
    assert.same({ { type = "FieldValueInvalid", field = "spec.template.spec.domain.devices.disks[1].bootOrder",
                    message = "Boot order for spec.template.spec.domain.devices.disks[1].bootOrder already set for a different device." } },
                a["tenant-x/vm-boot-twice"].causes)
  end)

  it("bootOrder collision: run refuses, changes nothing, and check's block names the VM", function()
    local r = prove(srv, "spec/fixtures/59-vmi-hotplug/check-blocks.json")
    assert.equal(1, r.run.code, r.run.stderr)
    assert.truthy(r.run.stderr:find("bootOrder 1 is already used", 1, true), r.run.stderr)
    assert.same({}, keys(r.changed))
    assert.is_true(r.losing["tenant-a/vm-boot-collision"])
    local f = finding_naming(r, "tenant-a/vm-boot-collision")
    assert.equal("block", f and f.severity)
  end)
end)
