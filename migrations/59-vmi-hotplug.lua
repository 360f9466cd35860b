-- Migration 59: copy into each VM, verbatim and in VMI order, the hotpluggable volumes (and disks) its Running VMI holds and its
-- template lacks, before KubeVirt's declarative hotplug unplugs them: a live update. See docs/migrations/59-vmi-hotplug.md.
local obj = require "cozy.obj"
local KUBEVIRT = "kubevirt.io/v1"
local VOLUMES = "spec.template.spec.volumes"
local DISKS = "spec.template.spec.domain.devices.disks"
local INTERFACES = "spec.template.spec.domain.devices.interfaces"
local VM_READS = { VOLUMES, DISKS, INTERFACES, "status.volumeRequests", "spec.updateVolumesStrategy" } -- all the rule reads of a VM
local VMI_READS = { "metadata.ownerReferences", "spec.domain.devices.disks", "status.phase", "spec.volumes.*.name", -- hotplug volumes whole,
  "spec.volumes.*.persistentVolumeClaim", "spec.volumes.*.dataVolume" }                    -- no other volume's data (cloud-init)

-- A volume virt-controller reconciles declaratively (IsDeclarativeHotplugVolume).
local function is_hotplug_volume(v) return obj.get(v, "dataVolume.hotpluggable") == true or obj.get(v, "persistentVolumeClaim.hotpluggable") == true end
-- Owners match by uid too (a VM recreated under that name does not own the old VMI). A VMI without a controller
-- reference is the VM's of its name: virt-controller adopts it (ClaimVirtualMachineInstanceByName), then reconciles it.
local function is_referenced_vm(vm, ref) return ref == nil or ref.uid == nil or obj.get(vm, "metadata.uid") == nil or ref.uid == obj.get(vm, "metadata.uid") end
-- The VMI's hotplug volumes and disks the VM template lacks, in VMI order; the names of those it has otherwise.
local function missing_from_vm(vm, vmi)
  local in_template, vm_disks = obj.index_by(obj.list(vm, VOLUMES), "name"), obj.index_by(obj.list(vm, DISKS), "name")
  local volumes, disks, names, differ = {}, {}, {}, {}
  for _, volume in ipairs(obj.list(vmi, "spec.volumes")) do
    local in_vm = in_template[volume.name]
    if is_hotplug_volume(volume) and in_vm == nil then volumes[#volumes + 1], names[volume.name] = volume, true
    elseif is_hotplug_volume(volume) and is_hotplug_volume(in_vm) and not obj.equal(in_vm, volume) then differ[#differ + 1] = volume.name end
  end
  for _, d in ipairs(obj.list(vmi, "spec.domain.devices.disks")) do if names[d.name] and not vm_disks[d.name] then disks[#disks + 1] = d end end
  return volumes, disks, differ
end

-- Edits a copy of the VM (listed, or re-read after a conflict): appends what its VMI alone holds; returns that, or nil.
local function copy_into(vm, vmi)
  if not is_referenced_vm(vm, obj.controller_of(vmi, "VirtualMachine", "kubevirt.io")) then return nil end -- another VM of that name
  local volumes, disks = missing_from_vm(vm, vmi)
  if #volumes == 0 then return nil end
  obj.append(vm, VOLUMES, volumes)
  if #disks > 0 then obj.append(vm, DISKS, disks) end
  return { volumes = volumes, disks = disks }
end

-- One pass over each list for run and check: the engine hands out each VM with its VMIs that hold hotplug volumes. Copies go
-- to a queue, VM with VMI; the rest to note(severity, message, fields): "debug" a run line; "info", "warn", "block" a check finding.
local function read_fleet(ctx, note)
  local absent = not ctx.kube:served(KUBEVIRT, "virtualmachines") and "virtualmachines.kubevirt.io is absent: KubeVirt is not installed"
    or not ctx.kube:served(KUBEVIRT, "virtualmachineinstances") and "virtualmachineinstances.kubevirt.io is absent: no VMI can be running"
  if absent then return nil, "CRD " .. absent .. ", nothing to copy" end
  local fleet = { vms = 0, vmis = 0, complete = 0, copies = ctx:queue() }
  local function left(vmi, why, odd)
    note("debug", ("VMI %s left alone: %s"):format(obj.key(vmi), why))
    if odd then note("info", ("VMI %s is left alone: %s"):format(obj.key(vmi), why), { vmi = vmi }) end
  end
  local joined = ctx:join(ctx.kube:resource(KUBEVIRT, "virtualmachines"):list{ project = VM_READS },
    ctx.kube:resource(KUBEVIRT, "virtualmachineinstances"):list{ project = VMI_READS }, { key = function(vmi)
      if #missing_from_vm({}, vmi) == 0 then return nil end -- what a VM without volumes would lack: no hotplug volume at all
      fleet.vmis = fleet.vmis + 1
      local ref = obj.controller_of(vmi, "VirtualMachine", "kubevirt.io") -- no controller at all: the VMI is its VM's by name
      if ref or not obj.controller_of(vmi) then return vmi.metadata.namespace .. "/" .. (ref and tostring(ref.name) or vmi.metadata.name) end
      left(vmi, "its controller ownerReference is not of kind VirtualMachine")
    end })
  for vm, vmis in joined do
    fleet.vms = fleet.vms + 1
    local requests = {}
    for i, r in ipairs(obj.list(vm, "status.volumeRequests")) do
      local add, remove = obj.get(r, "addVolumeOptions.name"), obj.get(r, "removeVolumeOptions.name")
      requests[i] = add and ("add " .. add) or remove and ("remove " .. remove) or "?"
    end
    if #requests > 0 then note("warn", ("VM %s has pending status.volumeRequests (%s): it can get stuck once the HotplugVolumes gate is off")
      :format(obj.key(vm), table.concat(requests, ", ")), { vm = vm }) end
    for _, vmi in ipairs(vmis) do
      local ref, phase = obj.controller_of(vmi, "VirtualMachine", "kubevirt.io"), obj.get(vmi, "status.phase")
      local volumes, disks, differ = missing_from_vm(vm, vmi)
      if not is_referenced_vm(vm, ref) then
        left(vmi, ("its ownerReference names uid %s but VM %s has uid %s"):format(ref.uid, ref.name, vm.metadata.uid), true)
      elseif ref and vmi.metadata.name ~= ref.name then -- virt-controller looks a VM's VMI up by the VM's own name
        left(vmi, "it is not named like its owner VM " .. ref.name, true)
      elseif phase ~= "Running" then
        left(vmi, "it is not Running (phase " .. tostring(phase or "none") .. "): its next start is built from the VM spec")
        if phase == "Unknown" and #volumes > 0 then note("warn", ("VMI %s is in phase Unknown and holds hotplugged volumes %s missing from"
          .. " its VM spec: they are not copied, and are unplugged if it comes back Running"):format(obj.key(vmi), obj.names(volumes)), { vmi = vmi }) end
      elseif obj.get(vm, "spec.updateVolumesStrategy") == "Migration" and #volumes > 0 then -- HandleDeclarativeVolumes returns at once
        note("warn", ("VM %s has updateVolumesStrategy Migration, which declarative hotplug leaves alone: hotplugged volumes %s of its"
          .. " VMI are not copied, and are unplugged if the strategy changes"):format(obj.key(vm), obj.names(volumes)), { vm = vm })
      else
        for _, name in ipairs(differ) do note("warn", ("VM %s: hotplug volume %s differs between the VM and its VMI: it will be unplugged"
          .. " and plugged again"):format(obj.key(vm), name), { vm = vm, volume = name }) end
        local taken = {} -- a copied disk's bootOrder that a device already uses: admission refuses duplicates
        for _, d in ipairs(obj.list(vm, DISKS)) do taken[d.bootOrder or false] = "disk " .. tostring(d.name) end
        for _, i in ipairs(obj.list(vm, INTERFACES)) do taken[i.bootOrder or false] = "interface " .. tostring(i.name) end
        for _, d in ipairs(disks) do
          local order = math.type(d.bootOrder) and d.bootOrder
          if order and taken[order] then note("block", ("VM %s: disk %s bootOrder %d is already used by %s; KubeVirt's admission would"
            .. " refuse the copy"):format(obj.key(vm), d.name, order, taken[order]), { vm = vm }) end
          if order then taken[order] = "disk " .. d.name end
        end
        for _, volume in ipairs(volumes) do note("info", obj.key(vm) .. " " .. volume.name, { vm = vm, volume = volume.name }) end
        if #volumes == 0 then fleet.complete = fleet.complete + 1 else fleet.copies:push(vm, vmi) end
      end
    end
  end
  for key, vmi in joined:unmatched() do
    left(vmi, obj.controller_of(vmi) and "its VM " .. key:match("/(.*)") .. " is gone"
      or "it has no controller ownerReference and no VM of its name")
  end
  return fleet
