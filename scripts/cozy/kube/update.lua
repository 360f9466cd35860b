-- The update engine (docs/engine-api.md, "Changing objects"): one state
-- machine per object and one scheduler that drives any number of them.
-- Resource:update, change, update_each (serial, parallel and client dry
-- run) and the lock's takeover (runner/lease.lua) all come here, so the
-- conflict rule, the backoff and the deadline are written once.
--
-- One object's change:
--
--   read (when no base was given) -> compute(copy) -> ops?
--     none                     -> done (changed only if an earlier attempt
--                                 may have landed)
--     some -> PATCH [test resourceVersion, ops...] (Client:prepare, the gate)
--       2xx                    -> done, changed
--       409, or a 422 without causes whose re-read shows the object moved on
--                              -> conflict: wait a backoff, compute again on
--                                 the fresh object (bounded by attempts and
--                                 the deadline)
--       absent (404 naming it) -> absent
--       anything else          -> failed
--
-- The scheduler keeps up to `concurrency` changes in flight on one
-- transport batch (t:multi); concurrency 1 is the serial path. A write a
-- client dry run keeps back ends at once with its locally computed answer.
local json = require "cozy.json"
local sys = require "cozy.sys"
local transport = require "cozy.transport"
local errors = require "cozy.kube.errors"
local patch = require "cozy.kube.patch"

local update = {}

-- Did any attempt end in a way that leaves the write's fate unknown?
function update.uncertain(attempts)
  for _, a in ipairs(attempts or {}) do
    if a.code == 0 or a.code == 500 or a.code == 502 or a.code == 503 or a.code == 504 then
      return true
    end
  end
  return false
end
local uncertain = update.uncertain

-- The waits between attempts: the policy's backoff (a retry policy,
-- transport.retry_policy; the client's is "conflict"), computed by the
-- engine's one formula (transport.backoff, core/retry_policy.c) with a draw
-- of math.random, and never past `deadline` (cozy.sys monotonic time; nil:
-- none). Returns a function that gives the next wait.
function update.backoff(policy, deadline)
  local n = 0
  return function()
    n = n + 1
    local d = transport.backoff(policy, n)
    if deadline then d = math.max(0, math.min(d, deadline - sys.monotime())) end
    return d
  end
end

local Change = {}
Change.__index = Change
update.Change = Change

-- A change of one object. o:
--   resource   the cozy.kube Resource
--   ns, name   the object
--   obj        the base to start from (nil: read it first)
--   compute    function(current) -> ops, info: the JSON patch ops to apply
--              to `current` (nil or empty: nothing to do); info is kept
--   lean       a projection tree: re-reads and the answer are decoded lean
--   deadline   no attempt starts after it (cozy.sys monotonic time)
--   attempts   the most attempts (default: the client's update_policy's)
--   on_conflict(ch, err, delay)  told of each conflict it will wait out
--   anything else (item, value, ...) is the caller's and left alone
-- Its `state` ends "done" (result, changed, info), "absent" or "failed"
-- (err); "conflicts" counts the conflicts met, and gave_up is set when
-- they exhausted the attempts or the deadline.
function update.new(o)
  local c = o.resource.client
  o.policy = c.update_policy
  o.attempts = o.attempts or o.policy.max_attempts
  o.attempt, o.conflicts, o.maybe_applied, o.state = 1, 0, false, "ready"
  o.wait = update.backoff(o.policy, o.deadline)
  return setmetatable(o, Change)
end

function Change:path()
  return self.resource:path(self.ns, self.name)
end

function Change:_end(state, fields)
  self.state = state
  for k, v in pairs(fields) do self[k] = v end
  return nil
end

-- The request this change sends next (method, path, spec for
-- Client:prepare), or nil when it ended without one (nothing to change).
-- Raises what the read or compute raises.
function Change:request()
  if self.obj == nil then self.obj = self.resource:_get(self.ns, self.name, self.lean) end
  local rv = self.obj.metadata and self.obj.metadata.resourceVersion
  if rv == nil then error(("update: %s has no metadata.resourceVersion"):format(self:path()), 0) end
  local ops, info = self.compute(self.obj)
  self.info = info
  if ops == nil or next(ops) == nil then
    return self:_end("done", { result = self.obj, changed = self.maybe_applied })
  end
  local full = json.array { { op = "test", path = "/metadata/resourceVersion", value = rv } }
  for i = 1, #ops do full[i + 1] = ops[i] end
  self.rv = rv
  self.state = "sent"
  return self.resource:_patch_request(self.ns, self.name, full, self.obj, self.lean)
end

-- Was a failed PATCH a conflict of ours? A 409, or a 422 without causes
-- (some op failed, maybe our test) when the object moved on. Returns
-- ours, and the fresh object when it was read (raises what the read raises).
function Change:_conflict(res)
  if not errors.is_error(res) then return false end
  if res.code == 409 then return true end
  if res.code ~= 422 or errors.is_invalid_object(res) then return false end
  local fresh = self.resource:_get(self.ns, self.name, self.lean)
  return fresh.metadata.resourceVersion ~= self.rv, fresh
end

