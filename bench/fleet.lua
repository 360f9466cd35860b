-- Writes the benchmark fleet of bench/run as a compact JSON v1 List, built
-- with the builders of migration 59's fixtures (spec/fixtures/59-vmi-hotplug/
-- fleet.lua), so the objects have the shape of the spec's, plus what a real
-- API server adds and the migration never reads: metadata.managedFields
-- (fieldsV1 derived from each object, per manager, as the server records
-- them), which brings a VM to 5.4-6.5 KB and a VMI to 5.9-8.3 KB of compact
-- JSON (4-8 KB but for the few VMIs with two hotplugged volumes).
--
--   build/cozy-migrate lua bench/fleet.lua OUT.json [VMS=1000] [COPY=0.5] [NAMESPACES=10] [SEED=59]
--
-- Run from the repository root. Every VM has a Running VMI (its controller
-- reference set). A fraction COPY of the VMs, spread evenly (VM i needs the
-- copy when floor(i*COPY) > floor((i-1)*COPY)), have VMI-only hotplugged
-- volumes the VM spec lacks: alternately one kubevirt-csi DataVolume, or that
-- and a `virtctl addvolume` PVC (disk with a serial). Of the others, every
-- fourth already lists its kubevirt-csi volume and disk; the rest have none.
-- SEED drives the per-VM variation (labels and the number of managedFields
-- entries); same arguments, same bytes. The version ConfigMap says 59.
-- Prints one line: VMs, VMIs, namespaces, VMs needing the copy, volumes to copy, bytes.
local fleet = require "spec.fixtures.59-vmi-hotplug.fleet"
local json = require "cozy.json"
local A, pair = fleet.A, fleet.pair

local usage = "usage: fleet.lua OUT.json [VMS] [COPY] [NAMESPACES] [SEED]"
local out = assert(arg[1], usage)
local count = math.tointeger(tonumber(arg[2] or "1000"))
local copy = tonumber(arg[3] or "0.5")
local nns = math.tointeger(tonumber(arg[4] or "10"))
local seed = math.tointeger(tonumber(arg[5] or "59"))
assert(count and count > 0 and nns and nns > 0 and seed, usage .. ": VMS, NAMESPACES, SEED integers > 0")
assert(copy and copy >= 0 and copy <= 1, usage .. ": COPY is a fraction between 0 and 1")

local x = seed
local function rand(n)
  x = (x * 1103515245 + 12345) % 2147483648
  return x % n + 1
end

-- fieldsV1 of a value, as the API server's structured-merge-diff writes it:
-- "f:<key>" for object members, "k:{...}" for list items keyed by name,
-- "v:..." for scalar list items, {} at the leaves.
-- Below `depth` levels (default all) the fields are leaves.
local function fields_of(v, depth)
  depth = depth or math.huge
  if type(v) ~= "table" or depth == 0 then return json.object() end
  local f = json.object()
  if fleet.is_array(v) or getmetatable(v) == json.array_mt or (v[1] ~= nil) then
    for _, e in ipairs(v) do
      if type(e) == "table" and e.name then
        f[('k:{"name":"%s"}'):format(e.name)] = fields_of(e, depth - 1)
        f[('k:{"name":"%s"}'):format(e.name)]["."] = json.object()
      else
        f["v:" .. json.encode(e)] = json.object()
      end
    end
    return f
  end
  for k, e in pairs(v) do f["f:" .. k] = fields_of(e, depth - 1) end
  return f
end

local function entry(manager, operation, fields, subresource)
  return { manager = manager, operation = operation, apiVersion = "kubevirt.io/v1",
           time = "2026-11-02T09:1" .. rand(10) - 1 .. ":00Z", fieldsType = "FieldsV1",
           fieldsV1 = fields, subresource = subresource }
end

