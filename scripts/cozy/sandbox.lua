-- The environment a migration runs in: an allow-list, as Redis does for its
-- scripts. A migration reaches the cluster only through the ctx the engine
-- hands it, so nothing here can run a process, exit the engine, read files,
-- reach the debug library or load binary chunks (which can break out of
-- the VM). Library tables are copies, so a migration that assigns to
-- string.format changes its own copy, not the engine's.
local json = require "cozy.json"
local proc = require "cozy.proc"
local sys = require "cozy.sys"

local sandbox = {}

-- Modules a migration may require; each gets its own copy, made by the
-- function given here (tables the engine shares are offered read-only).
sandbox.modules = {}

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- What a migration holds of the engine is a proxy: an empty table whose
-- metatable (never readable: __metatable, and the sandbox's getmetatable
-- refuses it) reaches the real state only through closures. pairs hands
-- out an iterator closure and the proxy itself, never the table behind it,
-- and the sandbox's next, rawget and rawlen see what pairs, indexing and #
-- see, while rawset refuses it: no means a migration has leads past a
-- proxy to a table the engine uses. The registry of proxies (weak keys, so
-- a dropped proxy goes) is never exposed either.
local proxies = setmetatable({}, { __mode = "k" })

-- Turns `proxy` into the read-only proxy of `state` (a table held from
-- here on only by these closures), named `name` in the error a write
-- raises. opts.index(k): what a key `state` lacks reads as (computed
-- fields); opts.call: the proxy's __call.
local function make_proxy(proxy, state, name, opts)
  opts = opts or {}
  local fallback = opts.index
  local function index(_, k)
    local v = rawget(state, k)
    if v == nil and fallback then return fallback(k) end
    return v
  end
  local function iterate(_, k) return next(state, k) end
  local function len() return rawlen(state) end
  proxies[proxy] = { index = index, iterate = iterate, len = len }
  return setmetatable(proxy, {
    __index = index,
    __newindex = function() error(("%s is read-only"):format(name), 2) end,
    __pairs = function() return iterate, proxy, nil end,
    __len = len,
    __call = opts.call,
    __metatable = false,
  })
end

-- A read-only live view of an engine table `t` (counters, a marker): reads
-- see its current state, nothing reaches t itself.
function sandbox.view(t, name, opts)
  return make_proxy({}, t, name, opts)
end

-- Seals table t in place (its identity kept: facade methods compare their
-- first argument with it): its fields move into a table only the proxy's
-- closures hold, and t becomes their read-only proxy.
function sandbox.seal(t, name, opts)
  local fields = {}
  for k, v in next, t do fields[k] = v end
  for k in next, fields do t[k] = nil end
  return make_proxy(t, fields, name, opts)
end

-- Whether v is one of the engine's proxies.
function sandbox.is_proxy(v)
  return proxies[v] ~= nil
end

-- The raw functions a migration gets: on a proxy they see what pairs,
-- indexing and # see, and rawset raises; on anything else they are Lua's.
local function guarded_next(t, k)
  local p = proxies[t]
  if p then return p.iterate(t, k) end
  return next(t, k)
end
local function guarded_rawget(t, k)
  local p = proxies[t]
  if p then return p.index(t, k) end
  return rawget(t, k)
end
local function guarded_rawlen(t)
  local p = proxies[t]
  if p then return p.len() end
  return rawlen(t)
end
local function guarded_rawset(t, k, v)
  if proxies[t] then
    error("cozy sandbox: rawset of an engine object is not available to migrations", 2)
  end
  return rawset(t, k, v)
end

-- The JSON markers: a migration sees read-only stand-ins (as json.array_mt
-- and from getmetatable on a decoded value); setmetatable with a stand-in
-- marks the table for real.
local markers = {
  [json.array_mt] = sandbox.view(json.array_mt, "json.array_mt"),
  [json.object_mt] = sandbox.view(json.object_mt, "json.object_mt"),
}
local marker_of = {}
for real, standin in pairs(markers) do marker_of[standin] = real end

