-- Kubernetes Events (events.k8s.io/v1) of a run, what `kubectl get events`
-- shows an operator: a step started, done (its outcome), failed (its
-- cause); the lock waited for, taken over from an expired holder. Each is
-- written on the version ConfigMap and, when POD_NAME is set (the hook
-- Job), on the Job's pod too.
--
-- The fields are client-go's recorder's (k8s.io/client-go/tools/events,
-- makeEvent): name "<regarding>.<hex of UnixNano>", eventTime a MicroTime,
-- reportingController and reportingInstance, action, reason, regarding,
-- note (kube-apiserver refuses one over 1024 bytes), type Normal or Warning.
--
-- Best effort: an Event is a report, never a reason to fail or hold a run.
-- Each is one create on a connection of its own, a short timeout and a
-- retry budget of two attempts; a failure is logged once (WARN, later ones
-- at debug), and an Event the server will keep refusing (403: no RBAC for
-- it; 404: the API is not served; no answer at all) stops the run's Events.
local errors = require "cozy.errors"
local kerrors = require "cozy.kube.errors"
local lease = require "cozy.runner.lease"
local sys = require "cozy.sys"
local transport = require "cozy.transport"
local text = require "cozy.text"

local events = {}

events.CONTROLLER = "cozystack.io/cozy-migrate"
events.NOTE_LIMIT = 1024
-- kube-apiserver's limit on reportingInstance, action and reason
events.FIELD_LIMIT = 128
-- one Event's bounds: an answer within REQUEST_TIMEOUT seconds, and the
-- "events" retry policy's attempts and time (core/retry_policy.c), also
-- asked of each create as its retry budget (RETRY), so that they hold
-- whatever client `connect` gives
events.REQUEST_TIMEOUT = 5
local POLICY = transport.retry_policy("events")
events.RETRY = { attempts = POLICY.max_attempts, time = POLICY.max_time }

local WARNING = { StepFailed = true, LockTakenOver = true }

local Recorder = {}
Recorder.__index = Recorder

-- A run's recorder. o: connect (a function returning a cozy.kube client,
-- called at the first Event), namespace (the ConfigMap's), configmap (its
-- name), identity (reportingInstance), log, pod (POD_NAME, or nil) and
-- pod_namespace (POD_NAMESPACE, else the engine's namespace). A recorder
-- with `off` set (plan, check, dry runs) writes nothing.
function events.recorder(o)
  local pod
  if o.pod and o.pod ~= "" then
    pod = { apiVersion = "v1", kind = "Pod", name = o.pod,
      namespace = (o.pod_namespace and o.pod_namespace ~= "") and o.pod_namespace or o.namespace }
  end
  return setmetatable({ connect = o.connect, log = o.log, off = o.off, last_nano = 0,
    instance = text.prefix(text.safe(o.identity or "unknown"), events.FIELD_LIMIT),
    configmap = { apiVersion = "v1", kind = "ConfigMap", name = o.configmap,
      namespace = o.namespace },
    pod = pod, written = 0, failed = 0 }, Recorder)
end

-- The ConfigMap as last read: its uid goes into later Events' regarding.
function Recorder:regard(cm)
  local uid = type(cm) == "table" and type(cm.metadata) == "table" and cm.metadata.uid
  if type(uid) == "string" then self.configmap.uid = uid end
end

-- Unique names, as client-go's: the time in nanoseconds, never the same
-- twice from one recorder (two Events within the clock's resolution).
function Recorder:name_of(regarding)
  local nano = math.max(math.floor(sys.time() * 1e9), self.last_nano + 1)
  self.last_nano = nano
  return ("%s.%x"):format(regarding.name, nano)
end

function Recorder:object(regarding, reason, action, note, now)
  local ref = {}
  for k, v in pairs(regarding) do ref[k] = v end
  return {
    apiVersion = "events.k8s.io/v1", kind = "Event",
    metadata = { name = self:name_of(regarding), namespace = regarding.namespace },
    eventTime = lease.microtime(now),
    reportingController = events.CONTROLLER,
    reportingInstance = self.instance,
    action = action, reason = reason,
    regarding = ref,
    note = text.prefix(text.safe(note), events.NOTE_LIMIT),
    type = WARNING[reason] and "Warning" or "Normal",
  }
end

-- Will the server keep refusing Events, whatever we send?
local function hopeless(err)
  if not kerrors.is_error(err) then return false end
  return err.code == nil or err.code == 0 or err.code == 403 or err.code == 404
end

function Recorder:failure(err)
  self.failed = self.failed + 1
  local fields = { error = errors.text(err), code = kerrors.is_error(err) and err.code or nil }
  if hopeless(err) then
    self.off = true
    fields.further_events = "not written"
  end
  if self.failed == 1 then
    self.log:warn("could not write a Kubernetes Event (best effort: the run goes on)", fields)
  else
    self.log:debug("could not write a Kubernetes Event", fields)
  end
end

-- Writes the Event `reason` (StepStarted, StepSucceeded, StepFailed,
-- LockWaiting, LockTakenOver) with `action` and `note`, on the ConfigMap
-- and the pod. Never raises.
function Recorder:emit(reason, action, note)
  if self.off then return end
  local ok, err = pcall(function()
    if self.events == nil then
      self.client = self.connect()
      self.events = self.client:resource("events.k8s.io/v1", "events", { kind = "Event" })
    end
    local now = sys.time()
    for _, regarding in ipairs { self.configmap, self.pod } do
      if self.off then return end
      local cok, cerr = pcall(self.events.create, self.events,
        self:object(regarding, reason, action, note, now), { retry = events.RETRY })
      if cok then self.written = self.written + 1 else self:failure(cerr) end
    end
  end)
  if not ok then self:failure(err) end
end

function Recorder:close()
  if self.client then self.client:close() end
  self.client, self.events = nil, nil
end
-- `local rec <close> = ...`: its connection is closed on every path out
Recorder.__close = Recorder.close

return events