end

local function run(ctx)
  local refused, volumes, disks = {}, 0, 0
  local fleet, absent = read_fleet(ctx, function(severity, message)
    if severity == "debug" then ctx.log:debug(message) elseif severity == "block" then refused[#refused + 1] = message end
  end)
  if fleet == nil then return ctx.log:info(absent) end
  if #refused > 0 then error("refusing to copy hotplugged volumes: " .. table.concat(refused, "; "), 0) end -- "block" stops run
  local counts = ctx.kube:resource(KUBEVIRT, "virtualmachines"):update_each(fleet.copies:drain(), function(vm, _, vmi) return copy_into(vm, vmi) end, {
    label = "VMs", absent = "skip", absent_note = "nothing to copy", summary = false, project = VM_READS,
    total = fleet.copies:len(), describe = function(vm) return "VM " .. obj.key(vm) end, on_change = function(vm, added)
      if added == nil then return end -- an earlier attempt of its own landed
      volumes, disks = volumes + #added.volumes, disks + #added.disks
      ctx.log:change("VM %s: {adding|would add} hotplugged volumes %s to the VM spec", obj.key(vm), obj.names(added.volumes))
    end })
  local complete = fleet.complete + counts.unchanged
  ctx.log:info(counts.changed == 0 and ("nothing to update: no running VMI holds a hotplugged volume missing from its VM spec"
    .. " (%d VMs already complete)"):format(complete) or ctx:worded("{updated|would update} %d VMs: %d volumes, %d disks copied"
    .. " from their VMIs; %d VMs already complete"):format(counts.changed, volumes, disks, complete), ctx:outcome{ vms = fleet.vms,
    vmis_with_hotplug_volumes = fleet.vmis, already_complete = complete, deleted_meanwhile = counts.absent, updated = counts.changed,
    volumes = volumes, disks = disks })
end

local function check(ctx) -- read-only, the same rule; and the KubeVirt CR must not disable the gate the platform moves to
  local fleet, absent = read_fleet(ctx, function(severity, ...) if severity ~= "debug" then ctx:finding(severity, ...) end end)
  if fleet == nil then return ctx:finding("info", absent) end
  if fleet.copies:len() == 0 then ctx:finding("info", "no running VMI holds a hotplugged volume missing from its VM spec") end
  for _, kv in ipairs(ctx.kube:served(KUBEVIRT, "kubevirts") and ctx.kube:resource(KUBEVIRT, "kubevirts"):list():collect() or {}) do
    for _, gate in ipairs(obj.list(kv, "spec.configuration.developerConfiguration.disabledFeatureGates")) do
      if gate == "DeclarativeHotplugVolumes" then ctx:finding("block", ("KubeVirt %s lists %s in disabledFeatureGates: with HotplugVolumes"
        .. " gone it is the only hotplug path"):format(obj.key(kv), gate), { name = kv, gate = gate }) end
    end
  end
end

return {
  description = "copy hotplugged volumes that only running VMIs hold into their VM specs, before declarative hotplug unplugs them",
  permissions = {
    { verb = "list", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "get", group = "kubevirt.io", resource = "virtualmachines" },   -- the re-read after a conflict
    { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "list", group = "kubevirt.io", resource = "virtualmachineinstances" },
    { verb = "list", group = "kubevirt.io", resource = "kubevirts", check_only = true },  -- the feature gates
  },
  check = check, run = run,
}
