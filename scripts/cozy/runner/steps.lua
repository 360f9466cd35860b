-- Deciding the steps: which namespace, which target, which version the
-- cluster is at, and so which migrations a run takes it through.
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.errors"
local lease = require "cozy.runner.lease"
local stamp = require "cozy.runner.stamp"

local steps = {}

function steps.namespace(opts)
  local ns = opts.namespace or os.getenv("NAMESPACE")
  if ns == nil or ns == "" then
    -- as kubectl: the namespace the context sets (in a pod, the service
    -- account's); a configuration that cannot be read fails at connect
    local cfg
    if opts.client then cfg = opts.client
    else cfg = require("cozy.transport").config { kubeconfig = opts.kubeconfig,
      context = opts.context } end
    ns = cfg and cfg.namespace or "cozy-system"
  end
  return ns
end

-- A non-negative decimal integer from the environment, or nil when unset.
function steps.env_integer(name)
  local v = os.getenv(name)
  if v == nil or v == "" then return nil end
  local n = v:match("^%d+$") and math.tointeger(tonumber(v))
  if n == nil then
    errors.raise("usage", ("$%s must be a non-negative decimal integer, got %q"):format(name, v))
  end
  return n
end

-- --target, else $TARGET_VERSION, else highest migration number + 1.
function steps.target(opts, set)
  local t = opts.target or steps.env_integer("TARGET_VERSION") or discovery.default_target(set)
  if t == nil then
    errors.raise("usage",
      "no target version: no migrations known and neither --target nor $TARGET_VERSION given")
  end
  return t
end

-- $CURRENT_VERSION (what the platform's hook passes) is only cross-checked:
-- the ConfigMap wins, a mismatch or a malformed value is worth a warning.
local function cross_check(log, current)
  local ok, hook_current = pcall(steps.env_integer, "CURRENT_VERSION")
  if not ok then
    log:warn("ignoring $CURRENT_VERSION: " .. errors.text(hook_current))
  elseif hook_current and hook_current ~= current then
    log:warn("$CURRENT_VERSION differs from the stamped version; the ConfigMap wins",
      { env = hook_current, stamped = current })
  end
end

-- A missing ConfigMap means a fresh install only where no runner has
-- migrated before. The Lease is created by the first run that migrates and
-- is kept (release only clears its holder), so a Lease without a ConfigMap
-- means the stamp was deleted: bootstrapping would stamp the target over
-- steps that never ran. That is for an operator to resolve; raises "failed".
function steps.refuse_lost_stamp(leases, namespace)
  if leases == nil then return end
  local l = leases:find(namespace, lease.NAME)
  if l == nil then return end
  errors.raise("failed",
    ("the version ConfigMap %s/%s is missing, but the Lease %s/%s shows that migrations have "
    .. "run here: refusing to treat the cluster as a fresh install. Recreate the ConfigMap at "
    .. "the version the "
    .. "cluster is at (kubectl -n %s create configmap %s --from-literal=version=N), or delete "
    .. "the Lease if this "
    .. "really is a fresh install"):format(namespace, stamp.CONFIGMAP, namespace, lease.NAME,
      namespace,
    stamp.CONFIGMAP), { namespace = namespace })
end

-- What a run would do now, read from the cluster:
--   { action = "bootstrap" }                       no ConfigMap: stamp the target, run nothing
--   { action = "none", current =, cm = }           at or past the target
--   { action = "migrate", current =, cm =, steps = {m...} }
-- Raises "invalid" for a gap in the pending range.
function steps.decide(set, cms, namespace, target, log, leases)
  local cm = stamp.read(cms, namespace)
  if cm == nil then
    steps.refuse_lost_stamp(leases, namespace)
    return { action = "bootstrap", target = target }
  end
  local current = stamp.version_of(cm)
  -- a history the first stamp could not append to stops the run before any step
  stamp.history_of(cm)
  if log then
    cross_check(log, current)
    for _, d in ipairs(discovery.defects(set, current, target)) do
      log:warn("outside the pending range, so not refused: " .. d)
    end
    for _, r in ipairs(set.replaced or {}) do
      log:info("the built-in " .. r.by .. " runs in place of the legacy script " .. r.file)
    end
  end
  if current >= target then
    return { action = "none", current = current, target = target, cm = cm }
  end
  return { action = "migrate", current = current, target = target, cm = cm,
    steps = discovery.pending(set, current, target) }
end

return steps
