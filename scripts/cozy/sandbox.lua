-- The environment a migration runs in: an allow-list, as Redis does for its
-- scripts. A migration reaches the cluster only through the ctx the engine
-- hands it, so nothing here can run a process, exit the engine, read files,
-- reach the debug library or load binary chunks (which can break out of
-- the VM). Library tables are copies, so a migration that assigns to
-- string.format changes its own copy, not the engine's.
local proc = require "cozy.proc"

local sandbox = {}

-- Modules a migration may require; each gets its own shallow copy.
sandbox.modules = { ["cozy.json"] = true }

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

local base_names = {
  "assert", "error", "ipairs", "next", "pairs", "pcall", "xpcall", "select",
  "tonumber", "tostring", "type", "rawequal", "rawget", "rawlen", "rawset",
  "setmetatable", "_VERSION",
}

-- While an armed proc.watch says stop (a signal, a passed deadline), an
-- error caught by a migration's pcall, xpcall or coroutine.resume is raised
-- again: otherwise `while true do pcall(f) end` would swallow every stop the
-- watch's hook raises inside f.
local pending_stop = proc.pending_stop

local function rethrow(ok, ...)
  if not ok and pending_stop() then error((...), 0) end
  return ok, ...
end

local function watched_pcall(f, ...) return rethrow(pcall(f, ...)) end
local function watched_xpcall(f, handler, ...) return rethrow(xpcall(f, handler, ...)) end
local function watched_resume(co, ...) return rethrow(coroutine.resume(co, ...)) end

-- A fresh environment for one migration.
function sandbox.env()
  local env = {}
  for _, name in ipairs(base_names) do env[name] = _G[name] end
  env.pcall, env.xpcall = watched_pcall, watched_xpcall

  -- string.dump is left out: it is the way to produce binary chunks
  env.string = copy(string)
  env.string.dump = nil
  env.table = copy(table)
  env.math = copy(math)
  env.utf8 = copy(utf8)
  env.coroutine = copy(coroutine)
  env.coroutine.resume = watched_resume
  env.os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }

  -- Only tables: the shared string metatable (whose __index is the
  -- engine's string library) stays out of reach.
  env.getmetatable = function(v)
    if type(v) ~= "table" then return nil end
    return getmetatable(v)
  end

  -- Text chunks only, in this environment unless another is given.
  env.load = function(chunk, name, mode, chunk_env)
    if mode ~= nil and mode ~= "t" then
      return nil, "cozy sandbox: only text chunks can be loaded"
    end
    return load(chunk, name, "t", chunk_env or env)
  end

  env.require = function(name)
    if not sandbox.modules[name] then
      error(("cozy sandbox: module '%s' is not available to migrations"):format(tostring(name)), 2)
    end
    return copy(require(name))
  end

  env._G = env
  return env
end

-- Loads and runs a migration's source in a fresh sandbox. Returns what the
-- chunk returns, or nil and a message ("name:line: ..." for syntax errors).
function sandbox.load(source, chunkname)
  local env = sandbox.env()
  local chunk, err = load(source, "@" .. chunkname, "t", env)
  if chunk == nil then return nil, err end
  local ok, result = pcall(chunk)
  if not ok then
    return nil, tostring(result)
  end
  return result
end

return sandbox
