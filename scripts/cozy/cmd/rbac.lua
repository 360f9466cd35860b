-- `cozy-migrate rbac [--all] [--target N] [--preflight] [--output yaml|json]`:
-- prints the least-privilege RBAC (cozy.rbac) for the pending range, read
-- from the version stamp, or for every known migration with --all (no
-- cluster needed). A range holding a legacy script gets cluster-admin, and
-- says so on stderr. --preflight: the read-only variant for the `check` Job.
local discovery = require "cozy.runner.discovery"
local json = require "cozy.json"
local rbac = require "cozy.rbac"
local runner = require "cozy.runner"
local stamp = require "cozy.runner.stamp"

local as_array = json.array or function(t) return t end

local M = {}

-- The migrations the output covers: all of them, or the pending range.
local function range(opts, set, log)
  if opts.all then return set.migrations, "all" end
  local namespace = runner.namespace(opts)
  local target = runner.target(opts, set)
  local client = runner.connect(opts, log)
  local cm = stamp.read(client:resource("v1", "configmaps"), namespace)
  if cm == nil then
    log:info("no version ConfigMap: a fresh install runs no migration", { namespace = namespace })
    return {}, "fresh install"
  end
  local current = stamp.version_of(cm)
  if current >= target then
    return {}, ("version %d, target %d: nothing pending"):format(current, target)
  end
  return discovery.pending(set, current, target), ("%d..%d"):format(current, target - 1)
end

function M.run(opts)
  return runner.protect(opts, function(log)
    local set = runner.discover(opts)
    local migrations, what = range(opts, set, log)
    local objects, legacy = rbac.objects(migrations,
      { namespace = runner.namespace(opts), preflight = opts.preflight })
    if legacy and not opts.preflight then
      local names = {}
      for _, m in ipairs(legacy) do names[#names + 1] = m.file end
      io.stderr:write("cozy-migrate rbac: WARNING: the range (", what, ") holds legacy script(s) ",
        table.concat(names, ", "), ", which declare no permissions: the output binds ",
        "cluster-admin (ClusterRoleBinding ", rbac.CLUSTER_ADMIN_BINDING, ") for this run\n")
    end
    if opts.output == "json" then
      for _, o in ipairs(objects) do
        for _, r in ipairs(o.rules or {}) do
          for k, v in pairs(r) do r[k] = as_array(v) end
        end
        if o.rules then o.rules = as_array(o.rules) end
        if o.subjects then o.subjects = as_array(o.subjects) end
      end
      io.stdout:write(json.encode({ apiVersion = "v1", kind = "List", items = as_array(objects) }),
        "\n")
    else
      io.stdout:write("# cozy-migrate rbac: ", what, opts.preflight and " (preflight)" or "", "\n",
        rbac.yaml(objects))
    end
    return 0
  end)
end

return M
