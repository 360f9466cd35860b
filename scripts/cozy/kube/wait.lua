-- Waiting for an object (docs/engine-api.md, "Waiting for a condition"):
-- until it meets a condition, is deleted or is created, as `kubectl wait`
-- does it, over a list and a watch of that one object (field selector
-- metadata.name):
--
--   1. list: the object as it is (or its absence) and the list's
--      resourceVersion; met already: done;
--   2. watch from that resourceVersion, answered at its first event (the
--      transport's `first_line`: the transfer ends at the stream's first
--      line, so an event is seen when it comes, not when the stream
--      closes); each ADDED/MODIFIED/DELETED event is the object's new
--      state, judged again; the next watch starts from its resourceVersion;
--   3. where the watch ends (the server closed the stream with no event,
--      410 Gone or an ERROR event, a stream that is not events): relist (1).
--
-- Bounded by its own timeout (each watch asks the server to end by then,
-- timeoutSeconds; the wait fails once it has passed, kind "migration") and
-- by the step's time limit and SIGTERM: every request goes out under the
-- step's proc.watch, which cuts a watch in flight at once.
--
-- In a dry run (plan, run --dry-run, --server-dry-run) and in check, the
-- object is read once and judged: nothing changes the cluster there, so
-- waiting could only time out. In a rehearsal an unmet condition is a
-- controller's work (none runs in a rehearsal): the step is marked
-- "waited on a controller's work" and goes on as if it was met.
local errors = require "cozy.errors"
local validate = require "cozy.validate"
local json = require "cozy.json"
local kerrors = require "cozy.kube.errors"
local rehearsal = require "cozy.kube.rehearsal"
local sys = require "cozy.sys"

local wait = {}

wait.DEFAULT_TIMEOUT = 300 -- seconds, when opts.timeout is not given
wait.MAX_WATCH = 300 -- seconds one watch request may stay open (timeoutSeconds)

-- What a ready-made condition says of itself, for the log: fn -> text.
local described = setmetatable({}, { __mode = "k" })

local function conditions_of(obj)
  local st = type(obj) == "table" and type(obj.status) == "table" and obj.status or {}
  return type(st.conditions) == "table" and st.conditions or {}
end

-- status.conditions[type = t].status == status ("True" unless given).
local function condition_is(t, status)
  status = status or "True"
  local fn = function(obj)
    for _, c in ipairs(conditions_of(obj)) do
      if type(c) == "table" and c.type == t then
        if c.status == status then return true end
        return false, ("condition %s is %s%s"):format(t, tostring(c.status),
          c.message and (": " .. errors.safe_text(c.message)) or "")
      end
    end
    return false, ("no condition %s yet"):format(t)
  end
  described[fn] = ("condition %s=%s"):format(t, status)
  return fn
end

local function int(v) return math.tointeger(v) or 0 end

-- A Deployment rolled out, by `kubectl rollout status`'s rule
-- (k8s.io/kubectl/pkg/polymorphichelpers/rollout_status.go): the
-- controller has seen the latest spec, every replica is updated and
-- available, no old one is left; a Progressing condition with reason
-- ProgressDeadlineExceeded fails the wait at once.
local function rolled_out(obj)
  local md, spec, st = obj.metadata or {}, obj.spec or {}, obj.status or {}
  if int(md.generation) > int(st.observedGeneration) then
    return false, "waiting for the controller to observe the latest spec"
  end
  for _, c in ipairs(conditions_of(obj)) do
    if type(c) == "table" and c.type == "Progressing"
      and c.reason == "ProgressDeadlineExceeded" then
      return false, "exceeded its progress deadline", true
    end
  end
  local want = spec.replicas == nil and 1 or int(spec.replicas)
  local updated, replicas, available = int(st.updatedReplicas), int(st.replicas),
    int(st.availableReplicas)
  if updated < want then return false, ("%d of %d updated replicas"):format(updated, want) end
  if replicas > updated then
    return false, ("%d old replicas pending termination"):format(replicas - updated)
  end
  if available < updated then
    return false, ("%d of %d updated replicas available"):format(available, updated)
  end
  return true
end
described[rolled_out] = "rolled out"

