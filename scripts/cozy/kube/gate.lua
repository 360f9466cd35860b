-- The gate: the one object that decides whether a request may be sent and
-- whether each attempt of a write may go out (docs/architecture.md, "The
-- choke point and its gates"). Client:prepare asks it for every request, a
-- single one (Client:call) or one of a batch (the update engine) alike.
--
-- Its rules:
--   who          whose requests these are, for the messages
--   permissions  the declared permissions (a migration's view): a request
--                they do not cover, or that cannot be judged as the API
--                server routes it, is refused (kind "denied")
--   read_only    why writes are refused (kind "readonly"): check()
--   guard(method, path)  before every write: raises to stop it (a signal)
--   lock         a slot { holder = <runner/lease.lua Holder> }: once the
--                lock is held, every write and each of its attempts needs
--                it (Holder:check, Holder:before_attempt), and an attempt's
--                time is bounded (Holder:attempt_timeout)
local errors = require "cozy.errors"
local request = require "cozy.kube.request"

local gate = {}

local Gate = {}
Gate.__index = Gate
gate.Gate = Gate

function gate.new(o)
  o = o or {}
  return setmetatable({ who = o.who, permissions = o.permissions, read_only = o.read_only,
    guard = o.guard, lock = o.lock }, Gate)
end

-- A gate for a migration's view: its own rules (who, permissions,
-- read_only, guard) over this gate's lock.
function Gate:narrow(o)
  return gate.new { who = o.who, permissions = o.permissions, read_only = o.read_only,
    guard = o.guard, lock = self.lock }
end

local function holder(self)
  return self.lock and self.lock.holder
end

local function refuse(self, kind, why, method, path)
  errors.raise(kind, why, { migration = self.who, method = method, path = path })
end

-- May this request be sent? Decided from the request alone (its method,
-- path and query pairs); raises a cozy.errors error if not. `internal`:
-- the engine's own reads on the caller's behalf (a client dry run's
-- simulation), which the permissions do not judge.
function Gate:admit(method, path, query, write, internal)
  if self.permissions and not internal then
    local a = request.attributes(method, path, request.query_table(query))
    if a.unroutable then
      refuse(self, "denied",
        ("%s sent %s %s, which cannot be judged as the API server routes it (%s); "
        .. "nothing was sent"):format(self.who or "a migration", method, path, a.unroutable),
        method, path)
    end
    if not request.allowed(self.permissions, a) then
      refuse(self, "denied", ("%s sent %s %s, which its permissions do not declare; declare %s")
        :format(self.who or "a migration", method, path, request.declaration(a)), method, path)
    end
  end
  if not write then return end
  if self.read_only then
    refuse(self, "readonly", ("%s attempted a write, %s %s: %s; nothing was sent")
      :format(self.who or "a read-only caller", method, path, self.read_only), method, path)
  end
  if self.guard then self.guard(method, path) end
  local h = holder(self)
  if h then h:check() end
end

-- The decisions for each attempt of an admitted write: the transport's
-- before_attempt (under the lock: sent only while it is certainly held
-- until after the attempt; docs/transport.md, "The lock and retried
-- writes") and the attempt's timeout when the caller gave none. Both nil
-- when no lock is held.
function Gate:attempts(timeout)
  if self.lock == nil then return nil, timeout end
  local h = holder(self)
  local function before_attempt(info)
    local now = holder(self)
    if now then return now:before_attempt(info) end
  end
  if timeout == nil and h then timeout = h:attempt_timeout() end
  return before_attempt, timeout
end

return gate
