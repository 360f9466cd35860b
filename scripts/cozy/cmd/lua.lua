-- `cozy-migrate lua`: behaves like the lua5.4 interpreter with the engine's
-- modules preloaded: `lua SCRIPT ARGS`, `lua -e CODE [ARGS]`, `lua -` or
-- `lua` (read the chunk from stdin). The `arg` global is set as lua.c sets
-- it, so busted runs unchanged: `cozy-migrate lua /usr/bin/busted spec/...`.
local M = {}

local function usage()
  io.stderr:write("usage: cozy-migrate lua [SCRIPT [ARGS...]] | lua -e CODE [ARGS...] | lua -\n")
  return 2
end

local function fail(msg)
  io.stderr:write("cozy-migrate lua: ", tostring(msg), "\n")
  return 1
end

-- argv is cozy.cli.main's argv: [0] program, [1] "lua", [2..] the rest.
function M.run(argv)
  local prog = argv[0] or "cozy-migrate"
  local chunk, err, name, first
  local a = argv[2]
  if a == "-e" then
    if argv[3] == nil then return usage() end
    chunk, err = load(argv[3], "=(command line)", "t")
    name, first = prog, 4
  elseif a == nil or a == "-" then
    chunk, err = load(io.stdin:read("a"), "=stdin", "t")
    name, first = "-", 3
  elseif a:sub(1, 1) == "-" and a ~= "--" then
    return usage()
  else
    if a == "--" then
      a = argv[3]
      if a == nil then return usage() end
      first = 4
    else
      first = 3
    end
    name = a
    -- "t": like lua.c reads scripts; binary chunks are never loaded by this host
    chunk, err = loadfile(a, "t")
  end
  if chunk == nil then return fail(err) end
  -- like lua.c: arg[0] is the script, arg[1..] its arguments, negative
  -- indices the interpreter and its options
  local script_arg = { [0] = name, [-1] = prog .. " lua" }
  local script_args = {}
  for i = first, #argv do
    script_arg[i - first + 1] = argv[i]
    script_args[#script_args + 1] = argv[i]
  end
  _G.arg = script_arg
  local ok, res = xpcall(chunk, function(e)
    if type(e) ~= "string" then
      local mt = getmetatable(e)
      e = (mt and mt.__tostring) and tostring(e) or ("(error object is a %s value)"):format(type(e))
    end
    return debug.traceback(e, 2)
  end, table.unpack(script_args))
  if not ok then return fail(res) end
  return 0
end

return M
