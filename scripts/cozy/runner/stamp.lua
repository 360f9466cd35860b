-- The version stamp: ConfigMap `cozystack-version` in the engine's namespace.
--   data.version   the version the cluster is at, a decimal string
--   data.history   a JSON array of records, newest last, at most
--                  stamp.HISTORY_LIMIT entries (older ones are dropped): the
--                  completed steps, those that ran but left the version
--                  (result "unstamped": stamp.unstamped), and the failed
--                  attempts (result "failed"; consecutive ones of one step
--                  kept as one, with attempts)
--   label platform.cozystack.io/no-delete: "true", after every write
-- A step's stamp and its history record are one JSON patch, guarded by the
-- ConfigMap's resourceVersion (kube's update() prepends the test), so a
-- step is either stamped with its record or not at all.
local errors = require "cozy.errors"
local json = require "cozy.json"
local log = require "cozy.log"
local sys = require "cozy.sys"
local text = require "cozy.text"

-- marks a table as a JSON array (cozy.json); the identity before it exists
local as_array = json.array or function(t) return t end

local stamp = {}

stamp.CONFIGMAP = "cozystack-version"
stamp.LABEL = "platform.cozystack.io/no-delete"
stamp.HISTORY_LIMIT = 100
-- The largest history record: HISTORY_LIMIT of them stay far below the
-- 1 MiB a ConfigMap may hold.
stamp.RECORD_BYTES = 4096
-- The longest error message a failure record keeps: the cause's first line
-- is what an operator needs, and an API error's attempts list can be long.
stamp.ERROR_BYTES = 1024

local function pointer_escape(s)
  return (s:gsub("~", "~0"):gsub("/", "~1"))
end

-- The version in a ConfigMap, as an integer; raises for a malformed one.
function stamp.version_of(cm)
  local v = cm.data and cm.data.version
  local n = type(v) == "string" and math.tointeger(tonumber(v:match("^%s*(%d+)%s*$")))
  if not n then
    errors.raise("failed", ("ConfigMap %s/%s has no valid data.version (%s): refusing to guess")
      :format(cm.metadata and cm.metadata.namespace or "?", stamp.CONFIGMAP,
        v == nil and "absent" or ("%q"):format(tostring(v))))
  end
  return n
end

-- The history records, oldest first. A history that is not a JSON array of
-- records is never replaced or appended to: it raises (kind "failed"),
-- naming the ConfigMap key and what was found; docs/operations.md
-- ("History") says how to repair it. With `lenient`, returns {} and that
-- message instead (status shows it).
function stamp.history_of(cm, lenient)
  local raw = cm and cm.data and cm.data.history
  if raw == nil or raw == "" then return {} end
  local ok, list = pcall(json.decode, raw)
  local found
  if not ok then
    found = "not JSON (" .. errors.text(list) .. ")"
  elseif type(list) ~= "table" or getmetatable(list) ~= json.array_mt then
    found = "a JSON " .. (type(list) == "table" and "object" or type(list) == "string" and "string"
      or type(list) == "boolean" and "boolean" or list == json.null and "null" or "number")
  else
    for i, rec in ipairs(list) do
      if type(rec) ~= "table" or getmetatable(rec) == json.array_mt then
        found = ("an array whose entry %d is not a record (a JSON %s)"):format(i,
          type(rec) == "table" and "array" or rec == json.null and "null" or type(rec))
        break
      end
    end
  end
  if found == nil then return list end
  local namespace = cm.metadata and cm.metadata.namespace or "?"
  local message = ("ConfigMap %s/%s: data.history must be a JSON array of step records, found %s;"
    .. " refusing to replace it (see docs/operations.md, \"History\")")
      :format(namespace, stamp.CONFIGMAP, found)
  if lenient then return {}, message end
  errors.raise("failed", message)
end

