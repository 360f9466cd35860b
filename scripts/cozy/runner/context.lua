-- The `ctx` a migration's run(ctx) and check(ctx) receive (docs/engine-api.md).
-- ctx.kube is the engine's client behind a guard: before every write (and
-- before every attempt of an update) the runner checks that it still holds
-- the lock and was not asked to stop, so a lost lock or a SIGTERM stops a
-- migration before its next write, never in the middle of one.
local errors = require "cozy.runner.errors"

local context = {}

local write_methods = {
  create = true, merge_patch = true, json_patch = true, delete = true,
  update = true, replace = true, patch = true, apply = true,
}

-- A method of `target` called on the proxy runs with self = target.
local function forward(target, proxy, v)
  if type(v) ~= "function" then return v end
  return function(self, ...)
    if self == proxy then self = target end
    return v(self, ...)
  end
end

local function describe_target(k, ...)
  local a, b = ...
  if type(a) == "table" then
    local md = a.metadata or {}
    return { op = k, namespace = md.namespace, name = md.name }
  end
  if type(b) == "string" then return { op = k, namespace = a, name = b } end
  return { op = k, name = a }
end

local function guarded_resource(res, guard, log)
  local proxy = {}
  return setmetatable(proxy, {
    __index = function(_, k)
      local v = res[k]
      if type(v) ~= "function" or not write_methods[k] then return forward(res, proxy, v) end
      return function(self, ...)
        if self == proxy then self = res end
        guard()
        if log then
          local fields = describe_target(k, ...)
          fields.resource = res.plural
          log:debug("write", fields)
        end
        if k == "update" then
          -- update(ns, name, mutate) or update(obj, mutate): every attempt is a write
          local args = table.pack(...)
          local last = args[args.n]
          if type(last) == "function" then
            args[args.n] = function(obj) guard(); return last(obj) end
          end
          return v(self, table.unpack(args, 1, args.n))
        end
        return v(self, ...)
      end
    end,
  })
end

-- The client as a migration sees it: every write checked by guard (and
-- logged at debug level). With no guard, the client itself.
function context.guard_client(client, guard, log)
  if guard == nil then return client end
  local proxy = {}
  return setmetatable(proxy, {
    __index = function(_, k)
      if k == "resource" then
        return function(self, ...)
          if self == proxy then self = client end
          return guarded_resource(client.resource(self, ...), guard, log)
        end
      end
      return forward(client, proxy, client[k])
    end,
  })
end

local severities = { info = true, warn = true, block = true }

-- opts: client, log, namespace, from, to, mode ("run"|"plan"|"check"),
-- guard (function raising to stop before a write), findings (array that
-- ctx.finding appends to).
function context.new(opts)
  local log = opts.log
  local findings = opts.findings or {}
  local ctx = {
    kube = context.guard_client(opts.client, opts.guard, log),
    log = log,
    namespace = opts.namespace,
    from = opts.from,
    to = opts.to,
    mode = opts.mode or "run",
    findings = findings,
  }
  function ctx.progress(label, total)
    return log:progress(label, total)
  end
  function ctx.finding(severity, message, fields)
    if not severities[severity] then
      error(("ctx.finding: severity must be \"info\", \"warn\" or \"block\", got %q"):format(tostring(severity)), 2)
    end
    findings[#findings + 1] = { severity = severity, message = tostring(message), fields = fields }
    local level = severity == "info" and "info" or (severity == "warn" and "warn" or "error")
    log:write(level, "finding: " .. tostring(message), fields)
  end
  return ctx
end

-- Guard helpers for the runner.
function context.stop_error(e)
  return errors.is(e, "lost") or errors.is(e, "interrupted")
end

return context
