-- Writes the benchmark fleet of bench/m59 as a JSON v1 List, built with the
-- builders of migration 59's fixtures (spec/fixtures/59-vmi-hotplug/fleet.lua),
-- so the objects have the same full, realistic shape as the spec's:
--
--   build/cozy-migrate lua bench/m59/fleet.lua OUT.json [VMS=1000] [NAMESPACES=10]
--
-- Run from the repository root. Every VM has a Running VMI (its controller
-- reference set). VM i (1-based), by i % 5:
--   0  needs the copy (20%): its VMI holds hotplugged volumes the VM spec lacks;
--      alternately one kubevirt-csi DataVolume, or that and a `virtctl addvolume`
--      PVC (disk with a serial);
--   1  complete: the VM already lists its kubevirt-csi volume and disk;
--   2-4 plain: no hotplugged volume anywhere.
-- The version ConfigMap says 59. Deterministic: same arguments, same bytes.
-- Prints one line: VMs, VMIs, VMs needing the copy, volumes to copy.
local fleet = require "spec.fixtures.59-vmi-hotplug.fleet"
local generate = require "spec.fixtures.59-vmi-hotplug.generate"
local A, pair = fleet.A, fleet.pair

local out = assert(arg[1], "usage: fleet.lua OUT.json [VMS] [NAMESPACES]")
local count = math.tointeger(tonumber(arg[2] or "1000"))
local nns = math.tointeger(tonumber(arg[3] or "10"))
assert(count and count > 0 and nns and nns > 0, "VMS and NAMESPACES must be positive integers")

local namespaces = {}
for n = 0, nns - 1 do namespaces[#namespaces + 1] = ("tenant-bench-%02d"):format(n) end
local items = fleet.base(namespaces)

local need, volumes = 0, 0
for i = 1, count do
  -- Contiguous blocks, so every namespace gets its share of each kind.
  local ns = namespaces[(i - 1) * nns // count + 1]
  local name = ("kubernetes-md0-%05d"):format(i)
  local csi = ("pvc-%08d-1b2c-4d3e-8f40-%012d"):format(i, i)
  if i % 5 == 0 then
    local extra_volumes, extra_disks = { fleet.csi_volume(csi) }, { fleet.csi_disk(csi) }
    if (i // 5) % 2 == 0 then
      local scratch = ("scratch-%05d"):format(i)
      extra_volumes[2] = fleet.pvc_volume(scratch)
      extra_disks[2] = fleet.scsi_disk(scratch, { serial = ("SCRATCH%05d"):format(i) })
    end
    pair(items, { namespace = ns, name = name, extra_volumes = extra_volumes, extra_disks = extra_disks })
    need, volumes = need + 1, volumes + #extra_volumes
  elseif i % 5 == 1 then
    pair(items, { namespace = ns, name = name,
      vm = { volumes = A { fleet.system_volume(name), fleet.cloudinit_volume(name), fleet.csi_volume(csi) },
             disks = A { fleet.system_disk(1), fleet.cloudinit_disk(), fleet.csi_disk(csi) } } })
  else
    pair(items, { namespace = ns, name = name })
  end
end

local f = assert(io.open(out, "w"))
f:write(generate.encode(fleet.list(items)), "\n")
f:close()
print(("%d VMs, %d VMIs, %d namespaces, %d VMs need the copy, %d volumes to copy"):format(
  count, count, nns, need, volumes))
