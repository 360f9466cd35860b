-- Migration 59: keep VMI-only hotplugged volumes attached when KubeVirt moves from the HotplugVolumes gate
-- to declarative hotplug.
--
-- Declaratively, virt-controller makes each Running VMI's hotplug volumes match its VM's
-- spec.template.spec.volumes by name: a hotpluggable volume (and its disk) only the VMI holds is unplugged.
-- Older kubevirt-csi drivers and `virtctl addvolume` without --persist attached volumes to the VMI only.
-- This copies each such volume, verbatim and in VMI order, into its VM's template, with its disk unless the
-- VM has a disk of that name: a live update, no restart. Only Running VMIs count: a stopped VM's next VMI
-- is built from the VM spec. docs/migrations/59-vmi-hotplug.md has the choices made.
local obj = require "cozy.obj"
local json = require "cozy.json"

local KUBEVIRT = "kubevirt.io/v1"
local DECLARATIVE_GATE = "DeclarativeHotplugVolumes"
local VOLUMES = "spec.template.spec.volumes"
local DISKS = "spec.template.spec.domain.devices.disks"
local INTERFACES = "spec.template.spec.domain.devices.interfaces"
local VM_READS = { VOLUMES, DISKS, INTERFACES, "status.volumeRequests" } -- all the rule reads of a VM
local VMI_READS = { "metadata.ownerReferences", "spec.volumes", "spec.domain.devices.disks", "status.phase" }

-- The rule

-- A volume virt-controller reconciles declaratively (IsDeclarativeHotplugVolume).
local function is_hotplug_volume(volume)
  return obj.get(volume, "dataVolume.hotpluggable") == true
      or obj.get(volume, "persistentVolumeClaim.hotpluggable") == true
end

-- Owners match by uid too (a VM recreated under that name does not own the old VMI).
local function is_referenced_vm(vm, ref)
  return ref.uid == nil or obj.get(vm, "metadata.uid") == nil or ref.uid == obj.get(vm, "metadata.uid")
end

