-- The lock: coordination.k8s.io/v1 Lease `cozystack-migrations` in the
-- engine's namespace, held while a run lasts.
--
-- Taking it: an absent Lease is created; a Lease with no holder, our own
-- identity, or an expired one is taken with a JSON patch guarded by its
-- resourceVersion (two runners racing: one wins, the other sees a conflict
-- and looks again: the takeover is the update engine's, cozy.kube.update,
-- with the lock timeout as its deadline). A live Lease of another holder: wait up to the lock
-- timeout, then exit 3. Expired means we watched the Lease not change for a
-- whole leaseDurationSeconds of our own monotonic clock, as client-go's
-- leader election judges it: another holder's renewTime comes from its
-- clock, which may run behind ours by any amount (a holder renewing every
-- second with its clock a minute behind is alive), so its timestamps decide
-- nothing; any write to the record (a renewal, a new holder) changes its
-- resourceVersion and restarts the count. A runner that finds a dead
-- holder's Lease therefore waits one duration before it takes it over.
-- Every timing decision of our own lease counts from the earliest time
-- the server could have stamped: the monotonic time taken before the request
-- that took or renewed the Lease was sent, never its answer. A conflict
-- backs off within the lock timeout; any other refusal fails at once.
--
-- Keeping it: a worker thread (cozy.worker, its own Lua state and kube
-- client) renews it every duration/3 with a JSON patch that tests the
-- holder. The main state checks, before every write, that the renewal is
-- recent and nothing was lost (lease.Holder:check).
local errors = require "cozy.errors"
local json = require "cozy.json"
local kerrors = require "cozy.kube.errors"
local proc = require "cozy.proc"
local sys = require "cozy.sys"
local transport = require "cozy.transport"
local update = require "cozy.kube.update"
local validate = require "cozy.validate"

local lease = {}

lease.NAME = "cozystack-migrations"
lease.DEFAULT_DURATION = 30
-- The lease duration; COZY_MIGRATE_LEASE_SECONDS shortens it (tests, and
-- clusters that want a quicker takeover after a killed runner).
function lease.duration()
  local v = math.tointeger(tonumber(os.getenv("COZY_MIGRATE_LEASE_SECONDS") or ""))
  if v and v >= 1 then return v end
  return lease.DEFAULT_DURATION
end

-- Our identity: $POD_NAME in the Job, else host and pid.
function lease.identity()
  local pod = os.getenv("POD_NAME")
  if pod and pod ~= "" then return pod end
  return (sys.hostname() or "unknown-host") .. "-" .. sys.getpid()
end

