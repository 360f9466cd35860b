-- Migration 59: keep VMI-only hotplugged volumes attached when KubeVirt moves
-- from the HotplugVolumes gate to declarative hotplug.
--
-- Declaratively, virt-controller makes each Running VMI's hotplug volumes
-- match its VM's spec.template.spec.volumes by name: a hotpluggable volume (and
-- its disk) only the VMI holds is unplugged. Older kubevirt-csi drivers and
-- `virtctl addvolume` without --persist attached volumes to the VMI only. This
-- copies each such volume, verbatim and in VMI order, into its VM's template,
-- with its disk unless the VM has a disk of that name: a live update, no
-- restart. Only Running VMIs count: a stopped VM's next VMI is built from the
-- VM spec. docs/migrations/59-vmi-hotplug.md has the choices made.
local obj = require "cozy.obj"

local KUBEVIRT = "kubevirt.io/v1"
local DECLARATIVE_GATE = "DeclarativeHotplugVolumes"
local VOLUMES = "spec.template.spec.volumes"
local DISKS = "spec.template.spec.domain.devices.disks"
local INTERFACES = "spec.template.spec.domain.devices.interfaces"
local VM_READS = { VOLUMES, DISKS, INTERFACES, "status.volumeRequests" } -- all the rule reads of a VM

-- The rule

-- A volume virt-controller reconciles declaratively (IsDeclarativeHotplugVolume).
local function is_hotplug_volume(volume)
  return obj.get(volume, "dataVolume.hotpluggable") == true
      or obj.get(volume, "persistentVolumeClaim.hotpluggable") == true
end

-- A VM's template volumes and disks by name.
local function template_of(vm)
  return { volumes = obj.index_by(obj.list(vm, VOLUMES), "name"), disks = obj.index_by(obj.list(vm, DISKS), "name") }
end

-- Owners match by uid too (a VM recreated under that name does not own the old VMI).
local function is_referenced_vm(vm, ref)
  return ref.uid == nil or obj.get(vm, "metadata.uid") == nil or ref.uid == obj.get(vm, "metadata.uid")
end

-- The VM a VMI belongs to, as virt-controller sees it, and its reference; or
-- nil, why, and whether the reason is odd (an orphan or a gone VM is not).
local function owning_vm(vmi, vms)
  local ref = obj.controller_of(vmi, "VirtualMachine", "kubevirt.io")
  if ref == nil then return nil, "it has no controller ownerReference of kind VirtualMachine" end
  local vm = vms[vmi.metadata.namespace .. "/" .. tostring(ref.name)]
  if vm == nil then return nil, "its VM " .. ref.name .. " is gone" end
  if not is_referenced_vm(vm, ref) then
    return nil, ("its ownerReference names uid %s but VM %s has uid %s"):format(ref.uid, ref.name, vm.metadata.uid), true
  end
  -- virt-controller looks a VM's VMI up by the VM's own name
  if vmi.metadata.name ~= ref.name then return nil, "it is not named like its owner VM " .. ref.name, true end
  return vm, ref
end

