-- Benchmark: what every change of cozy.kube computes for one object (copy it,
-- let the edit run on the copy, diff the two) with json.copy and json.diff,
-- against the Lua versions they replaced (spec/fixtures/json/lua_copy_diff.lua),
-- in the same process, on the lean VMs migration 59 writes.
--
--   build/cozy-migrate lua bench/json/copy_diff.lua [MEGABYTES=5] [REPETITIONS=9]
--
-- The VMs of spec/fixtures/json/klist.lua's List, decoded with 59's projection;
-- the edit appends a hotplugged volume, as 59 does. Each repetition times the
-- Lua pair and then the C pair over every VM (after a full collection each);
-- reported are the medians per VM and their ratio. CPU time (os.clock).
local json = require "cozy.json"
local kube = require "cozy.kube"

local here = (arg and arg[0] or ""):match("^(.*)/bench/json/[^/]*$") or "."
local klist = dofile(here .. "/spec/fixtures/json/klist.lua")
local median = dofile(here .. "/bench/json/median.lua")
local reference = dofile(here .. "/spec/fixtures/json/lua_copy_diff.lua")

local megabytes = tonumber(arg[1]) or 5
local reps = tonumber(arg[2]) or 9
local text = klist.generate(math.floor(megabytes * 1024 * 1024))
local lean = kube.projection { "spec.template.spec.volumes", "spec.template.spec.domain.devices.disks",
  "spec.template.spec.domain.devices.interfaces", "status.volumeRequests" }
local list = json.decode(text, { items = { ["*"] = lean } })
local vms = {}
for _, item in ipairs(list.items) do
  if item.kind == "VirtualMachine" and item.spec then vms[#vms + 1] = item end
end
list, text = nil, nil -- luacheck: ignore

local volume = { name = "hotplug", dataVolume = { name = "hotplug", hotpluggable = true } }
local function edit(vm)
  local spec = vm.spec.template.spec
  spec.volumes = spec.volumes or json.array {}
  spec.volumes[#spec.volumes + 1] = volume
end

local function measure(copy, diff)
  collectgarbage("collect")
  local ops = 0
  local t0 = os.clock()
  for i = 1, #vms do
    local c = copy(vms[i])
    edit(c)
    ops = ops + #diff(vms[i], c)
  end
  return os.clock() - t0, ops
end

local times = { lua = {}, c = {} }
local nops = {}
measure(reference.deepcopy, reference.diff) -- warm up once
measure(json.copy, json.diff)
for _ = 1, reps do
  local t, n = measure(reference.deepcopy, reference.diff)
  times.lua[#times.lua + 1], nops.lua = t, n
  t, n = measure(json.copy, json.diff)
  times.c[#times.c + 1], nops.c = t, n
end
assert(nops.lua == nops.c and nops.c == #vms, "the two versions disagree on the number of ops")


local size = 0
for _, vm in ipairs(vms) do size = size + #json.encode(vm) end
print(("%d lean VMs (%d bytes of JSON each on average); %d repetitions"):format(#vms, size // #vms, reps))
print(("Lua copy + diff: %.1f us a VM"):format(median(times.lua) / #vms * 1e6))
print(("C copy + diff:   %.1f us a VM"):format(median(times.c) / #vms * 1e6))
print(("ratio C / Lua: %.2f"):format(median(times.c) / median(times.lua)))
