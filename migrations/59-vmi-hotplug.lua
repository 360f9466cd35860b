-- Migration 59: keep VMI-only hotplugged volumes attached when KubeVirt moves
-- from the HotplugVolumes gate to declarative hotplug.
--
-- Once the old gate is off, virt-controller makes each Running VMI's hotplug
-- volumes match its VM's spec.template.spec.volumes, by volume name: a
-- hotpluggable VMI volume the VM spec lacks is unplugged, and a VMI disk whose
-- name the VM spec lacks is dropped. Older kubevirt-csi drivers (until July
-- 2025) and `virtctl addvolume` without --persist attached volumes to the VMI
-- only. This migration copies each such volume, verbatim and in VMI order, into
-- its VM's template, with its disk unless the VM already has a disk of that
-- name. Adding a hotplug volume to the VM spec is a live update: no restart.
--
-- Only Running VMIs are copied: virt-controller reconciles no other VMI, and a
-- stopped VM builds its next VMI from the VM spec, so copying from a stopped
-- one would bring back volumes the restart was going to drop.
--
-- See docs/migrations/59-vmi-hotplug.md for the choices made where the seed is
-- silent.
local json = require "cozy.json"

local KUBEVIRT = "kubevirt.io/v1"
local CRDS = "apiextensions.k8s.io/v1"
local VM_CRD = "virtualmachines.kubevirt.io"
local VMI_CRD = "virtualmachineinstances.kubevirt.io"
local KUBEVIRT_CRD = "kubevirts.kubevirt.io"
local DECLARATIVE_GATE = "DeclarativeHotplugVolumes"

-- JSON pointers of the two lists the migration appends to, and of the
-- containers above them that an append may have to create.
local VOLUMES_PATH = { "spec", "template", "spec", "volumes" }
local DISKS_PATH = { "spec", "template", "spec", "domain", "devices", "disks" }

---------------------------------------------------------------------------
-- Plain-table helpers

-- t[k1][k2]...; nil as soon as a step is not a table (JSON null included).
local function dig(t, ...)
  for i = 1, select("#", ...) do
    if type(t) ~= "table" then return nil end
    t = t[select(i, ...)]
  end
  return t
end

local function list(t)
  if type(t) ~= "table" then return {} end
  return t
end

local function key_of(namespace, name)
  return namespace .. "/" .. name
end

-- JSON equality of two decoded values, as Go's semantic equality sees them
-- for the fields KubeVirt compares: an absent scalar equals its zero value
-- (false, "", 0), so `hotpluggable: false` written out equals it left out.
local function is_zero(v)
  return v == nil or v == false or v == "" or v == 0 or v == json.null
end

