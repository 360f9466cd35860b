-- Decodes the realistic Kubernetes List of bench/json/run.lua a few times,
-- fully, with run.lua's projection, or skipping all of it but `kind`, and
-- nothing else: a workload for
-- callgrind, whose instruction counts (unlike times) hold on a loaded machine.
--
--   valgrind --tool=callgrind --toggle-collect=json_decode --callgrind-out-file=cg.full \
--     build/cozy-migrate lua bench/json/count.lua full [MEGABYTES=1] [DECODES=3]
--   ... count.lua projected ...    ... count.lua skip ...
--   callgrind_annotate cg.full | head            # instructions of json_decode alone
--
-- Prints the input's size, so that instructions per MB can be worked out.
local json = require "cozy.json"

local here = (arg and arg[0] or ""):match("^(.*)/bench/json/[^/]*$") or "."
local klist = dofile(here .. "/spec/fixtures/json/klist.lua")

local mode = arg[1] or "full"
local megabytes = tonumber(arg[2]) or 1
local decodes = tonumber(arg[3]) or 3
assert(mode == "full" or mode == "projected" or mode == "skip", "mode: full, projected or skip")

-- the projection of bench/json/run.lua
local projection = { kind = true, apiVersion = true, metadata = true,
  items = { ["*"] = { kind = true, metadata = { name = true, namespace = true, resourceVersion = true, uid = true },
    spec = { template = { spec = { volumes = true, domain = { devices = { disks = true } } } } },
    status = { phase = true, volumeStatus = true } } } }

local text, count = klist.generate(math.floor(megabytes * 1024 * 1024))
-- skip: every item is skipped (validated, not built), what skipping alone costs
local proj = ({ projected = projection, skip = { kind = true } })[mode]
for _ = 1, decodes do
  local v = json.decode(text, proj)
  assert(mode == "skip" and v.items == nil or #v.items == count)
end
print(("%s: %d decodes of %d bytes (%d items)"):format(mode, decodes, #text, count))
