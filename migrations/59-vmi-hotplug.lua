-- Migration 59: copy into each VM, verbatim and in VMI order, the hotpluggable volumes (and
-- disks) its Running VMI holds and its template lacks, before KubeVirt's declarative hotplug
-- unplugs them: a live update. See docs/migrations/59-vmi-hotplug.md.
local obj = require "cozy.obj"
local rule = require "cozy.rule"
local VOLUMES, DISKS = "spec.template.spec.volumes", "spec.template.spec.domain.devices.disks"
local INTERFACES = "spec.template.spec.domain.devices.interfaces"
local GATES = "spec.configuration.developerConfiguration.disabledFeatureGates"
local GATE = "DeclarativeHotplugVolumes"

-- A volume virt-controller reconciles declaratively (IsDeclarativeHotplugVolume).
local function is_hotplug(v)
  return obj.get(v, "dataVolume.hotpluggable") == true
    or obj.get(v, "persistentVolumeClaim.hotpluggable") == true
end
-- The VMI's hotplug volumes and disks the VM template lacks, in VMI order; the { VM's,
-- VMI's } pairs of the hotplug volumes both hold but not alike.
local function missing(vm, vmi)
  local volumes, differ = obj.compare(obj.list(vm, VOLUMES), obj.list(vmi, "spec.volumes",
    is_hotplug), "name")
  local names = obj.index_by(volumes, "name")
  local disks = obj.list(vmi, "spec.domain.devices.disks", function(d) return names[d.name] end)
  return volumes, obj.compare(obj.list(vm, DISKS), disks, "name"), differ
end
-- The edit of a VM (listed, or re-read after a conflict): appends what its VMI alone holds.
local function copy_into(vm, _, vmi)
  local volumes, disks = missing(vm, vmi)
  if obj.uid_conflict(vm, vmi) or #volumes == 0 then return nil end -- another VM of that name
  obj.append(vm, VOLUMES, volumes)
  obj.append(vm, DISKS, disks)
  return { volumes = volumes, disks = disks }
end
-- A pending status.volumeRequests entry, as "add x" or "remove y".
local function request(r)
  local add, remove = obj.get(r, "addVolumeOptions.name"), obj.get(r, "removeVolumeOptions.name")
  return add and ("add " .. add) or remove and ("remove " .. remove) or "?"
end
-- The findings about a VM and its VMI, and "copy" or "complete" when it is in scope.
local function judge(ctx, vm, vmi, vmis)
  local phase, key = obj.get(vmi, "status.phase"), obj.key(vm)
  local volumes, disks, differ = missing(vm, vmi)
  local function say(severity, text, ...) ctx:finding(severity, text:format(...), { vm = vm }) end
  if vmi.metadata.name ~= vm.metadata.name then -- virt-controller finds a VM's VMI by name
    return vmis:skip(vmi, "it is not named like its owner VM " .. vm.metadata.name, true)
  elseif phase ~= "Running" then
    vmis:skip(vmi, ("it is not Running (phase %s): its next start is built from the VM spec")
      :format(phase or "none"))
    return phase == "Unknown" and #volumes > 0 and say("warn", "VMI %s is in phase Unknown and"
      .. " holds hotplugged volumes %s missing from its VM spec: they are not copied, and are"
      .. " unplugged if it comes back Running", obj.key(vmi), obj.names(volumes))
  elseif obj.get(vm, "spec.updateVolumesStrategy") == "Migration" and #volumes > 0 then
    return say("warn", "VM %s has updateVolumesStrategy Migration, which declarative hotplug"
      .. " leaves alone: hotplugged volumes %s of its VMI are not copied, and are unplugged if"
      .. " the strategy changes", key, obj.names(volumes))
  end
  for _, pair in ipairs(differ) do
    if is_hotplug(pair[1]) then say("warn", "VM %s: hotplug volume %s differs between the VM"
      .. " and its VMI: it will be unplugged and plugged again", key, pair[2].name) end
  end
  local disk_at = obj.index_by(obj.list(vm, DISKS), "bootOrder")
  local nic_at = obj.index_by(obj.list(vm, INTERFACES), "bootOrder")
  for _, d in ipairs(disks) do
    local order = math.type(d.bootOrder) and d.bootOrder
    local by = order and (nic_at[order] and "interface " .. tostring(nic_at[order].name)
      or disk_at[order] and "disk " .. tostring(disk_at[order].name))
    if by then say("block", "VM %s: disk %s bootOrder %d is already used by %s; KubeVirt's"
      .. " admission would refuse the copy", key, d.name, order, by) end
    if order then disk_at[order], nic_at[order] = d, nil end
  end
  for _, v in ipairs(volumes) do
    ctx:finding("info", key .. " " .. v.name, { vm = vm, volume = v.name })
  end
  return #volumes > 0 and "copy" or "complete"
