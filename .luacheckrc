-- luacheck configuration (hack/lint.sh): the engine's runtime, the
-- migrations and the specs are Lua 5.4; specs run under busted.
std = "lua54"
-- long log and finding messages are easier to grep for whole
max_line_length = 160
-- a to-be-closed variable held only for its scope: local _w <close> = ...
ignore = { "211/_.*" }

files["spec"] = { std = "+busted" }
-- migrations/ and scripts/ at 100 columns (issue 37)
files["scripts"] = { max_line_length = 100 }
-- migrations see only the sandbox's allow-list (scripts/cozy/sandbox.lua)
files["migrations"] = {
  std = "min",
  max_line_length = 100,
  read_globals = { "assert", "error", "ipairs", "next", "pairs", "pcall", "xpcall", "select", "tonumber",
    "tostring", "type", "rawequal", "rawget", "rawlen", "rawset", "getmetatable", "setmetatable", "load",
    "require", "string", "table", "math", "utf8", "coroutine", "os", "_VERSION" },
}
-- LuaCATS definitions (---@meta): stubs whose arguments are only named
files["types"] = { unused = false }
exclude_files = {
  "build/", "build-asan/", "build-fuzz/",
  -- deliberately broken: the runner must refuse it
  "spec/fixtures/runner/syntax/2-broken.lua",
  -- generated-looking data tables: realistic objects, one per line
  "spec/fixtures/json/klist.lua",
}
