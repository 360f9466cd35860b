-- Benchmark: decode + encode of a realistic ~5 MB Kubernetes List with
-- cozy.json, against raw lua-cjson on the same text, in the same process.
--
--   build/cozy-migrate lua bench/json/run.lua [MEGABYTES=5] [REPETITIONS=9]
--
-- Each repetition times cjson and cozy.json back to back (after a full
-- collection each), so drift hits both alike; reported are the medians and
-- the best times, and the ratio cozy.json / cjson of decode + encode. CPU
-- time (os.clock): the process is single-threaded.
local json = require "cozy.json"
local cjson = require "cjson"

local here = (arg and arg[0] or ""):match("^(.*)/bench/json/[^/]*$") or "."
local klist = dofile(here .. "/spec/fixtures/json/klist.lua")
local median = dofile(here .. "/bench/json/median.lua")

local megabytes = tonumber(arg[1]) or 5
local reps = tonumber(arg[2]) or 9
local text, count = klist.generate(math.floor(megabytes * 1024 * 1024))

local function measure(lib)
  collectgarbage("collect")
  local t0 = os.clock()
  local v = lib.decode(text)
  local t1 = os.clock()
  local out = lib.encode(v)
  local t2 = os.clock()
  return t1 - t0, t2 - t1, #out
end

local results = { cjson = { dec = {}, enc = {}, tot = {} }, ["cozy.json"] = { dec = {}, enc = {}, tot = {} } }
local libs = { { "cjson", cjson }, { "cozy.json", json } }
local sizes = {}
measure(cjson) -- warm up allocator and caches once
measure(json)
for _ = 1, reps do
  for _, l in ipairs(libs) do
    local d, e, n = measure(l[2])
    local r = results[l[1]]
    r.dec[#r.dec + 1], r.enc[#r.enc + 1], r.tot[#r.tot + 1] = d, e, d + e
    sizes[l[1]] = n
  end
end

local function best(t) return math.min(table.unpack(t)) end

print(("input: %d bytes, %d items; %d repetitions; output: cjson %d bytes, cozy.json %d bytes")
  :format(#text, count, reps, sizes.cjson, sizes["cozy.json"]))
print(("%-10s %12s %12s %12s %12s"):format("", "decode ms", "encode ms", "total ms", "best total"))
for _, l in ipairs(libs) do
  local r = results[l[1]]
  print(("%-10s %12.1f %12.1f %12.1f %12.1f"):format(l[1], median(r.dec) * 1e3, median(r.enc) * 1e3,
    median(r.tot) * 1e3, best(r.tot) * 1e3))
end
local c, z = results.cjson, results["cozy.json"]
print(("ratio cozy.json/cjson: decode %.2f, encode %.2f, decode+encode %.2f (median), %.2f (best)")
  :format(median(z.dec) / median(c.dec), median(z.enc) / median(c.enc),
    median(z.tot) / median(c.tot), best(z.tot) / best(c.tot)))

-- Projection while decoding: what a lean listing saves.
local projection = { kind = true, apiVersion = true, metadata = true,
  items = { ["*"] = { kind = true, metadata = { name = true, namespace = true, resourceVersion = true, uid = true },
    spec = { template = { spec = { volumes = true, domain = { devices = { disks = true } } } } },
    status = { phase = true, volumeStatus = true } } } }
local function decode_timed(proj)
  collectgarbage("collect")
  local before = collectgarbage("count")
  local t0 = os.clock()
  local v = json.decode(text, proj)
  local t1 = os.clock()
  collectgarbage("collect")
  local kib = collectgarbage("count") - before
  assert(#v.items == count)
  return t1 - t0, kib
end
local full_t, proj_t, full_kib, proj_kib = {}, {}, 0, 0
decode_timed(nil)
decode_timed(projection)
for i = 1, reps do
  full_t[i], full_kib = decode_timed(nil)
  proj_t[i], proj_kib = decode_timed(projection)
end
print(("decode full %.1f ms (%.0f KiB held), projected %.1f ms (%.0f KiB held)")
  :format(median(full_t) * 1e3, full_kib, median(proj_t) * 1e3, proj_kib))
print(("ratio projected/full: time %.2f (median), memory %.3f"):format(median(proj_t) / median(full_t), proj_kib / full_kib))
