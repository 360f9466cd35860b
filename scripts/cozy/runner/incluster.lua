-- In-cluster defaults: inside a pod (no --kubeconfig, no $KUBECONFIG,
-- $KUBERNETES_SERVICE_HOST set) the service account's `namespace` file is
-- the default namespace, as for kubectl. The directory is
-- /var/run/secrets/kubernetes.io/serviceaccount, or
-- $COZY_MIGRATE_SERVICEACCOUNT_DIR (specs), as core/kubeconfig.c reads it.
local incluster = {}

incluster.DEFAULT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

local function set(name)
  local v = os.getenv(name)
  return v ~= nil and v ~= ""
end

function incluster.active(opts)
  return not (opts.kubeconfig and opts.kubeconfig ~= "") and not set("KUBECONFIG")
    and set("KUBERNETES_SERVICE_HOST")
end

-- The service account's namespace, or nil.
function incluster.namespace(opts)
  if not incluster.active(opts) then return nil end
  local dir = os.getenv("COZY_MIGRATE_SERVICEACCOUNT_DIR")
  if dir == nil or dir == "" then dir = incluster.DEFAULT_DIR end
  local f = io.open(dir .. "/namespace", "rb")
  if not f then return nil end
  local ns = f:read("a"):match("^%s*(.-)%s*$")
  f:close()
  return ns ~= "" and ns or nil
end

return incluster