local function encode_history(list)
  local copy = {}
  local first = math.max(1, #list - stamp.HISTORY_LIMIT + 1)
  for i = first, #list do copy[#copy + 1] = list[i] end
  return json.encode(as_array(copy))
end

-- JSON patch ops that set the label and, as given, data.version and a
-- history record appended to data.history.
function stamp.ops(cm, changes)
  local ops = {}
  local labels = cm.metadata and cm.metadata.labels
  if type(labels) ~= "table" then
    ops[#ops + 1] = { op = "add", path = "/metadata/labels", value = { [stamp.LABEL] = "true" } }
  elseif labels[stamp.LABEL] ~= "true" then
    ops[#ops + 1] = { op = "add", path = "/metadata/labels/" .. pointer_escape(stamp.LABEL),
      value = "true" }
  end
  local data = {}
  if changes.version ~= nil then data.version = tostring(changes.version) end
  if changes.record ~= nil then
    local history = stamp.history_of(cm)
    local rec, last = changes.record, history[#history]
    -- a step failing again (a Job's retries, an operator rerunning) keeps one
    -- record with its count, so failures never push completed steps out
    if rec.result == "failed" and type(last) == "table" and last.result == "failed"
      and last.number == rec.number then
      rec.attempts = (math.tointeger(last.attempts) or 1) + 1
      history[#history] = rec
    else
      history[#history + 1] = rec
    end
    data.history = encode_history(history)
  end
  if type(cm.data) ~= "table" then
    if next(data) ~= nil then ops[#ops + 1] = { op = "add", path = "/data", value = data } end
  else
    for _, k in ipairs({ "version", "history" }) do
      if data[k] ~= nil then
        ops[#ops + 1] = { op = "add", path = "/data/" .. k, value = data[k] }
      end
    end
  end
  return ops
end

-- The history record of step m (from -> to), started at wall-clock time
-- `started`, by runner `identity`.
function stamp.history_record(m, from, to, started, identity, outcome)
  local rec = {
    number = m.number, name = m.name, kind = m.kind, sha256 = m.sha256,
    from = from, to = to,
    started = log.iso8601(started), finished = log.iso8601(sys.time()),
    engine = sys.version, runner = identity,
  }
  -- what the step reported (ctx.outcome) and warned about, already bounded
  -- and checked; should it still not encode, or encode past the record's
  -- bound, it is left out and says so: nothing a step reports stops its stamp
  if outcome and (next(outcome.counts) ~= nil or #outcome.warnings > 0) then
    rec.outcome = { counts = json.object(outcome.counts), warnings = json.array(outcome.warnings),
      warnings_dropped = outcome.warnings_dropped > 0 and outcome.warnings_dropped or nil }
  end
  -- the migration's finally, when it has one (cozy.runner.finally): what the
  -- step ended by, how finally ended, its writes (a few bounded fields)
  if outcome and outcome.finally then rec.finally = outcome.finally end
  return stamp.bounded(rec)
end

-- rec, with its outcome replaced by a note when it does not encode or makes
-- the record larger than stamp.RECORD_BYTES.
function stamp.bounded(rec)
  if rec.outcome == nil then return rec end
  local ok, encoded = pcall(json.encode, rec)
  if not ok or #encoded > stamp.RECORD_BYTES then
    rec.outcome = { dropped = ok and ("the outcome made the record %d bytes, over %d")
      :format(#encoded, stamp.RECORD_BYTES) or "the outcome could not be encoded" }
  end
  return rec
end

-- Marks record `rec` as a step that did not stamp: it ran to its end, but
-- the version stays at `version` (where it was before the step) for the
-- reason given. The record goes into the history without moving the version.
function stamp.unstamped(rec, version, reason)
  rec.result, rec.version, rec.reason = "unstamped", version, reason
  return rec
end

-- The record of a failed attempt at step m (from -> from+1): the step's
-- record as history_record makes it (what it reported so far included),
-- with result "failed", attempts 1 (stamp.ops counts the consecutive ones)
-- and the error: { kind, message } (message bounded by stamp.ERROR_BYTES).
function stamp.failure_record(m, from, started, identity, outcome, err)
  local rec = stamp.history_record(m, from, from + 1, started, identity, outcome)
  local message = text.safe_prefix(errors.text(err), stamp.ERROR_BYTES, "...")
  rec.result, rec.attempts = "failed", 1
  rec.error = { kind = errors.kind(err) or "bug", message = message }
  return stamp.bounded(rec)
end

-- Whether history record rec is a failed attempt.
function stamp.is_failure(rec)
  return type(rec) == "table" and rec.result == "failed"
end

-- The ConfigMap, or nil when it is absent (a fresh install).
function stamp.read(cms, namespace)
  return cms:find(namespace, stamp.CONFIGMAP)
end

-- Creates the ConfigMap at `version` (fresh install: nothing runs). If
-- another runner created it first, returns theirs (second result false).
function stamp.bootstrap(cms, namespace, version)
  local ok, created = pcall(cms.create, cms, {
    apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = stamp.CONFIGMAP, namespace = namespace,
      labels = { [stamp.LABEL] = "true" } },
    data = { version = tostring(version), history = "[]" },
  })
  if ok then return created, true end
  if type(created) == "table" and created.code == 409 then
    return cms:get(namespace, stamp.CONFIGMAP), false
  end
  error(created, 0)
end

-- Stamps `to` after the step `from` -> `to` with its history record, in one
-- write guarded by resourceVersion. A conflict re-reads; if the version is
-- then no longer `from`, someone else moved it: fail closed.
-- A ConfigMap deleted while a run holds the lock: the version it held is
-- gone and a rerun must not take the cluster for a fresh install (see
-- steps.decide), so the run stops here naming what to restore.
local function updated(cms, cm, at, edit)
  local ok, obj = pcall(cms.update, cms, cm, edit)
  if ok then return obj end
  if errors.is(obj, "api") and obj.code == 404 then
    errors.raise("failed",
      ("the version ConfigMap %s/%s was deleted during the run (it was at version %d): "
      .. "recreate it at the version the cluster is really at before running again")
      :format(cm.metadata.namespace or "?", stamp.CONFIGMAP, at), { cause = obj })
  end
  error(obj, 0)
end

-- Moves the version from `from` to `to` with `record` (a step's, or the
-- manual one of `cozy-migrate stamp`), provided it is still `from`: a
-- version moved meanwhile fails closed.
function stamp.advance(cms, cm, from, to, record)
  return updated(cms, cm, from, function(current)
    local v = stamp.version_of(current)
    if v ~= from then
      errors.raise("failed", ("version moved to %d while this runner stamped %d -> %d")
        :format(v, from, to))
    end
    return stamp.ops(current, { version = to, record = record })
  end)
end

-- Adds a history record and the label without moving the version, provided
-- it is still `to`: after a legacy script stamped `to` by itself, or after a
-- step that left the version at `to` (stamp.unstamped).
function stamp.record(cms, cm, to, record)
  return updated(cms, cm, to, function(current)
    local v = stamp.version_of(current)
    if v ~= to then
      errors.raise("failed", ("version moved to %d while this runner recorded step -> %d")
        :format(v, to))
    end
    return stamp.ops(current, { record = record })
  end)
end

-- The record of `cozy-migrate stamp`: kind "manual", the version moved
-- from (nil: there was no ConfigMap) to `to`, who (the kube user a
-- SelfSubjectReview named, and the runner: POD_NAME or host-pid), why,
-- and whether --force moved it down. `reason` bounded by ERROR_BYTES.
function stamp.manual_record(from, to, started, identity, user, reason, forced)
  reason = text.safe_prefix(reason, stamp.ERROR_BYTES, "...")
  return { kind = "manual", from = from, to = to, started = log.iso8601(started),
    finished = log.iso8601(sys.time()), engine = sys.version, runner = identity, user = user,
    reason = reason, forced = forced or nil }
end

-- Creates the ConfigMap at `version` with `record` as its first history
-- record (a baseline). Another runner's ConfigMap, created meanwhile, is a
-- conflict: raises (kind "failed") rather than write over it.
function stamp.create(cms, namespace, version, record)
  local ok, created = pcall(cms.create, cms, {
    apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = stamp.CONFIGMAP, namespace = namespace,
      labels = { [stamp.LABEL] = "true" } },
    data = { version = tostring(version), history = json.encode(as_array({ record })) },
  })
  if ok then return created end
  if type(created) == "table" and created.code == 409 then
    errors.raise("failed",
      ("ConfigMap %s/%s was created meanwhile: run stamp again to see its version")
      :format(namespace, stamp.CONFIGMAP), { cause = created })
  end
  error(created, 0)
end

-- Appends the failure record of a step, provided the version is still
-- `at` (the step's own, or where an earlier unstamped step left it): a
-- runner that moved it meanwhile owns the story.
function stamp.record_failure(cms, cm, at, record)
  return updated(cms, cm, at, function(current)
    local v = stamp.version_of(current)
    if v ~= at then
      errors.raise("failed", ("version moved to %d: the failed attempt at %s -> %s is not recorded")
        :format(v, tostring(record.from), tostring(record.to)))
    end
    return stamp.ops(current, { record = record })
  end)
end

return stamp
