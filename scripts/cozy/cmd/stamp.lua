-- `cozy-migrate stamp N --reason TEXT [--force] [--dry-run]`: sets the
-- version to N by hand, with a trace. For a baseline (a cluster whose
-- ConfigMap is missing, or that was brought to a version another way) and
-- after a manual repair (a failed step fixed by hand: stamp N+1). Flyway's
-- baseline/repair, golang-migrate's force.
--
--   who      the kube user, from a SelfSubjectReview (authentication.k8s.io/v1),
--            asked first: nobody stamps anonymously
--   lock     taken as a run takes it (a run cannot be under way meanwhile),
--            with the same LockWaiting and LockTakenOver Events
--   down     N below the current version is refused without --force
--   record   one history record of kind "manual" (stamp.manual_record), in
--            the same guarded write as the version
--   dry run  what it would do, nothing written, no lock (plan takes no N)
local errors = require "cozy.errors"
local lease = require "cozy.runner.lease"
local runner = require "cozy.runner"
local stamp = require "cozy.runner.stamp"
local sys = require "cozy.sys"
local gate = require "cozy.kube.gate"
local cozy_text = require "cozy.text"

local M = {}

-- The kube user the server sees us as: SelfSubjectReview's userInfo.username.
function M.who(client)
  local reviews = client:resource("authentication.k8s.io/v1", "selfsubjectreviews",
    { namespaced = false })
  local ok, res = pcall(reviews.create, reviews,
    { apiVersion = "authentication.k8s.io/v1", kind = "SelfSubjectReview", metadata = {} })
  local user = ok and type(res) == "table" and type(res.status) == "table"
    and type(res.status.userInfo) == "table"
    and res.status.userInfo.username
  if type(user) ~= "string" or user == "" then
    errors.raise("failed", ("stamp records who stamped, and the server did not say who we are "
      .. "(SelfSubjectReview authentication.k8s.io/v1: %s): nothing was stamped")
      :format(ok and "no status.userInfo.username" or errors.text(res)),
      { cause = not ok and res or nil })
  end
  return user
end

-- What stamping `to` over ConfigMap cm (nil: absent) means: the action
-- ("baseline", "set", "record"), the version it moves from, and whether it
-- goes down. Raises when it goes down without --force.
function M.decide(cm, to, force)
  if cm == nil then return { action = "baseline", to = to } end
  local from = stamp.version_of(cm)
  stamp.history_of(cm) -- a history that cannot be appended to fails here, before the lock
  if to < from and not force then
    errors.raise("failed",
      ("refusing to move the version down from %d to %d: a version never goes down by "
      .. "itself (docs/operations.md, \"Rollback\"); --force does it, recorded"):format(from, to))
  end
  return { action = to == from and "record" or "set", from = from, to = to, down = to < from }
end

local function describe(d, namespace)
  local where = ("%s/%s"):format(namespace, stamp.CONFIGMAP)
  if d.action == "baseline" then
    return ("create %s at version %d (baseline)"):format(where, d.to)
  end
  if d.action == "record" then
    return ("keep %s at version %d, adding the manual record"):format(where, d.to)
  end
  return ("move %s from version %d to %d%s")
    :format(where, d.from, d.to, d.down and " (down, --force)" or "")
end

local function stamp_under_lock(client, opts, namespace, to, reason, user, log)
  local identity = lease.identity()
  local lock = {}
  client.gate = gate.new { lock = lock }
  -- the lock's Events as a run records them: waiting for a live holder, taking over an expired one
  local events <close> = runner.recorder(opts, log, namespace, identity, false)
  lock.holder = runner.take_lock(client, opts, namespace, identity, log,
    function(why, note) events:emit(why, "Lock", note) end)
  local cms = client:resource("v1", "configmaps", { kind = "ConfigMap" })
  local started = sys.time()
  local ok, res = pcall(function()
    local cm = stamp.read(cms, namespace)
    local d = M.decide(cm, to, opts.force)
    local rec = stamp.manual_record(d.from, to, started, identity, user, reason, d.down)
    if d.action == "baseline" then
      stamp.create(cms, namespace, to, rec)
    else
      stamp.advance(cms, cm, d.from, to, rec)
    end
    return d
  end)
  local holder = lock.holder
  lock.holder = nil
  runner.release_lock(holder, client, opts, namespace, identity, log)
  if not ok then error(res, 0) end
  return res
end

function M.run(opts, args)
  return runner.protect(opts, function(log)
    local to = args[1] and args[1]:match("^%d+$") and math.tointeger(tonumber(args[1]))
    if not to then
      errors.raise("usage", args[1] and ("stamp expects a version, a non-negative integer, got %q")
        :format(args[1])
        or "stamp needs the version: cozy-migrate stamp N --reason TEXT")
    end
    local reason = opts.reason
    if type(reason) ~= "string" or not reason:find("%S") then
      errors.raise("usage",
        "stamp needs --reason TEXT: why the version is set by hand (kept in the history)")
    end
    local namespace = runner.namespace(opts)
    local client = runner.connect(opts, log)
    local user = M.who(client)
    if opts.dry_run then
      local d = M.decide(stamp.read(client:resource("v1", "configmaps", { kind = "ConfigMap" }),
        namespace), to, opts.force)
      local rec = stamp.manual_record(d.from, to, sys.time(), lease.identity(), user, reason,
        d.down)
      io.stdout:write(cozy_text.lines({ ("stamp (dry run, nothing written): would %s")
        :format(describe(d, namespace)), "  record: " .. cozy_text.json(rec) }))
      return 0
    end
    local d = stamp_under_lock(client, opts, namespace, to, reason, user, log)
    log:info("stamped by hand",
      { version = to, from = d.from, user = user, reason = reason, forced = d.down or nil })
    io.stdout:write(cozy_text.lines({ ("stamped: %s; recorded as manual, by %s")
      :format(describe(d, namespace), user) }))
    return 0
  end)
end

return M