sandbox.modules["cozy.json"] = function()
  local m = copy(json)
  m.array_mt, m.object_mt = markers[json.array_mt], markers[json.object_mt]
  return m
end

sandbox.modules["cozy.obj"] = function() return copy(require "cozy.obj") end
-- Name matching (globs, regular expressions): pure functions of their
-- arguments, in Lua, so under the step's watch like the migration's own code.
sandbox.modules["cozy.match"] = function() return copy(require "cozy.match") end
-- Whole migrations from a description (delete if present): tables of plain
-- data and a walk that reaches the cluster only through the ctx it is given.
sandbox.modules["cozy.recipe"] = function() return copy(require "cozy.recipe") end
-- A migration as a rule (selections, policies, one walk): a table of plain
-- data and a walk that reaches the cluster only through the ctx it is given.
sandbox.modules["cozy.rule"] = function()
  local rule = require "cozy.rule"
  local m = setmetatable(copy(rule), getmetatable(rule))
  -- a table of its own: no migration's assignment reaches another's conditions
  m.conditions = copy(rule.conditions)
  return m
end
-- base64 (a Secret's data): pure functions of their arguments, in Lua.
sandbox.modules["cozy.base64"] = function() return copy(require "cozy.base64") end

-- Every string shares one metatable, whose __index is what `("").name`
-- reaches, in a migration as anywhere: point it at a copy of the string
-- library without `dump`, so that a migration cannot make binary chunks
-- through a string's methods either. The engine's own `string` table keeps
-- dump; nothing calls it as a method.
do
  local methods = copy(string)
  methods.dump = nil
  debug.getmetatable("").__index = methods
end

local base_names = {
  "assert", "error", "ipairs", "next", "pairs", "pcall", "xpcall", "select",
  "tonumber", "tostring", "type", "rawequal", "rawget", "rawlen", "rawset",
  "_VERSION",
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
-- A migration's message handler does not run while a stop is pending: one
-- that loops would otherwise turn the stop into "error in error handling".
local function watched_xpcall(f, handler, ...)
  -- a handler that is not a function is xpcall's own argument error
  if type(handler) ~= "function" then return rethrow(xpcall(f, handler, ...)) end
  return rethrow(xpcall(f, function(e)
    if pending_stop() then return e end
    return handler(e)
  end, ...))
end
local function watched_resume(co, ...) return rethrow(coroutine.resume(co, ...)) end
-- coroutine.close runs the coroutine's pending <close> handlers and returns
-- their error: a stop raised in one must not end there.
local function watched_close(co) return rethrow(coroutine.close(co)) end

-- A fresh environment for one migration.
function sandbox.env()
  local env = {}
  for _, name in ipairs(base_names) do env[name] = _G[name] end
  env.pcall, env.xpcall = watched_pcall, watched_xpcall
  env.next, env.rawget, env.rawlen, env.rawset = guarded_next, guarded_rawget, guarded_rawlen,
    guarded_rawset

  -- string.dump is left out: it is the way to produce binary chunks
  env.string = copy(string)
  env.string.dump = nil
  env.table = copy(table)
  env.math = copy(math)
  env.utf8 = copy(utf8)
  env.coroutine = copy(coroutine)
  env.coroutine.resume = watched_resume
  env.coroutine.close = watched_close
  env.os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }

  -- Metatables: a migration may set and read those of its own tables, and
  -- see read-only stand-ins of the JSON markers. An engine object's
  -- metatable (and the shared string metatable) stays out of reach: asking
  -- for it, or replacing it, raises.
  local own = setmetatable({}, { __mode = "k" })
  env.getmetatable = function(v)
    if type(v) ~= "table" then return nil end
    local mt = debug.getmetatable(v)
    if mt == nil or own[mt] then return getmetatable(v) end
    if markers[mt] then return markers[mt] end
    error("cozy sandbox: the metatable of an engine object is not available to migrations", 2)
  end
  env.setmetatable = function(t, mt)
    if type(t) ~= "table" then error("bad argument #1 to 'setmetatable' (table expected)", 2) end
    local current = debug.getmetatable(t)
    if current ~= nil and not own[current] and not markers[current] then
      error("cozy sandbox: cannot change the metatable of an engine object", 2)
    end
    if mt ~= nil and type(mt) ~= "table" then
      error("bad argument #2 to 'setmetatable' (nil or table expected)", 2)
    end
    if marker_of[mt] then
      mt = marker_of[mt]
    elseif mt ~= nil then
      if markers[mt] == nil and debug.getmetatable(mt) ~= nil
        and not own[debug.getmetatable(mt)] then
        error("cozy sandbox: cannot use an engine object as a metatable", 2)
      end
      -- a finalizer runs with hooks off, out of reach of a stop or deadline
      if rawget(mt, "__gc") ~= nil then
        error("cozy sandbox: __gc metamethods are not available to migrations", 2)
      end
      own[mt] = true
    end
    return setmetatable(t, mt)
  end

  -- Text chunks only, in this environment unless another is given. load
  -- calls a reader function in protected mode and returns what it raised:
  -- a stop raised in the reader is raised again, as pcall does.
  env.load = function(chunk, name, mode, chunk_env)
    if mode ~= nil and mode ~= "t" then
      return nil, "cozy sandbox: only text chunks can be loaded"
    end
    local loaded, err = load(chunk, name, "t", chunk_env or env)
    if loaded == nil and pending_stop() then error(err, 0) end
    return loaded, err
  end

  env.require = function(name)
    local open = sandbox.modules[name]
    if not open then
      error(("cozy sandbox: module '%s' is not available to migrations"):format(tostring(name)), 2)
    end
    return open()
  end

  env._G = env
  return env
end

-- Runs fn(...) under a watch made of `watch_opts` (deadline, on_stop) and
-- returns ok, what fn returned or raised, and the traceback of what it
-- raised. The watch stays armed until the stack has unwound: the <close>
-- handlers a failing fn leaves run after the message handler, and they are
-- migration code too. Only then is it closed.
function sandbox.watched(watch_opts, fn, ...)
  local watch = proc.watch(watch_opts)
  local trace
  local result = table.pack(xpcall(fn, function(e)
    -- a stop needs no traceback, and the fewer instructions run here under
    -- a firing hook the better (an error in the handler loses the stop)
    if not pending_stop() then trace = debug.traceback(type(e) == "string" and e or nil, 2) end
    return e
  end, ...))
  watch:close()
  if result[1] then return table.unpack(result, 1, result.n) end
  return false, result[2], trace
end

-- How long a migration file's top level may run (it should only build the
-- migration table): a file that does not return within it is refused.
sandbox.LOAD_TIMEOUT = 5