-- The answer to the request: ok and the answer, or false and the error.
-- Moves the change to "done", "absent", "failed" or, after a conflict,
-- "again" with `delay`, the seconds to wait before request() is called.
function Change:settle(ok, res)
  if ok then return self:_end("done", { result = res, changed = true }) end
  local cok, ours, fresh = pcall(self._conflict, self, res)
  if not cok then return self:settle(false, ours) end -- the re-read failed: that is the error
  if ours then
    local c = self.resource.client
    self.conflicts = self.conflicts + 1
    c.stats.conflicts = c.stats.conflicts + 1
    if uncertain(res.attempts) then self.maybe_applied = true end
    if c.log then
      c.log:debug("update conflict: re-reading and recomputing",
        { path = self:path(), attempt = self.attempt, code = res.code, resourceVersion = self.rv })
    end
    local delay = self.wait()
    local why
    if self.attempt >= self.attempts then
      why = ("gave up after %d conflicting attempts"):format(self.attempt)
    elseif self.deadline and sys.monotime() + delay >= self.deadline then
      why = ("gave up at its deadline after %d conflicting attempts"):format(self.attempt)
    end
    if why then
      res.message = ("%s (%s)"):format(res.message, why)
      return self:_end("failed", { err = res, gave_up = true })
    end
    self.attempt, self.obj, self.delay, self.state = self.attempt + 1, fresh, delay, "again"
    if self.on_conflict then self.on_conflict(self, res, delay) end
    return nil
  end
  if errors.is_error(res) and res.absent == "object" then
    return self:_end("absent", { err = res })
  end
  return self:_end("failed", { err = res })
end

-- Prepares and submits the change's next request on batch m (or ends it:
-- nothing to change, a write a client dry run kept back, a refusal of the
-- gate). Returns the batch id when a request is in flight.
local function start(client, m, ch)
  local ok, res = pcall(function()
    local method, path, spec = ch:request()
    if method == nil then return nil end
    local req, kept_back = client:prepare(method, path, spec)
    if req == nil then
      ch:settle(true, kept_back)
      return nil
    end
    ch.req = req
    return m:submit(req.method, req.path, req.options)
  end)
  if ok then return res end
  ch:settle(false, res)
  return nil
end

-- Drives changes to their end. pull() returns the next Change (nil: no
-- more); it is called only as the batch has room, so not all need be held
-- at once. ended(ch) is called once for each change that ended (its state
-- "done", "absent" or "failed"); what it raises is the batch's failure.
-- The first failure (or error of pull) stops new changes; those begun go on
-- to their end; then it is raised. Returns nothing.
function update.run(client, pull, concurrency, ended)
  local m <close> = client._t:multi { concurrency = concurrency }
  -- the serial path holds one change at a time: after a failure, none other was begun
  local window = concurrency == 1 and 1 or concurrency * 2
  local inflight, pending, waiting, drained, first_err = {}, 0, {}, false, nil
  local function fail(e) first_err = first_err or e end
  local function advance(ch)
    while true do
      if ch.state == "again" then
        ch.ready_at = sys.monotime() + ch.delay
        waiting[#waiting + 1] = ch
        return
      elseif ch.state ~= "ready" then
        local ok, err = pcall(ended, ch)
        if not ok then fail(err) end
        return
      end
      local id = start(client, m, ch)
      if id ~= nil then
        inflight[id], pending = ch, pending + 1
        return
      end
    end
  end
  local function resume_due(now)
    local i = 1
    while i <= #waiting do
      local ch = waiting[i]
      if ch.ready_at <= now then
        table.remove(waiting, i)
        ch.state = "ready"
        advance(ch)
      else
        i = i + 1
      end
    end
  end
  while true do
    while first_err == nil and not drained and pending + #waiting < window do
      local ok, ch = pcall(pull)
      if not ok then fail(ch) elseif ch == nil then drained = true else advance(ch) end
    end
    if pending == 0 and #waiting == 0 then break end
    if pending == 0 then
      local soonest = math.huge
      for _, ch in ipairs(waiting) do soonest = math.min(soonest, ch.ready_at) end
      local d = soonest - sys.monotime()
      if d > 0 then sys.sleep(d) end
    else
      local id, status, body, attempts, warnings, decode_error = m:wait()
      if id == nil then break end
      local ch = inflight[id]
      inflight[id], pending = nil, pending - 1
      ch.settle(ch,
        pcall(client.finish, client, ch.req, status, body, attempts, warnings, decode_error))
      advance(ch)
    end
    resume_due(sys.monotime())
  end
  if first_err ~= nil then error(first_err, 0) end
end

-- One change driven to its end (the serial path); returns it.
function update.one(ch)
  local pulled = false
  update.run(ch.resource.client, function()
    if pulled then return nil end
    pulled = true
    return ch
  end, 1, function() end)
  return ch
end

-- The compute of an edit-a-copy change: edit(copy) changes a copy of the
-- object in place; the ops are the difference, the info what edit returned.
function update.editing(edit)
  return function(current)
    local copy = patch.deepcopy(current)
    local info = edit(copy)
    return patch.diff(current, copy), info
  end
end

return update