-- The VMI's hotplug volumes (and their disks) the VM template lacks, in VMI order; and the names of those
-- the VM has with other content (unplugged and plugged again).
local function missing_from_vm(vm, vmi)
  local in_template, volumes, disks, names, differ = obj.index_by(obj.list(vm, VOLUMES), "name"), {}, {}, {}, {}
  for _, volume in ipairs(obj.list(vmi, "spec.volumes")) do
    local in_vm = in_template[volume.name]
    if is_hotplug_volume(volume) and in_vm == nil then
      volumes[#volumes + 1] = volume
      names[volume.name] = true
    elseif is_hotplug_volume(volume) and is_hotplug_volume(in_vm) and not obj.equal(in_vm, volume) then
      differ[#differ + 1] = volume.name
    end
  end
  local vm_disks = obj.index_by(obj.list(vm, DISKS), "name")
  for _, disk in ipairs(obj.list(vmi, "spec.domain.devices.disks")) do
    if names[disk.name] and vm_disks[disk.name] == nil then disks[#disks + 1] = disk end
  end
  return volumes, disks, differ
end

-- Edits a copy of the VM (the listed one, or a fresh read after a conflict): appends what its VMI alone
-- holds; returns what it added, or nil.
local function copy_into(vm, vmi)
  -- nothing when replaced by another VM of that name
  if not is_referenced_vm(vm, obj.controller_of(vmi, "VirtualMachine", "kubevirt.io")) then return nil end
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
    local order, used = math.type(disk.bootOrder) and disk.bootOrder, nil
    if order then used, taken[order] = taken[order], "disk " .. disk.name end
    if used then collisions[#collisions + 1] = ("disk %s bootOrder %d is already used by %s"):format(disk.name, order, used) end
  end
  return collisions
end

-- Reading the fleet and deciding, one pass over each list (run and check share it)

local function left_alone(seen, vmi, why, odd) seen.left_alone[#seen.left_alone + 1] = { vmi = obj.identity(vmi), why = why, odd = odd } end

-- All the rule reads of a VMI: its metadata, phase, hotplug volumes and their disks; nil without any.
local function hotplug_part(vmi)
  local volumes, disks, names = json.array {}, json.array {}, {}
  for _, v in ipairs(obj.list(vmi, "spec.volumes")) do if is_hotplug_volume(v) then volumes[#volumes + 1], names[v.name] = v, true end end
  for _, d in ipairs(obj.list(vmi, "spec.domain.devices.disks")) do if names[d.name] then disks[#disks + 1] = d end end
  return #volumes > 0 and { metadata = vmi.metadata, status = vmi.status, spec = { volumes = volumes, domain = { devices = { disks = disks } } } } or nil
end

-- One VMI against the VM it names: a copy to make, or why not.
local function judge(fleet, vm, vmi)
  local seen, ref = fleet.seen, obj.controller_of(vmi, "VirtualMachine", "kubevirt.io")
  if not is_referenced_vm(vm, ref) then
    return left_alone(seen, vmi, ("its ownerReference names uid %s but VM %s has uid %s"):format(ref.uid, ref.name, vm.metadata.uid), true)
  end
  -- virt-controller looks a VM's VMI up by the VM's own name
  if vmi.metadata.name ~= ref.name then return left_alone(seen, vmi, "it is not named like its owner VM " .. ref.name, true) end
  local phase = obj.get(vmi, "status.phase")
  if phase ~= "Running" then
    left_alone(seen, vmi, "it is not Running (phase " .. tostring(phase or "none") .. "): its next start is built from the VM spec")
    -- not reconciled now, but unplugged if it comes back Running
    local volumes = phase == "Unknown" and missing_from_vm(vm, vmi) or {}
    if #volumes > 0 then seen.unknown[#seen.unknown + 1] = { vmi = obj.identity(vmi), volumes = obj.names(volumes) } end
    return
  end
  local volumes, disks, differ = missing_from_vm(vm, vmi)
  for _, name in ipairs(differ) do seen.differs[#seen.differs + 1] = { vm = obj.identity(vm), volume = name } end
  if #volumes == 0 then seen.complete = seen.complete + 1 return end
  for _, c in ipairs(boot_order_collisions(vm, disks)) do seen.refused[#seen.refused + 1] = { vm = obj.identity(vm), why = c } end
  -- the VM and its VMI's part kept as JSON text until the write: a fifth of their memory as tables
  fleet.copies[#fleet.copies + 1] = json.encode { vm = vm, vmi = vmi }
end

-- VMIs with hotplug volumes first, kept compact under the VM they name; then the VMs stream past, each
-- judged against its VMIs (and handed to each_vm): memory grows with the copies to make, not the fleet.
local function read_fleet(ctx, each_vm)
  if not ctx.kube:served(KUBEVIRT, "virtualmachines") then
    return nil, "CRD virtualmachines.kubevirt.io is absent: KubeVirt is not installed, nothing to copy"
  end
  if not ctx.kube:served(KUBEVIRT, "virtualmachineinstances") then
    return nil, "CRD virtualmachineinstances.kubevirt.io is absent although virtualmachines.kubevirt.io"
        .. " is present: no VMI can be running, nothing to copy"
  end
  local fleet, claims = { vms = 0, vmis = 0, copies = {}, seen = { left_alone = {}, unknown = {}, differs = {}, refused = {}, complete = 0 } }, {}
  for vmi in ctx.kube:resource(KUBEVIRT, "virtualmachineinstances"):list{ project = VMI_READS } do
    local part = hotplug_part(vmi)
    local ref = part and obj.controller_of(part, "VirtualMachine", "kubevirt.io")
    fleet.vmis = fleet.vmis + (part and 1 or 0)
    if part and ref == nil then left_alone(fleet.seen, part, "it has no controller ownerReference of kind VirtualMachine") end
    local key = ref and part.metadata.namespace .. "/" .. tostring(ref.name)
    if key then claims[key] = claims[key] or {} table.insert(claims[key], json.encode(part)) end
  end
  for vm in ctx.kube:resource(KUBEVIRT, "virtualmachines"):list{ project = VM_READS } do
    fleet.vms = fleet.vms + 1
    for _, text in ipairs(claims[obj.key(vm)] or {}) do judge(fleet, vm, json.decode(text)) end
    claims[obj.key(vm)] = nil
    if each_vm then each_vm(vm) end
  end
  local gone = {} -- claimed by no VM listed
  for key in pairs(claims) do gone[#gone + 1] = key end
  table.sort(gone)
  for _, key in ipairs(gone) do
    for _, text in ipairs(claims[key]) do left_alone(fleet.seen, json.decode(text), "its VM " .. key:match("/(.*)") .. " is gone") end
  end
  return fleet
end

local function run(ctx)
  local fleet, absent = read_fleet(ctx)
  if fleet == nil then return ctx.log:info(absent) end
  local copies, seen = fleet.copies, fleet.seen
  -- refuse before the first write rather than halfway through the fleet
  if #seen.refused > 0 then
    local refused = {}
    for i, r in ipairs(seen.refused) do refused[i] = "VM " .. obj.key(r.vm) .. ": " .. r.why end
    error("refusing to copy hotplugged volumes: KubeVirt's admission would refuse these VMs: " .. table.concat(refused, "; "), 0)
  end
  for _, left in ipairs(seen.left_alone) do ctx.log:debug(("VMI %s left alone: %s"):format(obj.key(left.vmi), left.why)) end

  -- each copy decoded as the batch has room for it; its VMI's part goes with the VM
  local vmi_of, n, volumes, disks = setmetatable({}, { __mode = "k" }), 0, 0, 0
  local counts = ctx.kube:resource(KUBEVIRT, "virtualmachines"):update_each(function()
    n = n + 1
    local copy = copies[n] and json.decode(copies[n])
    if copy then vmi_of[copy.vm], copies[n] = copy.vmi, false end
    return copy and copy.vm
  end, function(vm, listed) return copy_into(vm, vmi_of[listed]) end, {
    label = "VMs", absent = "skip", absent_note = "nothing to copy", summary = false, project = VM_READS, total = #copies,
    describe = function(vm) return "VM " .. obj.key(vm) end,
    on_change = function(vm, added)
      if added == nil then return end -- an earlier attempt of its own landed
      volumes, disks = volumes + #added.volumes, disks + #added.disks
      ctx.log:change("VM %s: {adding|would add} hotplugged volumes %s to the VM spec", obj.key(vm), obj.names(added.volumes))
    end,
  })
  local complete = seen.complete + counts.unchanged
  local outcome = { vms = fleet.vms, vmis_with_hotplug_volumes = fleet.vmis, already_complete = complete,
                    deleted_meanwhile = counts.absent, updated = counts.changed, volumes = volumes, disks = disks }
  ctx.outcome(outcome)
  ctx.log:info(counts.changed == 0 and ("nothing to update: no running VMI holds a hotplugged volume missing"
    .. " from its VM spec (%d VMs already complete)"):format(complete) or ctx.worded("{updated|would update}"
    .. " %d VMs: %d volumes, %d disks copied from their VMIs; %d VMs already complete"):format(counts.changed,
    volumes, disks, complete), outcome)
end

-- check: read-only, the same rule
local function check(ctx)
  local fleet, absent = read_fleet(ctx, function(vm)
    local requests = {}
    for i, r in ipairs(obj.list(vm, "status.volumeRequests")) do
      local add, remove = obj.get(r, "addVolumeOptions.name"), obj.get(r, "removeVolumeOptions.name")
      requests[i] = add and ("add " .. add) or remove and ("remove " .. remove) or "?"
    end
    if #requests > 0 then
      ctx.finding("warn", ("VM %s has pending status.volumeRequests (%s): it can get stuck once the HotplugVolumes gate is off")
        :format(obj.key(vm), table.concat(requests, ", ")), { vm = vm })
    end
  end)
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
  local copies, seen = fleet.copies, fleet.seen
  for _, text in ipairs(copies) do
    local copy = json.decode(text)
    for _, volume in ipairs(missing_from_vm(copy.vm, copy.vmi)) do
      ctx.finding("info", obj.key(copy.vm) .. " " .. volume.name, { vm = copy.vm, volume = volume.name })
    end
  end
  for _, r in ipairs(seen.refused) do
    ctx.finding("block", ("VM %s: %s; KubeVirt's admission would refuse the copy"):format(obj.key(r.vm), r.why), { vm = r.vm })
  end
  for _, d in ipairs(seen.differs) do
    ctx.finding("warn", ("VM %s: hotplug volume %s differs between the VM and its VMI: it will be unplugged and plugged again")
      :format(obj.key(d.vm), d.volume), { vm = d.vm, volume = d.volume })
  end
  for _, u in ipairs(seen.unknown) do
    ctx.finding("warn", ("VMI %s is in phase Unknown and holds hotplugged volumes %s missing from its VM spec:"
      .. " they are not copied, and are unplugged if it comes back Running"):format(obj.key(u.vmi), u.volumes), { vmi = u.vmi })
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
    { verb = "list", group = "kubevirt.io", resource = "kubevirts", check_only = true },  -- the feature gates
  },
  check = check,
  run = run,
}