-- What the server records for a VM (helm writes it, virt-controller its
-- status) and for a VMI (virt-controller creates it, virt-handler updates
-- status), a VM with a seeded number of virt-api annotation writes.
local function add_managed_fields(obj)
  local m = obj.metadata
  local meta_fields = fields_of({ labels = m.labels, annotations = m.annotations, finalizers = m.finalizers,
                                  ownerReferences = m.ownerReferences })
  local entries
  if obj.kind == "VirtualMachine" then
    entries = { entry("helm", "Update", { ["f:metadata"] = meta_fields, ["f:spec"] = fields_of(obj.spec) }),
                entry("virt-controller", "Update", { ["f:status"] = fields_of(obj.status) }, "status") }
  else -- virt-controller's spec entry covers the volumes and disks, not the rest
    local spec = obj.spec
    entries = { entry("virt-controller", "Update", { ["f:metadata"] = meta_fields, ["f:spec"] =
                  fields_of({ volumes = spec.volumes, domain = { devices = { disks = spec.domain.devices.disks } } }) }),
                entry("virt-handler", "Update", { ["f:status"] = fields_of(obj.status, 3) }, "status") }
  end
  for _ = 1, obj.kind == "VirtualMachine" and rand(3) - 1 or 0 do
    entries[#entries + 1] = entry("virt-api", "Update", { ["f:metadata"] = { ["f:annotations"] =
      { ["f:kubevirt.io/latest-observed-api-version"] = json.object() } } })
  end
  m.managedFields = A(entries)
end

local namespaces = {}
for n = 0, nns - 1 do namespaces[#namespaces + 1] = ("tenant-bench-%02d"):format(n) end
local items = fleet.base(namespaces)

local need, volumes, others = 0, 0, 0
for i = 1, count do
  -- Contiguous blocks, so every namespace gets its share of each kind.
  local ns = namespaces[(i - 1) * nns // count + 1]
  local name = ("kubernetes-md0-%05d"):format(i)
  local csi = ("pvc-%08d-1b2c-4d3e-8f40-%012d"):format(i, i)
  local first = #items + 1
  if math.floor(i * copy) > math.floor((i - 1) * copy) then
    local extra_volumes, extra_disks = { fleet.csi_volume(csi) }, { fleet.csi_disk(csi) }
    if need % 2 == 1 then
      local scratch = ("scratch-%05d"):format(i)
      extra_volumes[2] = fleet.pvc_volume(scratch)
      extra_disks[2] = fleet.scsi_disk(scratch, { serial = ("SCRATCH%05d"):format(i) })
    end
    pair(items, { namespace = ns, name = name, extra_volumes = extra_volumes, extra_disks = extra_disks })
    need, volumes = need + 1, volumes + #extra_volumes
  else
    others = others + 1
    if others % 4 == 1 then
      pair(items, { namespace = ns, name = name,
        vm = { volumes = A { fleet.system_volume(name), fleet.cloudinit_volume(name), fleet.csi_volume(csi) },
               disks = A { fleet.system_disk(1), fleet.cloudinit_disk(), fleet.csi_disk(csi) } } })
    else
      pair(items, { namespace = ns, name = name })
    end
  end
  for k = first, #items do
    local labels = items[k].metadata.labels
    for l = 1, rand(4) do labels[("tenant.cozystack.io/label-%d"):format(l)] = ("value-%d"):format(rand(100000)) end
    add_managed_fields(items[k])
  end
end

-- cozy.json: compact, keys sorted; the fixture builders mark arrays their way
local function mark(v)
  if type(v) ~= "table" then return v end
  for _, e in pairs(v) do mark(e) end
  if fleet.is_array(v) then return setmetatable(v, json.array_mt) end
  if getmetatable(v) == nil then
    if v[1] ~= nil then return setmetatable(v, json.array_mt) end
    return setmetatable(v, json.object_mt)
  end
  return v
end
local text = json.encode(mark(fleet.list(items)))
local f = assert(io.open(out, "w"))
f:write(text, "\n")
f:close()
print(("%d VMs, %d VMIs, %d namespaces, %d VMs need the copy, %d volumes to copy, %d bytes"):format(
  count, count, nns, need, volumes, #text + 1))