end

return rule {
  description = "copy hotplugged volumes that only running VMIs hold into their VM specs,"
    .. " before declarative hotplug unplugs them",
  select = {
    vms = { "virtualmachines.kubevirt.io", edit = true, report = false, noun = "VM", project = {
      VOLUMES, DISKS, INTERFACES, "status.volumeRequests", "spec.updateVolumesStrategy" },
      unserved = "CRD {resource} is absent: KubeVirt is not installed, nothing to copy",
      gone = "nothing to copy", outcome = { updated = "changed", deleted_meanwhile = "absent" },
      say = "{adding|would add} hotplugged volumes {volumes} to the VM spec" },
    vmis = { "virtualmachineinstances.kubevirt.io", noun = "VMI", project = { "status.phase",
      "metadata.ownerReferences", "spec.domain.devices.disks", "spec.volumes.*.name",
      "spec.volumes.*.persistentVolumeClaim", "spec.volumes.*.dataVolume" },
      where = function(vmi) return #missing({}, vmi) > 0 end, -- with a hotplug volume
      unserved = "CRD {resource} is absent: no VMI can be running, nothing to copy" },
    kubevirts = { "kubevirts.kubevirt.io", check_only = true, where = { [GATES] = GATE },
      finding = { "block", "KubeVirt {key} lists " .. GATE .. " in disabledFeatureGates: with"
        .. " HotplugVolumes gone it is the only hotplug path" } },
  },
  walk = function(ctx, s)
    local joined = s.vms:join(s.vmis, { owner = true, adopt = true }) -- by owner, else name
    if not joined then return end -- a CRD absent: the finding says which
    local complete, copies = 0, ctx:queue()
    for vm, vmis in joined do
      local requests = obj.list(vm, "status.volumeRequests")
      if #requests > 0 then ctx:finding("warn", ("VM %s has pending status.volumeRequests (%s):"
        .. " it can get stuck once the HotplugVolumes gate is off"):format(obj.key(vm),
        table.concat(obj.map(requests, request), ", ")), { vm = vm }) end
      for _, vmi in ipairs(vmis) do
        local judged = judge(ctx, vm, vmi, s.vmis)
        if judged == "copy" then copies:push(vm, vmi) elseif judged then complete = complete + 1 end
      end
    end
    if copies:len() == 0 then ctx:finding("info", "no running VMI holds a hotplugged volume"
      .. " missing from its VM spec") end
    local done = s.vms:each(copy_into, { items = copies })
    local volumes, disks = done:sum("volumes"), done:sum("disks")
    complete = complete + done.unchanged
    ctx:outcome { vms = joined:count("left"), vmis_with_hotplug_volumes = joined:count(),
      already_complete = complete, volumes = volumes, disks = disks }
    ctx.log:info(done.changed == 0 and ("nothing to update: no running VMI holds a hotplugged"
      .. " volume missing from its VM spec (%d VMs already complete)"):format(complete)
      or ctx:worded("{updated|would update} %d VMs: %d volumes, %d disks copied from their VMIs;"
      .. " %d VMs already complete"):format(done.changed, volumes, disks, complete))
  end,
}