-- metav1.MicroTime
function lease.microtime(t)
  local whole = math.floor(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", whole) .. (".%06dZ"):format(math.floor((t - whole) * 1e6))
end

-- days since 1970-01-01 of a civil date (Howard Hinnant's algorithm), so
-- parsing does not depend on the local time zone as os.time would
local function days_from_civil(y, m, d)
  y = m <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (m + (m > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  return era * 146097 + doe - 719468
end

-- RFC 3339 (UTC "Z" or an offset) to epoch seconds, or nil.
function lease.parse_time(s)
  if type(s) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, frac, zone =
    s:match("^(%d+)%-(%d+)%-(%d+)T(%d+):(%d+):(%d+)(%.?%d*)(.*)$")
  if not y then return nil end
  local t = days_from_civil(tonumber(y), tonumber(mo), tonumber(d)) * 86400
    + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec)
  if frac ~= "" and frac ~= "." then t = t + tonumber("0" .. frac) end
  local sign, oh, om = zone:match("^([+-])(%d%d):?(%d%d)$")
  if sign then
    local off = tonumber(oh) * 3600 + tonumber(om) * 60
    t = sign == "+" and t - off or t + off
  elseif zone ~= "Z" and zone ~= "z" and zone ~= "" then
    return nil
  end
  return t
end

local function holder_of(obj)
  local h = obj and obj.spec and obj.spec.holderIdentity
  if h == nil or h == json.null or h == "" then return nil end
  return h
end
lease.holder_of = holder_of

-- Seconds the lease is still valid for by its own times (negative: expired),
-- as `status` shows it: the holder's clock, never a takeover's reason.
function lease.remaining(obj, now)
  local spec = obj.spec or {}
  local renewed = lease.parse_time(spec.renewTime) or lease.parse_time(spec.acquireTime)
  local duration = tonumber(spec.leaseDurationSeconds) or lease.DEFAULT_DURATION
  if not renewed then return -1 end
  return renewed + duration - now
end

local function leases_of(client)
  return client:resource("coordination.k8s.io/v1", "leases", { kind = "Lease" })
end

local function new_spec(identity, duration, transitions, now)
  local t = lease.microtime(now)
  return {
    holderIdentity = identity, leaseDurationSeconds = duration,
    acquireTime = t, renewTime = t, leaseTransitions = transitions,
  }
end

-- Shares of the lease, counted from before a request was sent:
-- a take of the lock counts only if answered within the first third (when
-- the first renewal is due); the holder stops writing once two thirds passed
-- without a renewal (Holder:check), so a renewal answered later than that
-- does not count either.
local TAKE_ANSWER_LIMIT = 1 / 3
local UNRENEWED_LIMIT = 2 / 3

-- A refusal no retry changes: a 422 on the create (nothing of ours to test:
-- the server refused the Lease itself, as a ValidatingAdmissionPolicy
-- does), a 422 that names refused fields, a 422 without causes while the
-- Lease did not move, a 403...: raised at once (exit 1), since looping on it
-- would only flood the server.
local function refused(res, opts)
  if kerrors.is_error(res) then
    res.message = ("cannot take the lock %s/%s (not a conflict, so not retried): %s")
      :format(opts.namespace, lease.NAME, tostring(res.message))
  end
  error(res, 0)
end

local function backing_off(opts, res, wait)
  opts.log:info("lock write refused, backing off",
    { lease = lease.NAME, code = res.code, reason = res.reason,
      retry_in_s = ("%.2f"):format(wait) })
end

-- One attempt at taking the Lease, and what came of it. `take` holds what
-- acquire keeps between attempts (observed resourceVersion, why the last
-- take failed, whether the server may still name us holder, the expired
-- holder taken over). Returns "ours", the Lease and the time it counts from;
-- "held", the Lease as read; or "again" (a failed take to try again).
local function attempt(leases, opts, take, deadline, wait)
  local obj = leases:find(opts.namespace, lease.NAME)
  if obj == nil then
    -- absent: created. A 409 is another runner's create that got in first
    if take.failed and sys.monotime() >= deadline then take.give_up() end
    local sent = sys.monotime()
    local ok, res = pcall(leases.create, leases, {
      apiVersion = "coordination.k8s.io/v1", kind = "Lease",
      metadata = { name = lease.NAME, namespace = opts.namespace },
      spec = new_spec(opts.identity, opts.duration, 0, sys.time()),
    })
    if ok then return "ours", res, sent end
    if not (kerrors.is_error(res) and res.code == 409) then refused(res, opts) end
    local d = wait()
    backing_off(opts, res, d)
    sys.sleep(d)
    take.failed = "the server kept refusing it: " .. tostring(res)
    return "again"
  end
  -- present: taken over by the update engine, its test of the
  -- resourceVersion guarding against another runner's take (a conflict:
  -- re-read, decided again, within the lock timeout)
  local ch = update.one(update.new { resource = leases, ns = opts.namespace, name = lease.NAME,
    obj = obj,
    compute = function(current) return take.decide(current) end,
    attempts = math.huge, deadline = deadline,
    on_conflict = function(_, res, d) backing_off(opts, res, d) end })
  if ch.state == "done" and ch.changed then return "ours", ch.result, ch.info.sent end
  if ch.state == "done" then return "held", ch.info.obj end
  if ch.state == "absent" then return "again" end
  if errors.is(ch.err, "interrupted", "locked") then error(ch.err, 0) end
  if proc.signalled() then errors.raise("interrupted", "interrupted while waiting for the lock") end
  if ch.gave_up then
    take.failed = "the server kept refusing it: " .. tostring(ch.err)
    take.give_up()
  end
  refused(ch.err, opts)
end

-- What acquire keeps between attempts at the Lease, and its decisions:
-- take.decide(obj), the JSON patch ops that take the Lease as read (each
-- re-read too), none when another runner holds it; take.give_up() raises
-- "locked" with why the last take failed (take.failed).
local function taking(opts, deadline, timeout)
  local take = {}
  -- the record as we last saw it (its resourceVersion: any write changes
  -- it) and when, by our monotonic clock, we first saw it so
  local observed_rv, observed_at
  function take.unchanged(obj)
    local rv = obj.metadata.resourceVersion
    if rv ~= observed_rv or observed_at == nil then
      observed_rv, observed_at = rv, sys.monotime()
    end
    return sys.monotime() - observed_at
  end
  -- the duration the holder declared (ours when it declared none)
  function take.duration(obj)
    local d = tonumber(obj.spec and obj.spec.leaseDurationSeconds)
    return d and d > 0 and d or opts.duration
  end
  -- seconds until the record, unchanged, counts as expired
  function take.expires_in(obj)
    return take.duration(obj) - take.unchanged(obj)
  end
  function take.give_up()
    errors.raise("locked", ("could not take the lock %s/%s within %ss: %s")
      :format(opts.namespace, lease.NAME, tostring(timeout), take.failed))
  end
  function take.decide(obj)
    if proc.signalled() then
      errors.raise("interrupted", "interrupted while waiting for the lock")
    end
    local holder = holder_of(obj)
    local unchanged = take.unchanged(obj)
    if not (holder == nil or holder == opts.identity or unchanged >= take.duration(obj)) then
      return nil, { obj = obj }
    end
    if take.failed and sys.monotime() >= deadline then take.give_up() end
    local transitions = math.tointeger(obj.spec and obj.spec.leaseTransitions) or 0
    if holder ~= opts.identity then transitions = transitions + 1 end
    if holder ~= nil and holder ~= opts.identity then
      -- the expired holder we take it from (logged once it is ours, even
      -- when a take answered too late made us its holder meanwhile)
      take.previous = { holder = holder, renewed = obj.spec.renewTime, unchanged_for = unchanged,
        duration = take.duration(obj) }
    end
    -- the server stamps renewTime = `now`, so another runner counts our
    -- lease from then, however long the answer takes (or the transport's
    -- retries of it, which resend the same body): so do we
    local sent = sys.monotime()
    return { { op = "add", path = "/spec",
      value = new_spec(opts.identity, opts.duration, transitions, sys.time()) } }, { sent = sent }
  end
  return take
end

-- The run's Event (runner/events.lua) of a wait or a takeover, when the
-- caller gave opts.event(reason, note): best effort, it never raises.
local function event(opts, reason, note)
  if opts.event then opts.event(reason, note) end
end

-- Takes the lock or raises errors kind "locked" (exit 3) after `timeout`
-- seconds; kind "interrupted" if a signal arrives while waiting; an API
-- error (exit 1) when the server refuses the Lease for a reason no retry
-- changes. opts: namespace, identity, duration, timeout, log, event. Returns the
-- Lease and the monotonic time its validity counts from (before the request
-- that took it was sent).
function lease.acquire(client, opts)
  local leases = leases_of(client)
  local log = opts.log
  local timeout = opts.timeout or 300
  local deadline = sys.monotime() + timeout
  -- one backoff for the whole wait: the update engine's (client.update_policy)
  local wait = update.backoff(client.update_policy, deadline)
  local take = taking(opts, deadline, timeout)
  local waiting_logged = false
  while true do
    if proc.signalled() then
      errors.raise("interrupted", "interrupted while waiting for the lock")
    end
    local ok, what, obj, sent = pcall(attempt, leases, opts, take, deadline, wait)
    if not ok then
      -- an answer that came too late may still have made us the holder
      if errors.is(what, "locked") and take.maybe_ours then lease.release(client, opts) end
      error(what, 0)
    end
    if what == "ours" then
      local age = sys.monotime() - sent
      if age <= opts.duration * TAKE_ANSWER_LIMIT then
        if take.previous then
          log:warn("lock taken over from an expired holder",
            { lease = lease.NAME, previous = take.previous.holder, renewed = take.previous.renewed,
              unchanged_for_s = ("%.1f"):format(take.previous.unchanged_for) })
          event(opts, "LockTakenOver",
            ("lock %s/%s taken over by %s from %s, whose lease did not change for %.1fs "
            .. "(its duration %ss; renewed %s by its own clock)")
            :format(opts.namespace, lease.NAME, opts.identity, take.previous.holder,
              take.previous.unchanged_for, tostring(take.previous.duration),
              tostring(take.previous.renewed)))
        else
          log:info("lock acquired", { lease = lease.NAME, holder = opts.identity })
        end
        return obj, sent
      end
      -- another runner counts this lease from `sent`: by now it may have
      -- found it expired and taken it, so it is not ours to write under
      take.failed = ("the server answered its last take after %.1fs, past a third of the %ds lease")
        :format(age, opts.duration)
      take.maybe_ours = true
      log:warn("lock answer came too late to count on: taking it again", { lease = lease.NAME,
        answered_after_s = ("%.1f"):format(age), lease_s = opts.duration })
    elseif what == "held" then
      local holder, remaining = holder_of(obj), take.expires_in(obj)
      local left = deadline - sys.monotime()
      if left <= 0 then
        errors.raise("locked", ("lock %s/%s is held by %s (renewed %s); gave up after %ss")
          :format(opts.namespace, lease.NAME, holder, tostring(obj.spec.renewTime),
            tostring(timeout)),
          { holder = holder })
      end
      if not waiting_logged then
        log:info("waiting for the lock", { lease = lease.NAME, holder = holder,
          timeout_s = timeout, expires_in_s = ("%.1f"):format(remaining) })
        event(opts, "LockWaiting",
          ("%s waits up to %ss for the lock %s/%s, held by %s (renewed %s, expires in %.1fs)")
          :format(opts.identity, tostring(timeout), opts.namespace, lease.NAME, tostring(holder),
            tostring(obj.spec.renewTime), remaining))
        waiting_logged = true
      end
      sys.sleep(math.min(1, left, math.max(0.05, remaining + 0.05)))
    end
  end
end

-- Gives the lock up (holder cleared), if it is still ours. Best effort:
-- an unreleased lease simply expires.
function lease.release(client, opts)
  local leases = leases_of(client)
  local ok, err = pcall(function()
    local now = lease.microtime(sys.time())
    leases:json_patch(opts.namespace, lease.NAME, {
      { op = "test", path = "/spec/holderIdentity", value = opts.identity },
      { op = "add", path = "/spec/holderIdentity", value = "" },
      { op = "add", path = "/spec/leaseDurationSeconds", value = 1 },
      { op = "add", path = "/spec/renewTime", value = now },
    })
  end)
  if ok then
    opts.log:info("lock released", { lease = lease.NAME })
  else
    opts.log:warn("could not release the lock (it will expire)",
      { lease = lease.NAME, error = tostring(err) })
  end
  return ok
end

-- Worker entry (runs in its own thread and Lua state): renews until asked
-- to stop; reports "lost" when the Lease is no longer ours or could not be
-- renewed within its duration.
function lease.renew_loop(payload, chan)
  local cfg = json.decode(payload)
  local kube = require "cozy.kube"
  local log = require("cozy.log").new{ format = cfg.log_format,
    verbosity = cfg.verbosity }:with{ thread = "lease" }
  local interval = cfg.duration / 3
  local connect = cfg.connect
  connect.log = log
  -- a renewal is worth retrying only within its interval: after that the
  -- next one is due, and the main state stops (and joins this thread) when
  -- renewals fall behind, so no request may outlive the interval by much;
  -- the "renewal" retry policy, its time and longest wait the interval's
  connect.request_timeout = math.max(1, math.min(connect.request_timeout or 30, interval))
  connect.retry = transport.retry_policy("renewal",
    { max_time = interval, max_delay = interval / 2 })
  local client = kube.connect(connect)
  local leases = leases_of(client)
  -- the lease counts from before the request that took it (lease.acquire),
  -- and each renewal from before it was sent, never from an answer: the
  -- server stamps the renewTime we send, and other runners count from that
  local last_ok, sent, rv = cfg.acquired_at, cfg.acquired_at, cfg.resource_version
  -- renew at once (not twice in a row): the Lease moved on, still ours
  local again = false
  chan:ok(last_ok)
  while not chan:wait(again and 0 or math.max(0, sent + interval - sys.monotime())) do
    sent = sys.monotime()
    -- guarded by the resourceVersion of our last known write: a renewal the
    -- server took up late (its attempt timed out here) can never land after
    -- a newer one and set renewTime back to its older value
    local ok, res = pcall(leases.json_patch, leases, cfg.namespace, lease.NAME, {
      { op = "test", path = "/spec/holderIdentity", value = cfg.identity },
      { op = "test", path = "/metadata/resourceVersion", value = rv },
      { op = "add", path = "/spec/renewTime", value = lease.microtime(sys.time()) },
    })
    local age = sys.monotime() - sent
    local lost, retried = nil, again
    again = false
    if ok then
      rv = res.metadata.resourceVersion
      if age > cfg.duration * UNRENEWED_LIMIT then
        -- fail closed: by the time it came, too little of the lease is left
        -- to write under, and another runner may already count it expired
        log:warn("lock renewal answered too late to count on", { lease = lease.NAME,
          answered_after_s = ("%.1f"):format(age), lease_s = cfg.duration })
      else
        last_ok = sent
        chan:ok(sent)
        log:debug("lock renewed", { lease = lease.NAME })
      end
    elseif type(res) == "table" and (res.code == 422 or res.code == 409 or res.code == 404) then
      -- a test failed: another holder, or the Lease moved on (a late
      -- renewal of ours landed, or someone touched it); the re-read tells
      local found, cur = pcall(leases.find, leases, cfg.namespace, lease.NAME)
      if found and (cur == nil or holder_of(cur) ~= cfg.identity) then
        lost = ("lock %s is no longer held by %s: %s")
          :format(lease.NAME, cfg.identity, tostring(res))
      elseif found and cur.metadata.resourceVersion == rv then
        lost = ("lock %s: its renewal was refused: %s"):format(lease.NAME, tostring(res))
      elseif found then
        rv, again = cur.metadata.resourceVersion, not retried
        log:debug("lock moved on, still ours: renewing again",
          { lease = lease.NAME, resourceVersion = rv })
      else
        res = cur
      end
    end
    if not ok and not lost and not again then
      log:warn("lock renewal failed, retrying", { lease = lease.NAME, error = tostring(res) })
      if sys.monotime() - last_ok > cfg.duration then
        lost = ("lock %s not renewed for %ds: %s"):format(lease.NAME, cfg.duration, tostring(res))
      end
    end
    if lost then
      chan:lost(lost)
      return
    end
  end
end

local Holder = {}
Holder.__index = Holder

-- Starts renewing in the background. connect: plain-data kube.connect
-- options; obj, acquired_at: what lease.acquire returned (the Lease, and the
-- monotonic time the lock counts from).
function lease.hold(opts, connect, obj, acquired_at)
  validate.arg(2, "lease.hold", "acquired_at (lease.acquire's second result)", acquired_at,
    "number")
  local worker = require "cozy.worker"
  local payload = json.encode({
    connect = { kubeconfig = connect.kubeconfig, context = connect.context,
      request_timeout = connect.request_timeout },
    namespace = opts.namespace, identity = opts.identity, duration = opts.duration,
    acquired_at = acquired_at, resource_version = obj.metadata.resourceVersion,
    log_format = opts.log.format, verbosity = opts.log.verbosity,
  })
  return setmetatable({ opts = opts, started = acquired_at,
    worker = worker.start("cozy.runner.lease", "renew_loop", payload) }, Holder)
end

-- Raises errors kind "lost" unless the lock is certainly still ours for a
-- while: called before every write.
function Holder:check()
  local lost = self.worker:lost()
  if lost then errors.raise("lost", "lock lost: " .. lost) end
  local last = self.worker:last_ok() or self.started
  local age = sys.monotime() - last
  -- leave a third of the duration as margin for the write itself
  if age > self.opts.duration * UNRENEWED_LIMIT then
    errors.raise("lost", ("lock lost: not renewed for %.1fs (duration %ds)")
      :format(age, self.opts.duration))
  end
end

-- Until when (cozy.sys monotonic time) the lock is certainly ours: no other
-- runner may take it over before the last successful renewal (or the
-- acquisition), counted from before it was sent, plus the lease duration;
-- one second of that is kept as margin.
function Holder:held_until()
  return (self.worker:last_ok() or self.started) + self.opts.duration - 1
end

-- When a child process working under the lock (a legacy script,
-- runner/legacy.lua) must be stopped, as two sys.monotime() values: SIGTERM
-- once the lock would be counted lost (Holder:check: two thirds of the
-- lease without a renewal), and dead (SIGKILL) by held_until, before any
-- other runner can take the Lease over: another runner counts our lease from
-- when it saw our last renewal, which is after we sent it (lease.acquire), so
-- a copy of the script it starts cannot overlap ours. A lost lock: now.
function Holder:child_bounds()
  if self.worker:lost() then
    local now = sys.monotime()
    return now, now
  end
  local last = self.worker:last_ok() or self.started
  return last + self.opts.duration * UNRENEWED_LIMIT, self:held_until()
end

-- The transport's before_attempt for a write under the lock: an attempt is
-- sent only when the lock is held until after the attempt's deadline; while
-- renewals may still come, wait for one; a lost lock raises "lost".
function Holder:before_attempt(info)
  self:check()
  if info.deadline < self:held_until() then return nil end
  return 0.1
end

-- The time bound of one write attempt under the lock: shorter than the
-- margin a renewal every duration/3 leaves, so that a healthy lock always
-- covers an attempt.
function Holder:attempt_timeout()
  return self.opts.duration / 2
end

function Holder:stop()
  if self.stopped then return end
  self.stopped = true
  local ok, err = self.worker:stop()
  if not ok then self.opts.log:warn("lock renewal thread failed", { error = err }) end
end

return lease
