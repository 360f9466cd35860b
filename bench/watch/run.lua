-- The cost of an armed proc.watch: the same workloads with and without one,
-- interleaved in one process, CPU time (os.clock); prints the median ratio
-- armed / plain per workload. See bench/README.md.
--   build/cozy-migrate lua bench/watch/run.lua [REPETITIONS=7]
local json = require "cozy.json"
local proc = require "cozy.proc"
local sys = require "cozy.sys"

local reps = tonumber(arg and arg[1]) or 7

-- pure Lua arithmetic: the worst case (every instruction is a VM instruction)
local function arithmetic()
  local s = 0
  for i = 1, 2e7 do s = s + i % 7 end
  return s
end

-- Lua that builds and walks tables and strings, as a migration computing
-- patches for a fleet does
local function tables()
  local out = {}
  for i = 1, 2e5 do
    local vm = { metadata = { name = "vm-" .. i, namespace = "tenant-" .. (i % 10) },
      spec = { volumes = { { name = "disk", dataVolume = { name = "dv-" .. i } } } } }
    local ops = {}
    for j, v in ipairs(vm.spec.volumes) do
      ops[#ops + 1] = { op = "add", path = "/spec/template/spec/volumes/" .. j, value = v }
    end
    out[i % 1000 + 1] = ops
  end
  return #out
end

-- mostly C: decode a list and read a field of each item
local list do
  local items = {}
  for i = 1, 3000 do
    items[i] = { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "vm-" .. i, namespace = "tenant-a", labels = { app = "x" .. i } },
      spec = { running = true, template = { spec = { domain = { cpu = { cores = 2 } } } } } }
  end
  list = json.encode { apiVersion = "v1", kind = "List", items = items }
end
local function decode()
  local n = 0
  for _ = 1, 5 do
    for _, it in ipairs(json.decode(list).items) do
      if it.metadata.name then n = n + 1 end
    end
  end
  return n
end

local function cpu(fn)
  collectgarbage()
  local t = os.clock()
  fn()
  return os.clock() - t
end

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

print(("%-12s %10s %10s %8s"):format("workload", "plain ms", "armed ms", "ratio"))
for _, case in ipairs { { "arithmetic", arithmetic }, { "tables", tables }, { "json", decode } } do
  local name, fn = case[1], case[2]
  local plain, armed, ratios = {}, {}, {}
  fn() -- warm-up
  for i = 1, reps do
    plain[i] = cpu(fn)
    local w = proc.watch { deadline = sys.monotime() + 3600 }
    armed[i] = cpu(fn)
    w:close()
    ratios[i] = armed[i] / plain[i]
  end
  print(("%-12s %10.1f %10.1f %8.2f"):format(name, median(plain) * 1e3, median(armed) * 1e3, median(ratios)))
end