local function same(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then
    if is_zero(a) and is_zero(b) then return true end
    return a == b
  end
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k, v in pairs(b) do
    if a[k] == nil and not same(nil, v) then return false end
  end
  return true
end

---------------------------------------------------------------------------
-- The rule, over plain tables

-- A volume virt-controller reconciles declaratively (IsDeclarativeHotplugVolume).
local function is_hotplug_volume(volume)
  return dig(volume, "dataVolume", "hotpluggable") == true
      or dig(volume, "persistentVolumeClaim", "hotpluggable") == true
end

-- What the rule reads from a VM's template. Works on a full VM and on the
-- pruned view kept from the list (vm_view below), which has the same shape.
local function template_of(vm)
  local spec = dig(vm, "spec", "template", "spec")
  local t = { volumes = {}, disks = {}, boot_orders = {} }
  for _, volume in ipairs(list(dig(spec, "volumes"))) do
    if volume.name then t.volumes[volume.name] = volume end
  end
  local devices = dig(spec, "domain", "devices")
  for _, disk in ipairs(list(dig(devices, "disks"))) do
    if disk.name then t.disks[disk.name] = disk end
    if math.type(disk.bootOrder) then t.boot_orders[disk.bootOrder] = "disk " .. tostring(disk.name) end
  end
  for _, iface in ipairs(list(dig(devices, "interfaces"))) do
    if math.type(iface.bootOrder) then t.boot_orders[iface.bootOrder] = "interface " .. tostring(iface.name) end
  end
  return t
end

-- virt-controller matches an owner by uid too: a VM recreated under the same
-- name is not the owner of the old VM's VMI. Either uid may be unset.
local function is_referenced_vm(vm, ref)
  local uid = dig(vm, "metadata", "uid")
  return ref.uid == nil or uid == nil or ref.uid == uid
end

-- The VM a VMI belongs to, as virt-controller sees it; or nil, a short code
-- and a sentence saying why none. `find_vm(namespace, name)` looks a VM up in
-- the listed fleet, so the join always uses the VMI's own namespace.
local function owning_vm(vmi, find_vm)
  local ref = vmi.controller_ref
  if ref == nil then
    return nil, "orphan", "it has no controller ownerReference of kind VirtualMachine"
  end
  local vm = find_vm(vmi.namespace, ref.name)
  if vm == nil then return nil, "vm-gone", "its VM " .. ref.name .. " is gone" end
  if not is_referenced_vm(vm, ref) then
    return nil, "uid-mismatch", ("its ownerReference names uid %s but VM %s has uid %s")
        :format(ref.uid, ref.name, vm.metadata.uid)
  end
  -- virt-controller looks a VM's VMI up by the VM's own name; a VMI of
  -- another name is never reconciled against this VM.
  if vmi.name ~= ref.name then
    return nil, "renamed", "it is not named like its owner VM " .. ref.name
  end
  return vm
end

-- The VMI's hotplug volumes the VM template lacks, and the disks to add with
-- them (the VMI's disks of those names that the VM template lacks), each in
-- VMI order and verbatim.
local function missing_from_vm(vm, vmi)
  local template = template_of(vm)
  local volumes, disks, names = {}, {}, {}
  for _, volume in ipairs(vmi.hotplug_volumes) do
    if template.volumes[volume.name] == nil then
      volumes[#volumes + 1] = volume
      names[volume.name] = true
    end
  end
  for _, disk in ipairs(vmi.hotplug_disks) do
    if names[disk.name] and template.disks[disk.name] == nil then
      disks[#disks + 1] = disk
    end
  end
  return volumes, disks
end

-- JSON patch ops appending `items` to the list at `path` of `obj`, creating
-- the list, and any container above it, when absent (or null).
local function append_ops(obj, path, items)
  if #items == 0 then return {} end
  local node, depth = obj, 0
  for i, segment in ipairs(path) do
    local child = dig(node, segment)
    if type(child) ~= "table" then break end
    node, depth = child, i
  end
  if depth == #path then
    local ops, pointer = {}, "/" .. table.concat(path, "/") .. "/-"
    for _, item in ipairs(items) do
      ops[#ops + 1] = { op = "add", path = pointer, value = item }
    end
    return ops
  end
  -- Build the missing part bottom-up: {devices = {disks = [...]}} and so on.
  local value = json.array({ table.unpack(items) })
  for i = #path, depth + 2, -1 do
    value = { [path[i]] = value }
  end
  return { { op = "add", path = "/" .. table.concat(path, "/", 1, depth + 1), value = value } }
end

local function copy_ops(vm, volumes, disks)
  local ops = append_ops(vm, VOLUMES_PATH, volumes)
  for _, op in ipairs(append_ops(vm, DISKS_PATH, disks)) do ops[#ops + 1] = op end
  return ops
end

local function names_of(items)
  local names = {}
  for i, item in ipairs(items) do names[i] = item.name end
  return table.concat(names, ",")
end

---------------------------------------------------------------------------
-- Reading the fleet: keep only what the rule and check need, so memory does
-- not grow with the size of the objects.

-- A pruned VM with the shape of the real one: identity, the presence of each
-- list the migration may append to, every volume and disk name, hotplug
-- volumes verbatim (check compares them), boot orders, and pending requests.
local function vm_view(vm)
  local meta = vm.metadata or {}
  local view = {
    apiVersion = vm.apiVersion, kind = vm.kind,
    metadata = { namespace = meta.namespace, name = meta.name, uid = meta.uid,
                 resourceVersion = meta.resourceVersion },
    spec = { template = { spec = {} } },
  }
  local spec = dig(vm, "spec", "template", "spec")
  local out = view.spec.template.spec
  if type(dig(spec, "volumes")) == "table" then
    out.volumes = json.array({})
    for _, volume in ipairs(spec.volumes) do
      out.volumes[#out.volumes + 1] = is_hotplug_volume(volume) and volume or { name = volume.name }
    end
  end
  if type(dig(spec, "domain")) == "table" then
    out.domain = {}
    local devices = dig(spec, "domain", "devices")
    if type(devices) == "table" then
      out.domain.devices = {}
      for _, which in ipairs({ "disks", "interfaces" }) do
        if type(devices[which]) == "table" then
          local kept = json.array({})
          for _, d in ipairs(devices[which]) do
            kept[#kept + 1] = { name = d.name, bootOrder = d.bootOrder }
          end
          out.domain.devices[which] = kept
        end
      end
    end
  end
  local requests = {}
  for _, request in ipairs(list(dig(vm, "status", "volumeRequests"))) do
    local add, remove = dig(request, "addVolumeOptions", "name"), dig(request, "removeVolumeOptions", "name")
    requests[#requests + 1] = add and ("add " .. add) or remove and ("remove " .. remove) or "?"
  end
  view.pending_requests = requests
  return view
end

-- A pruned VMI, or nil when it holds no hotplug volume (nothing to copy or
-- to warn about).
local function vmi_view(vmi)
  local spec = vmi.spec or {}
  local volumes, names = {}, {}
  for _, volume in ipairs(list(spec.volumes)) do
    if is_hotplug_volume(volume) then
      volumes[#volumes + 1] = volume
      names[volume.name] = true
    end
  end
  if #volumes == 0 then return nil end
  local disks = {}
  for _, disk in ipairs(list(dig(spec, "domain", "devices", "disks"))) do
    if names[disk.name] then disks[#disks + 1] = disk end
  end
  local meta = vmi.metadata or {}
  local controller_ref
  for _, ref in ipairs(list(meta.ownerReferences)) do
    if ref.controller == true and ref.kind == "VirtualMachine"
        and type(ref.apiVersion) == "string" and ref.apiVersion:find("kubevirt.io/", 1, true) == 1 then
      controller_ref = { name = ref.name, uid = ref.uid }
      break
    end
  end
  return {
    namespace = meta.namespace, name = meta.name,
    phase = dig(vmi, "status", "phase"),
    controller_ref = controller_ref,
    hotplug_volumes = volumes, hotplug_disks = disks,
  }
end

local function crds(ctx)
  return ctx.kube:resource(CRDS, "customresourcedefinitions", { namespaced = false })
end

-- The fleet { vms = {key -> view}, vm_order = {key...}, vmis = {view...} },
-- or nil and why when KubeVirt is not installed. Any API error raises.
local function read_fleet(ctx)
  local crd = crds(ctx)
  if crd:find(VM_CRD) == nil then
    return nil, "CRD " .. VM_CRD .. " is absent: KubeVirt is not installed, nothing to copy"
  end
  -- Installed with the VM CRD by virt-operator; without it no VMI can exist,
  -- so no volume can be lost.
  if crd:find(VMI_CRD) == nil then
    return nil, "CRD " .. VMI_CRD .. " is absent although " .. VM_CRD
        .. " is present: no VMI can be running, nothing to copy"
  end
  local fleet = { vms = {}, vm_order = {}, vmis = {} }
  for vm in ctx.kube:resource(KUBEVIRT, "virtualmachines"):list({}) do
    local view = vm_view(vm)
    local key = key_of(view.metadata.namespace, view.metadata.name)
    fleet.vms[key] = view
    fleet.vm_order[#fleet.vm_order + 1] = key
  end
  for vmi in ctx.kube:resource(KUBEVIRT, "virtualmachineinstances"):list({}) do
    local view = vmi_view(vmi)
    if view then fleet.vmis[#fleet.vmis + 1] = view end
  end
  return fleet
end

---------------------------------------------------------------------------
-- Deciding: one pass over the VMIs, shared by run and check

-- The copied disks whose bootOrder another device of the VM (or another
-- copied disk) already uses: bootOrder is one sequence across disks and
-- interfaces, and admission refuses the whole patch on a duplicate.
local function boot_order_collisions(vm, disks)
  local taken, collisions = template_of(vm).boot_orders, {}
  for _, disk in ipairs(disks) do
    if math.type(disk.bootOrder) then
      if taken[disk.bootOrder] then
        collisions[#collisions + 1] = ("disk %s bootOrder %d is already used by %s")
            :format(disk.name, disk.bootOrder, taken[disk.bootOrder])
      end
      taken[disk.bootOrder] = "disk " .. disk.name
    end
  end
  return collisions
end

-- Hotplug volumes the VM and the VMI both name, with different content: the
-- first declarative reconcile unplugs the VMI's and plugs the VM's.
local function differing_volumes(vm, vmi)
  local template, names = template_of(vm), {}
  for _, volume in ipairs(vmi.hotplug_volumes) do
    local in_vm = template.volumes[volume.name]
    if in_vm and is_hotplug_volume(in_vm) and not same(in_vm, volume) then
      names[#names + 1] = volume.name
    end
  end
  return names
end

-- Returns the copies to make, in VMI list order:
--   { vm = view, vmi = view, volumes = {...}, disks = {...}, collisions = {...} }
-- and what else was seen: { unknown = {...}, differs = {...}, odd_owner =
-- {...}, left_alone = {...} (VMIs with hotplug volumes out of scope, and why),
-- complete = <running VMIs whose hotplug volumes the VM already lists> }.
local function decide(fleet)
  local function find_vm(namespace, name) return fleet.vms[key_of(namespace, name)] end
  local copies = {}
  local seen = { unknown = {}, differs = {}, odd_owner = {}, left_alone = {}, complete = 0 }
  for _, vmi in ipairs(fleet.vmis) do
    local vm, code, why = owning_vm(vmi, find_vm)
    if vm == nil then
      seen.left_alone[#seen.left_alone + 1] = { vmi = vmi, why = why }
      -- Orphans and VMIs of deleted VMs are expected; a reference that
      -- names a VM which is not its owner is worth a line in check.
      if code == "uid-mismatch" or code == "renamed" then
        seen.odd_owner[#seen.odd_owner + 1] = { vmi = vmi, why = why }
      end
    elseif vmi.phase ~= "Running" then
      seen.left_alone[#seen.left_alone + 1] = { vmi = vmi, why = "it is not Running (phase "
          .. tostring(vmi.phase or "none") .. "): its next start is built from the VM spec" }
      if vmi.phase == "Unknown" then
        -- Not reconciled now, but unplugged if it comes back Running.
        local volumes = missing_from_vm(vm, vmi)
        if #volumes > 0 then seen.unknown[#seen.unknown + 1] = { vm = vm, vmi = vmi, volumes = volumes } end
      end
    else
      local volumes, disks = missing_from_vm(vm, vmi)
      if #volumes > 0 then
        copies[#copies + 1] = { vm = vm, vmi = vmi, volumes = volumes, disks = disks,
                                collisions = boot_order_collisions(vm, disks) }
      else
        seen.complete = seen.complete + 1
      end
      for _, name in ipairs(differing_volumes(vm, vmi)) do
        seen.differs[#seen.differs + 1] = { vm = vm, volume = name }
      end
    end
  end
  return copies, seen
end

local function vm_key(vm)
  return key_of(vm.metadata.namespace, vm.metadata.name)
end

---------------------------------------------------------------------------
-- run

local function run(ctx)
  local fleet, absent = read_fleet(ctx)
  if fleet == nil then
    ctx.log:info(absent)
    return
  end
  local copies, seen = decide(fleet)

  -- Refuse before the first write rather than halfway through the fleet.
  local refused = {}
  for _, copy in ipairs(copies) do
    for _, collision in ipairs(copy.collisions) do
      refused[#refused + 1] = "VM " .. vm_key(copy.vm) .. ": " .. collision
    end
  end
  if #refused > 0 then
    error("refusing to copy hotplugged volumes: KubeVirt's admission would refuse these VMs: "
        .. table.concat(refused, "; "), 0)
  end

  for _, left in ipairs(seen.left_alone) do
    ctx.log:debug(("VMI %s left alone: %s"):format(key_of(left.vmi.namespace, left.vmi.name), left.why))
  end

  local vms = ctx.kube:resource(KUBEVIRT, "virtualmachines")
  local progress = #copies > 0 and ctx.progress("VMs", #copies)
  local updated, volumes_added, disks_added, gone = 0, 0, 0, 0
  for i, copy in ipairs(copies) do
    -- Recomputed from whatever VM the engine hands over: the listed one
    -- first, a fresh read after a conflict.
    local added_volumes, added_disks
    local function mutate(vm)
      added_volumes, added_disks = {}, {}
      if not is_referenced_vm(vm, copy.vmi.controller_ref) then
        return nil -- replaced by another VM of the same name meanwhile
      end
      added_volumes, added_disks = missing_from_vm(vm, copy.vmi)
      if #added_volumes == 0 then return nil end
      return copy_ops(vm, added_volumes, added_disks)
    end
    local ok, _, changed = pcall(vms.update, vms, copy.vm, mutate)
    if not ok then
      local err = _
      -- Deleted since the list: the garbage collector takes its VMI with
      -- it, so there is nothing left to keep attached. Any other error fails
      -- the step.
      if type(err) ~= "table" or err.absent ~= "object" then error(err, 0) end
      gone = gone + 1
      ctx.log:info(("VM %s: deleted since the list, nothing to copy"):format(vm_key(copy.vm)))
    elseif changed then
      updated = updated + 1
      volumes_added = volumes_added + #added_volumes
      disks_added = disks_added + #added_disks
      ctx.log:info(("VM %s: %s hotplugged volumes %s to the VM spec"):format(
        vm_key(copy.vm), ctx.mode == "plan" and "would add" or "adding", names_of(added_volumes)))
    else
      seen.complete = seen.complete + 1 -- nothing left to add: completed, or replaced, meanwhile
    end
    progress:step(i)
  end
  if progress then progress:done() end

  local counts = { vms = #fleet.vm_order, vmis_with_hotplug_volumes = #fleet.vmis,
                   already_complete = seen.complete, deleted_meanwhile = gone,
                   updated = updated, volumes = volumes_added, disks = disks_added }
  ctx.outcome(counts)
  if updated == 0 then
    ctx.log:info(("nothing to update: no running VMI holds a hotplugged volume missing from its VM spec"
      .. " (%d VMs already complete)"):format(seen.complete), counts)
  else
    ctx.log:info(("%s %d VMs: %d volumes, %d disks copied from their VMIs; %d VMs already complete"):format(
      ctx.mode == "plan" and "would update" or "updated", updated, volumes_added, disks_added, seen.complete),
      counts)
  end
end

---------------------------------------------------------------------------
-- check: read-only, the same rule

-- The KubeVirt CR must not disable the gate the platform moves to.
local function check_gates(ctx)
  if crds(ctx):find(KUBEVIRT_CRD) == nil then return end
  for kv in ctx.kube:resource(KUBEVIRT, "kubevirts"):list({}) do
    local dev = dig(kv, "spec", "configuration", "developerConfiguration")
    for _, gate in ipairs(list(dig(dev, "disabledFeatureGates"))) do
      if gate == DECLARATIVE_GATE then
        ctx.finding("block", ("KubeVirt %s/%s lists %s in disabledFeatureGates: with HotplugVolumes gone it is the only hotplug path")
          :format(kv.metadata.namespace, kv.metadata.name, DECLARATIVE_GATE),
          { namespace = kv.metadata.namespace, name = kv.metadata.name, gate = gate })
      end
    end
  end
end

local function check(ctx)
  local fleet, absent = read_fleet(ctx)
  if fleet == nil then
    ctx.finding("info", absent)
    return
  end
  check_gates(ctx)
  local copies, seen = decide(fleet)

  for _, copy in ipairs(copies) do
    local key = vm_key(copy.vm)
    for _, volume in ipairs(copy.volumes) do
      ctx.finding("info", key .. " " .. volume.name,
        { namespace = copy.vm.metadata.namespace, vm = copy.vm.metadata.name, volume = volume.name })
    end
    for _, collision in ipairs(copy.collisions) do
      ctx.finding("block", ("VM %s: %s; KubeVirt's admission would refuse the copy"):format(key, collision),
        { namespace = copy.vm.metadata.namespace, vm = copy.vm.metadata.name })
    end
  end

  for _, key in ipairs(fleet.vm_order) do
    local vm = fleet.vms[key]
    if #vm.pending_requests > 0 then
      ctx.finding("warn", ("VM %s has pending status.volumeRequests (%s): it can get stuck once the HotplugVolumes gate is off")
        :format(key, table.concat(vm.pending_requests, ", ")),
        { namespace = vm.metadata.namespace, vm = vm.metadata.name })
    end
  end

  for _, d in ipairs(seen.differs) do
    ctx.finding("warn", ("VM %s: hotplug volume %s differs between the VM and its VMI: it will be unplugged and plugged again")
      :format(vm_key(d.vm), d.volume),
      { namespace = d.vm.metadata.namespace, vm = d.vm.metadata.name, volume = d.volume })
  end

  for _, u in ipairs(seen.unknown) do
    ctx.finding("warn", ("VMI %s is in phase Unknown and holds hotplugged volumes %s missing from its VM spec: they are not copied, and are unplugged if it comes back Running")
      :format(key_of(u.vmi.namespace, u.vmi.name), names_of(u.volumes)),
      { namespace = u.vmi.namespace, vmi = u.vmi.name })
  end

  for _, r in ipairs(seen.odd_owner) do
    ctx.finding("info", ("VMI %s is left alone: %s"):format(key_of(r.vmi.namespace, r.vmi.name), r.why),
      { namespace = r.vmi.namespace, vmi = r.vmi.name })
  end

  if #copies == 0 then
    ctx.finding("info", "no running VMI holds a hotplugged volume missing from its VM spec")
  end
end

return {
  description = "copy hotplugged volumes that only running VMIs hold into their VM specs, before declarative hotplug unplugs them",
  -- What the runner's service account needs; `check` asks the API server.
  permissions = {
    { verb = "get", group = "apiextensions.k8s.io", resource = "customresourcedefinitions" },
    { verb = "list", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "get", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" },
    { verb = "list", group = "kubevirt.io", resource = "virtualmachineinstances" },
    { verb = "list", group = "kubevirt.io", resource = "kubevirts" },
  },
  check = check,
  run = run,
}
