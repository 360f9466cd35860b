-- The Lua side of a cozy-migrate command, sampled: a count hook every 1,000
-- Lua VM instructions counts the function running (self) and every function
-- on the stack (inclusive), and the report goes to $PROF_OUT (default
-- lua-profile.txt). It counts Lua instructions only: time in C (JSON,
-- libcurl, the collector) shows in perf or callgrind, not here.
--
--   cozy-migrate lua bench/lua-profile.lua BIN COMMAND ARGS...
--
-- BIN is dropped (so that bench/run's --wrap can put this in front of the
-- engine's command line). The binary running this should be built with
-- proc.watch's hook off (bench/README.md, "Where the engine's CPU goes"):
-- a due stop replaces the thread's one hook, and this one with it.
local cli = require "cozy.cli"

local self_count, inclusive, samples = {}, {}, 0
local getinfo = debug.getinfo

local function sample()
  samples = samples + 1
  local top = getinfo(2, "Sn")
  if top then
    local k = ("%s:%d %s"):format(top.short_src, top.linedefined, top.name or "?")
    self_count[k] = (self_count[k] or 0) + 1
  end
  local seen = {}
  for level = 2, 64 do
    local f = getinfo(level, "S")
    if f == nil then break end
    local k = f.short_src .. ":" .. f.linedefined
    if not seen[k] then
      seen[k] = true
      inclusive[k] = (inclusive[k] or 0) + 1
    end
  end
end

local function report(out, counts, title)
  local rows = {}
  for k, n in pairs(counts) do rows[#rows + 1] = { k, n } end
  table.sort(rows, function(a, b) return a[2] > b[2] end)
  out:write(title, " (", samples, " samples of 1000 instructions)\n")
  for i = 1, math.min(60, #rows) do out:write(("%6.2f%%  %s\n"):format(rows[i][2] / samples * 100, rows[i][1])) end
end

local argv = { [0] = "cozy-migrate" }
for i = 2, #arg do argv[#argv + 1] = arg[i] end
debug.sethook(sample, "", 1000)
local ok, status = pcall(cli.main, argv)
debug.sethook()
local out = assert(io.open(os.getenv("PROF_OUT") or "lua-profile.txt", "w"))
report(out, self_count, "self")
report(out, inclusive, "inclusive")
out:close()
if not ok then error(status, 0) end
os.exit(status or 0)