-- The VMI's hotplug volumes (and their disks) the VM template lacks, in VMI
-- order; and the names of those the VM has with other content (unplugged and
-- plugged again).
local function missing_from_vm(vm, vmi)
  local template, volumes, disks, names, differ = template_of(vm), {}, {}, {}, {}
  for _, volume in ipairs(obj.list(vmi, "spec.volumes")) do
    local in_vm = template.volumes[volume.name]
    if is_hotplug_volume(volume) and in_vm == nil then
      volumes[#volumes + 1] = volume
      names[volume.name] = true
    elseif is_hotplug_volume(volume) and is_hotplug_volume(in_vm) and not obj.equal(in_vm, volume) then
      differ[#differ + 1] = volume.name
    end
  end
  for _, disk in ipairs(obj.list(vmi, "spec.domain.devices.disks")) do
    if names[disk.name] and template.disks[disk.name] == nil then disks[#disks + 1] = disk end
  end
  return volumes, disks, differ
end

-- Edits a copy of the VM (the listed one, or a fresh read after a conflict):
-- appends what its VMI alone holds; returns what it added, or nil.
local function copy_into(vm, vmi, ref)
  if not is_referenced_vm(vm, ref) then return nil end -- replaced by another VM of that name
  local volumes, disks = missing_from_vm(vm, vmi)
  if #volumes == 0 then return nil end
  obj.append(vm, VOLUMES, volumes)
  if #disks > 0 then obj.append(vm, DISKS, disks) end
  return { volumes = volumes, disks = disks }
end

-- Copied disks whose bootOrder a device already uses (admission refuses duplicates).
local function boot_order_collisions(vm, disks)
  local taken, collisions = {}, {}
  for _, which in ipairs({ { DISKS, "disk " }, { INTERFACES, "interface " } }) do
    for _, device in ipairs(obj.list(vm, which[1])) do
      if math.type(device.bootOrder) then taken[device.bootOrder] = which[2] .. tostring(device.name) end
    end
  end
  for _, disk in ipairs(disks) do
    local order = math.type(disk.bootOrder) and disk.bootOrder
    if order and taken[order] then
      collisions[#collisions + 1] = ("disk %s bootOrder %d is already used by %s"):format(disk.name, order, taken[order])
    end
    if order then taken[order] = "disk " .. disk.name end
  end
  return collisions
end

-- Reading the fleet (lean: only what the rule reads) and deciding: run and check share it
local function read_fleet(ctx)
  if not ctx.kube:served(KUBEVIRT, "virtualmachines") then
    return nil, "CRD virtualmachines.kubevirt.io is absent: KubeVirt is not installed, nothing to copy"
  end
  if not ctx.kube:served(KUBEVIRT, "virtualmachineinstances") then
    return nil, "CRD virtualmachineinstances.kubevirt.io is absent although virtualmachines.kubevirt.io"
        .. " is present: no VMI can be running, nothing to copy"
  end
  local vms = ctx.kube:resource(KUBEVIRT, "virtualmachines")
      :list{ project = VM_READS }:collect()
  local vmis = {}
  for vmi in ctx.kube:resource(KUBEVIRT, "virtualmachineinstances")
      :list{ project = { "metadata.ownerReferences", "spec.volumes", "spec.domain.devices.disks", "status.phase" } } do
    for _, volume in ipairs(obj.list(vmi, "spec.volumes")) do
      if is_hotplug_volume(volume) then vmis[#vmis + 1] = vmi break end
    end
  end
  return { vms = vms, by_key = obj.index_by(vms), vmis = vmis }
end

-- The copies to make, in VMI list order, and what else was seen.
local function decide(fleet)
  local copies = {}
  local seen = { left_alone = {}, unknown = {}, differs = {}, refused = {}, complete = 0 }
  for _, vmi in ipairs(fleet.vmis) do
    local vm, ref, odd = owning_vm(vmi, fleet.by_key)
    local phase = obj.get(vmi, "status.phase")
    if vm == nil then
      seen.left_alone[#seen.left_alone + 1] = { vmi = vmi, why = ref, odd = odd }
    elseif phase ~= "Running" then
      seen.left_alone[#seen.left_alone + 1] = { vmi = vmi, why = "it is not Running (phase "
          .. tostring(phase or "none") .. "): its next start is built from the VM spec" }
      -- not reconciled now, but unplugged if it comes back Running
      local volumes = phase == "Unknown" and missing_from_vm(vm, vmi) or {}
      if #volumes > 0 then seen.unknown[#seen.unknown + 1] = { vmi = vmi, volumes = volumes } end
    else
      local volumes, disks, differ = missing_from_vm(vm, vmi)
      if #volumes > 0 then
        local copy = { vm = vm, vmi = vmi, ref = ref, volumes = volumes, collisions = boot_order_collisions(vm, disks) }
        copies[#copies + 1] = copy
        for _, c in ipairs(copy.collisions) do seen.refused[#seen.refused + 1] = "VM " .. obj.key(vm) .. ": " .. c end
      else
        seen.complete = seen.complete + 1
      end
      for _, name in ipairs(differ) do seen.differs[#seen.differs + 1] = { vm = vm, volume = name } end
    end
  end
  return copies, seen
end

local function run(ctx)
  local fleet, absent = read_fleet(ctx)
  if fleet == nil then return ctx.log:info(absent) end
  local copies, seen = decide(fleet)

  -- refuse before the first write rather than halfway through the fleet
  if #seen.refused > 0 then
    error("refusing to copy hotplugged volumes: KubeVirt's admission would refuse these VMs: "
        .. table.concat(seen.refused, "; "), 0)
  end
  for _, left in ipairs(seen.left_alone) do ctx.log:debug(("VMI %s left alone: %s"):format(obj.key(left.vmi), left.why)) end

  local vms, by_vm, volumes, disks = {}, {}, 0, 0
  for i, copy in ipairs(copies) do vms[i], by_vm[copy.vm] = copy.vm, copy end
  local counts = ctx.kube:resource(KUBEVIRT, "virtualmachines"):update_each(vms, function(vm, listed)
    return copy_into(vm, by_vm[listed].vmi, by_vm[listed].ref)
  end, {
    label = "VMs", absent = "skip", absent_note = "nothing to copy", summary = false, project = VM_READS,
    describe = function(vm) return "VM " .. obj.key(vm) end,
    on_change = function(vm, added)
      if added == nil then return end -- an earlier attempt of its own landed
      volumes, disks = volumes + #added.volumes, disks + #added.disks
      ctx.log:change("VM %s: {adding|would add} hotplugged volumes %s to the VM spec", obj.key(vm), obj.names(added.volumes))
    end,
  })
  local complete = seen.complete + counts.unchanged
  local outcome = { vms = #fleet.vms, vmis_with_hotplug_volumes = #fleet.vmis, already_complete = complete,
                    deleted_meanwhile = counts.absent, updated = counts.changed, volumes = volumes, disks = disks }
  ctx.outcome(outcome)
  ctx.log:info(counts.changed == 0 and ("nothing to update: no running VMI holds a hotplugged volume missing"
    .. " from its VM spec (%d VMs already complete)"):format(complete) or ctx.worded("{updated|would update}"
    .. " %d VMs: %d volumes, %d disks copied from their VMIs; %d VMs already complete"):format(counts.changed,
    volumes, disks, complete), outcome)
end

-- check: read-only, the same rule
local function check(ctx)
  local fleet, absent = read_fleet(ctx)
  if fleet == nil then return ctx.finding("info", absent) end
  -- the KubeVirt CR must not disable the gate the platform moves to
  if ctx.kube:served(KUBEVIRT, "kubevirts") then
    for kv in ctx.kube:resource(KUBEVIRT, "kubevirts"):list() do
      for _, gate in ipairs(obj.list(kv, "spec.configuration.developerConfiguration.disabledFeatureGates")) do
        if gate == DECLARATIVE_GATE then
          ctx.finding("block", ("KubeVirt %s lists %s in disabledFeatureGates: with HotplugVolumes gone it is the only hotplug path")
            :format(obj.key(kv), gate), { name = kv, gate = gate })
        end
      end
    end
  end
  local copies, seen = decide(fleet)
  for _, copy in ipairs(copies) do
    for _, volume in ipairs(copy.volumes) do
      ctx.finding("info", obj.key(copy.vm) .. " " .. volume.name, { vm = copy.vm, volume = volume.name })
    end
    for _, collision in ipairs(copy.collisions) do
      ctx.finding("block", ("VM %s: %s; KubeVirt's admission would refuse the copy"):format(obj.key(copy.vm), collision),
        { vm = copy.vm })
    end
  end
  for _, vm in ipairs(fleet.vms) do
    local requests = {}
    for i, r in ipairs(obj.list(vm, "status.volumeRequests")) do
      local add, remove = obj.get(r, "addVolumeOptions.name"), obj.get(r, "removeVolumeOptions.name")
      requests[i] = add and ("add " .. add) or remove and ("remove " .. remove) or "?"
    end
    if #requests > 0 then
      ctx.finding("warn", ("VM %s has pending status.volumeRequests (%s): it can get stuck once the HotplugVolumes gate is off")
        :format(obj.key(vm), table.concat(requests, ", ")), { vm = vm })
    end
  end
  for _, d in ipairs(seen.differs) do
    ctx.finding("warn", ("VM %s: hotplug volume %s differs between the VM and its VMI: it will be unplugged and plugged again")
      :format(obj.key(d.vm), d.volume), { vm = d.vm, volume = d.volume })
  end
  for _, u in ipairs(seen.unknown) do
    ctx.finding("warn", ("VMI %s is in phase Unknown and holds hotplugged volumes %s missing from its VM spec:"
      .. " they are not copied, and are unplugged if it comes back Running"):format(obj.key(u.vmi), obj.names(u.volumes)), { vmi = u.vmi })
  end
  for _, left in ipairs(seen.left_alone) do
    if left.odd then ctx.finding("info", ("VMI %s is left alone: %s"):format(obj.key(left.vmi), left.why), { vmi = left.vmi }) end
  end
  if #copies == 0 then ctx.finding("info", "no running VMI holds a hotplugged volume missing from its VM spec") end
end

return {
  description = "copy hotplugged volumes that only running VMIs hold into their VM specs, before declarative hotplug unplugs them",
  permissions = {
    { verb = "list", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "get", group = "kubevirt.io", resource = "virtualmachines" },   -- the re-read after a conflict
    { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "list", group = "kubevirt.io", resource = "virtualmachineinstances" },
    { verb = "list", group = "kubevirt.io", resource = "kubevirts" },        -- check: the feature gates
  },
  check = check,
  run = run,
}