-- Loads and runs a migration's source in a fresh sandbox, stopped by a
-- signal or after `timeout` seconds (default sandbox.LOAD_TIMEOUT). Returns
-- what the chunk returns, or nil, a message ("name:line: ..." for syntax
-- errors) and, when a watch stopped it, "signal" or "deadline".
-- `compiled`, for a built-in migration only, is its load(env) from
-- sys.builtin_migrations(): the same text compiled when the binary was
-- built, which spares parsing it at every start. Anything else is loaded
-- from `source`, as text only.
function sandbox.load(source, chunkname, timeout, compiled)
  local env = sandbox.env()
  local chunk, err
  if compiled then
    chunk, err = compiled(env)
  else
    chunk, err = load(source, "@" .. chunkname, "t", env)
  end
  if chunk == nil then return nil, err end
  timeout = timeout or sandbox.LOAD_TIMEOUT
  local stopped
  local ok, result = sandbox.watched({ deadline = sys.monotime() + timeout,
    on_stop = function(reason, detail, where)
    stopped = reason
    if reason == "signal" then
      error(("interrupted by signal %d while loading (at %s)"):format(detail, where), 0)
    end
    error(("its top level did not return within %ss (at %s): it must only build the "
      .. "migration table")
      :format(tostring(timeout), where), 0)
  end }, chunk)
  if not ok then
    local text = type(result) == "string" and result or ("(error object is a %s value)")
      :format(type(result))
    return nil, text, stopped
  end
  return result
end

return sandbox