-- A Secret that cert-manager issued for every name of `names`: its
-- annotation cert-manager.io/alt-names (the DNS SANs of the certificate
-- it holds, comma-separated, set by cert-manager at each issue) lists each
-- of them exactly. The annotation, not tls.crt: it is cert-manager's
-- record of what it issued, and what the platform's script 50 waits on.
local function alt_names(names)
  validate.arg(2, "alt_names(names)", "names", names,
    function(v) return type(v) == "table" and #v > 0 end, { says = "a non-empty array" })
  local wanted = {}
  for i, n in ipairs(names) do
    wanted[i] = validate.arg(2, "alt_names(names)", "each name", n, "non-empty string")
  end
  local fn = function(obj)
    local ann = type(obj.metadata) == "table" and type(obj.metadata.annotations) == "table"
      and obj.metadata.annotations["cert-manager.io/alt-names"]
    if type(ann) ~= "string" then return false, "no cert-manager.io/alt-names annotation" end
    local have = {}
    for n in ann:gmatch("[^,]+") do have[(n:gsub("^%s+", ""):gsub("%s+$", ""))] = true end
    local missing = {}
    for _, n in ipairs(wanted) do
      if not have[n] then missing[#missing + 1] = n end
    end
    if #missing > 0 then return false, "alt-names lack " .. table.concat(missing, ", ") end
    return true
  end
  described[fn] = "issued with alt-names " .. table.concat(wanted, ", ")
  return fn
end

-- The ready-made conditions (ctx.kube.conditions).
function wait.conditions()
  return {
    established = condition_is("Established"),
    rolled_out = rolled_out,
    alt_names = alt_names,
    condition = condition_is,
  }
end

-- opts -> test(obj or nil) -> met, why, fatal; and what it waits for, in words.
local function judge_of(opts)
  local n = (opts.condition ~= nil and 1 or 0) + (opts.deleted and 1 or 0) + (opts.created and 1
    or 0)
  if n ~= 1 then error("wait: give exactly one of condition, deleted = true, created = true", 4) end
  if opts.deleted then
    return function(obj) return obj == nil, "it still exists" end, "deleted"
  end
  if opts.created then
    return function(obj) return obj ~= nil, "it does not exist" end, "created"
  end
  local c, test = opts.condition, nil
  if type(c) == "string" then
    test = condition_is(c)
  elseif type(c) == "table" then
    validate.args(4, "wait",
      { { "condition.type", c.type, "string" }, { "condition.status", c.status, "string", true } })
    test = condition_is(c.type, c.status)
  elseif type(c) == "function" then
    test = c
  else
    validate.arg(4, "wait", "condition", c, "function",
      { says = "a function(obj), a condition type or { type =, status = }" })
  end
  local what = described[test] or (type(opts.what) == "string" and errors.safe_text(opts.what))
    or "to meet its condition"
  return function(obj)
    if obj == nil then return false, "it does not exist" end
    local met, why, fatal = test(obj)
    return met and true or false, why, fatal
  end, what
end

-- " (why)", or nothing when the condition said nothing
local function because(why)
  return why ~= nil and (" (" .. errors.safe_text(why) .. ")") or ""
end

-- "Kind ns/name"
local function target(res, ns, name)
  return ("%s %s%s"):format(res.kind or res.plural, ns and (ns .. "/") or "", name)
end

local function is_gone(e)
  return kerrors.is_error(e) and (e.code == 410 or e.reason == "Expired" or e.reason == "Gone")
end

-- The object as it is now, and the resourceVersion to watch from.
local function relist(res, ns, name)
  local p = res:list { namespace = ns, field_selector = "metadata.name=" .. name }
  local obj
  for o in p do
    if type(o.metadata) == "table" and o.metadata.name == name then obj = o end
  end
  return obj, p.resource_version
end

-- The events of one watch answer: each applied to `state` (obj, rv).
-- Returns "event" (at least one), "ended" (no complete event: the server
-- closed the stream) or "gone" (410: relist).
local function apply_events(body, state)
  local seen = false
  for line in (type(body) == "string" and body or ""):gmatch("([^\n]*)\n") do
    if line:find("%S") then
      local ok, ev = pcall(json.decode, line)
      if not ok or type(ev) ~= "table" or type(ev.object) ~= "table" then return "ended" end
      local md = type(ev.object.metadata) == "table" and ev.object.metadata or {}
      if ev.type == "ERROR" then
        if int(ev.object.code) == 410 then return "gone" end
        error(kerrors.new { method = "GET", path = "(watch)", code = int(ev.object.code),
          reason = ev.object.reason,
          message = "watch error: " .. errors.safe_text(ev.object.message) }, 0)
      elseif ev.type == "ADDED" or ev.type == "MODIFIED" then
        state.obj, state.rv, seen = ev.object, md.resourceVersion or state.rv, true
      elseif ev.type == "DELETED" then
        state.obj, state.rv, seen = nil, md.resourceVersion or state.rv, true
      elseif ev.type == "BOOKMARK" then
        state.rv, seen = md.resourceVersion or state.rv, true
      end
    end
  end
  return seen and "event" or "ended"
end

-- Waits on object `name` (in namespace ns) of resource `res` (a cozy.kube
-- resource of the step's view). opts: condition | deleted | created,
-- timeout (seconds), what (words for a condition function). log: the
-- step's logger; mode: the step's ("check" reads once). Returns the object as last seen (nil when
-- deleted or absent) and { met =, waited = seconds, events =, relists =, once = }
-- (once: read once and judged, not waited: check, a dry run). Raises kind
-- "migration" when the timeout passes, or the condition says it never will.
function wait.run(res, ns, name, opts, log, mode)
  validate.args(3, "wait",
    { { "name", name, "non-empty string" }, { "opts", opts, "table", true } })
  opts = opts or {}
  if res.namespaced and (type(ns) ~= "string" or ns == "") then
    error("wait: opts.namespace is required for namespaced " .. tostring(res.plural), 3)
  end
  if not res.namespaced then ns = nil end
  local timeout = opts.timeout or wait.DEFAULT_TIMEOUT
  validate.arg(3, "wait", "timeout", timeout,
    function(v) return type(v) == "number" and v > 0 and v < math.huge end,
    { says = "a positive number of seconds" })
  local test, what = judge_of(opts)
  local subject = ("%s %s"):format(target(res, ns, name), what)
  local view = res.client
  local t0 = sys.monotime()
  local info = { met = false, events = 0, relists = 0, once = false }
  local function finish(obj, met)
    info.met, info.waited = met, sys.monotime() - t0
    return obj, info
  end

  local state = {}
  state.obj, state.rv = relist(res, ns, name)
  local met, why, fatal = test(state.obj)
  if view.dry_run ~= nil or mode == "check" then
    -- nothing changes the cluster here: judged once, never waited on
    info.once = true
    if met then
      log:write("info", ("wait for %s: met already"):format(subject))
    elseif view.rehearsal then
      rehearsal.mark(view.rehearsal, ("waited on a controller's work: %s%s")
        :format(subject, because(why)))
      log:write("info",
        ("wait for %s: not met in the rehearsal%s: a controller's work, taken as done")
        :format(subject, because(why)))
    else
      log:write("info", ("wait for %s: not met now%s; not waited on in %s")
        :format(subject, because(why), view.dry_run and "a dry run" or "check"))
    end
    return finish(state.obj, met)
  end

  log:write("info", ("waiting for %s (timeout %ss)"):format(subject, tostring(timeout)))
  local deadline = t0 + timeout
  local path = res:collection_path(ns)
  while not met do
    if fatal then
      errors.raise("migration", ("wait for %s: it never will%s"):format(subject, because(why)))
    end
    local remaining = deadline - sys.monotime()
    if remaining <= 0 then
      errors.raise("migration", ("wait for %s: timed out after %ss%s")
        :format(subject, tostring(timeout), because(why)), { waited = sys.monotime() - t0 })
    end
    local seconds = math.max(1, math.min(wait.MAX_WATCH, math.ceil(remaining)))
    local query = { { "watch", "true" }, { "fieldSelector", "metadata.name=" .. name },
      { "timeoutSeconds", tostring(seconds) }, { "allowWatchBookmarks", "true" } }
    if state.rv then table.insert(query, 2, { "resourceVersion", state.rv }) end
    -- the transfer's own bound: the server's timeoutSeconds, and some
    -- seconds for a server that does not keep it
    local ok, body = pcall(view.call, view, "GET", path,
      { query = query, first_line = true, timeout = seconds + 10 })
    local outcome
    if ok then
      outcome = apply_events(body, state)
    elseif is_gone(body) then
      outcome = "gone"
    else
      error(body, 0)
    end
    if outcome == "event" then
      info.events = info.events + 1
    else
      -- where the watch ends: the object as it is now
      info.relists = info.relists + 1
      log:write("debug", ("wait for %s: the watch ended (%s), relisting"):format(subject,
        outcome == "gone" and "410 Gone" or "stream closed"))
      state.obj, state.rv = relist(res, ns, name)
    end
    met, why, fatal = test(state.obj)
  end
  local obj, done = finish(state.obj, true)
  log:write("info", ("waited %.1fs for %s"):format(done.waited, subject),
    { events = done.events, relists = done.relists })
  return obj, done
end

return wait
