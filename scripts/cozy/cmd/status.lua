-- `cozy-migrate status [--output text|json]`: the stamped version, the
-- target, the pending migrations, the lock holder, the last failed attempt
-- (until a later run of that step succeeds) and the history, with a
-- warning where a shipped file's sha256 differs from the recorded one.
-- Read-only.
local cozy_text = require "cozy.text"
local discovery = require "cozy.runner.discovery"
local json = require "cozy.json"
local lease = require "cozy.runner.lease"
local runner = require "cozy.runner"
local stamp = require "cozy.runner.stamp"
local sys = require "cozy.sys"

local as_array = json.array or function(t) return t end

local M = {}

-- The last failed attempt still standing once history record rec is read
-- (oldest first): rec itself when it failed; none when rec is a later
-- success (or a manual stamp) that covers the failed step's version.
function M.after(failure, rec)
  if stamp.is_failure(rec) then return rec end
  if failure ~= json.null and tonumber(rec.from) and tonumber(rec.to) and tonumber(failure.number)
      and rec.from <= failure.number and failure.number < rec.to then
    return json.null
  end
  return failure
end

-- Everything status shows, as plain data.
function M.collect(opts, log)
  local set = runner.discover(opts)
  local namespace = runner.namespace(opts)
  local target = runner.target(opts, set)
  local client = runner.connect(opts, log)
  local cm = stamp.read(client:resource("v1", "configmaps", { kind = "ConfigMap" }), namespace)
  local st = { namespace = namespace, target = target, origin = set.origin, pending = {},
    history = {}, warnings = {}, last_failure = json.null }
  if cm == nil then
    st.current = json.null
    st.state = "not installed (the first run stamps the target)"
  else
    st.current = stamp.version_of(cm)
    local history, why = stamp.history_of(cm, true)
    if why then st.warnings[#st.warnings + 1] = why end
    for _, rec in ipairs(history) do
      local entry = {}
      for k, v in pairs(rec) do entry[k] = v end
      local shipped = type(rec.number) == "number" and set.by_number[math.tointeger(rec.number)]
      if shipped and rec.sha256 and shipped.sha256 ~= rec.sha256 then
        entry.sha256_mismatch = shipped.sha256
        st.warnings[#st.warnings + 1] = ("migration %s: the shipped file's sha256 %s differs from "
          .. "the one that ran (%s)")
          :format(tostring(rec.name), shipped.sha256, tostring(rec.sha256))
      end
      st.history[#st.history + 1] = entry
      st.last_failure = M.after(st.last_failure, entry)
    end
    -- a version moved past it by other means (a legacy script, a stamp by hand) resolved it too
    if st.last_failure ~= json.null and tonumber(st.last_failure.number)
      and st.current > st.last_failure.number then
      st.last_failure = json.null
    end
    for _, e in ipairs(discovery.span(set, st.current, target)) do
      local m = e.migration
      if m then
        st.pending[#st.pending + 1] = { number = m.number, name = m.name, kind = m.kind,
          description = m.description }
      else
        -- one entry per run of missing versions, however wide
        st.pending[#st.pending + 1] = { number = e.gap,
          through = e.through ~= e.gap and e.through or nil, missing = true }
        st.warnings[#st.warnings + 1] = e.through == e.gap
          and ("no migration for version %d: run would refuse (gap)"):format(e.gap)
          or ("no migrations for versions %d to %d: run would refuse (gap)")
            :format(e.gap, e.through)
      end
    end
    if st.current > target then
      st.warnings[#st.warnings + 1] = ("version %d is ahead of the target %d")
        :format(st.current, target)
    end
    st.state = #st.pending == 0 and "up to date" or (math.max(0, target - st.current) .. " pending")
  end
  local l = client:resource("coordination.k8s.io/v1", "leases", { kind = "Lease" }):find(namespace,
    lease.NAME)
  if cm == nil and l ~= nil then
    st.state = "stamp missing (run refuses: a Lease shows that migrations have run here)"
    st.warnings[#st.warnings + 1] = ("the version ConfigMap %s/%s is missing but the "
      .. "Lease %s exists: "
      .. "recreate the ConfigMap at the cluster's real version; run will not bootstrap over it")
      :format(namespace, stamp.CONFIGMAP, lease.NAME)
  end
  if l and lease.holder_of(l) then
    local remaining = lease.remaining(l, sys.time())
    st.lock = { holder = lease.holder_of(l), renewed = l.spec.renewTime, expired = remaining < 0,
      expires_in_s = math.floor(remaining * 10 + 0.5) / 10 }
  else
    st.lock = json.null
  end
  st.pending = as_array(st.pending)
  st.history = as_array(st.history)
  st.warnings = as_array(st.warnings)
  return st
end

-- A record's outcome: its counts on one line, the warnings it kept.
local function outcome_lines(add, h)
  local o = type(h.outcome) == "table" and h.outcome or nil
  if o and type(o.counts) == "table" and next(o.counts) ~= nil then
    local parts = {}
    for k, v in pairs(o.counts) do
      parts[#parts + 1] = ("%s=%s"):format(tostring(k), tostring(v))
    end
    table.sort(parts)
    add("        outcome: %s", table.concat(parts, " "))
  end
  for _, w in ipairs(o and type(o.warnings) == "table" and o.warnings or {}) do
    add("        warning: %s", tostring(w))
  end
  if o and tonumber(o.warnings_dropped) then
    add("        (%d more warnings not kept)", tonumber(o.warnings_dropped))
  end
end

local function text(st)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add("namespace:  %s", st.namespace)
  add("version:    %s", st.current == json.null and "none" or tostring(st.current))
  add("target:     %d", st.target)
  add("state:      %s", st.state)
  if st.lock == json.null then
    add("lock:       free")
  else
    add("lock:       held by %s (renewed %s, %s)", st.lock.holder, tostring(st.lock.renewed),
      st.lock.expired and "expired" or ("expires in " .. st.lock.expires_in_s .. "s"))
  end
  local f = st.last_failure
  if f ~= json.null then
    local e = type(f.error) == "table" and f.error or {}
    add("last failure: %s (%s -> %s) at %s, by %s, attempt %s", tostring(f.name), tostring(f.from),
      tostring(f.to), tostring(f.finished), tostring(f.runner), tostring(f.attempts or 1))
    add("        error (%s): %s", tostring(e.kind), tostring(e.message))
    outcome_lines(add, f)
    add("        a rerun resumes at %s (cozy-migrate run; docs/operations.md, \"When "
      .. "a step fails\")", tostring(f.name))
  end
  if #st.pending > 0 then
    add("pending:")
    for _, p in ipairs(st.pending) do
      if p.missing and p.through then add("  %d-%d MISSING", p.number, p.through)
      elseif p.missing then add("  %-4d MISSING", p.number)
      else add("  %-4d %-32s %-6s %s", p.number, p.name, p.kind, p.description) end
    end
  end
  if #st.history > 0 then
    add("history:")
    for _, h in ipairs(st.history) do
      if h.kind == "manual" then
        add("  %s -> %s  manual stamp by %s (%s): %s  at %s%s",
          h.from == nil and "none" or tostring(h.from), tostring(h.to), tostring(h.user),
          tostring(h.runner), tostring(h.reason), tostring(h.finished),
          h.forced and "  (moved down, --force)" or "")
        goto next
      end
      add("  %s -> %s  %-32s %s .. %s  by %s (engine %s)%s%s", tostring(h.from), tostring(h.to),
        tostring(h.name), tostring(h.started), tostring(h.finished), tostring(h.runner),
        tostring(h.engine),
        stamp.is_failure(h) and ("  FAILED (attempts: %s)"):format(tostring(h.attempts or 1)) or "",
        h.sha256_mismatch and "  WARNING: sha256 differs from the shipped file" or "")
      if h.result == "unstamped" then
        add("        not stamped: the version stayed at %s (%s)", tostring(h.version),
          tostring(h.reason))
      end
      -- a legacy script of a run bound to a plan: its writes, each held to the plan's
      if h.writes ~= nil then add("        script writes: %s (run --plan)", tostring(h.writes)) end
      outcome_lines(add, h)
      ::next::
    end
  end
  for _, w in ipairs(st.warnings) do add("warning: %s", w) end
  return out
end

function M.run(opts)
  return runner.protect(opts, function(log)
    local st = M.collect(opts, log)
    if opts.output == "json" then
      io.stdout:write(cozy_text.json(st), "\n")
    else
      io.stdout:write(cozy_text.lines(text(st)))
    end
    return 0
  end)
end

return M
