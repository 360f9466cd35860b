-- The least-privilege RBAC a run needs, as Kubernetes objects: what
-- `cozy-migrate rbac` prints and what deploy/helm carries (a spec keeps the
-- two equal).
--
--   ServiceAccount       the hook Job's identity, in the namespace
--   ClusterRole+Binding  discovery, access reviews, and every cluster-wide
--                        permission the migrations declare
--   Role+Binding         the engine's own objects in the namespace (the
--                        version ConfigMap, the Lease, the run's Events), plus the migrations'
--                        permissions declared for that namespace; one Role per
--                        other namespace a migration names
--   cluster-admin        bound only when the range holds a legacy script,
--                        which declares nothing
--
-- The preflight variant (the `check` Job) gets the read verbs of the same
-- permissions, and may ask access reviews for the hook's service account.
local discovery = require "cozy.runner.discovery"

local rbac = {}

rbac.NAME = "cozystack-migration-hook"
rbac.PREFLIGHT_NAME = "cozystack-migration-preflight"
rbac.CLUSTER_ADMIN_BINDING = rbac.NAME .. "-cluster-admin"
rbac.CONFIGMAP = "cozystack-version"
rbac.LEASE = "cozystack-migrations"

-- What the engine reads before anything else: GET /version (check),
-- discovery (the client resolves resources and CRDs).
rbac.DISCOVERY_URLS = { "/api", "/api/*", "/apis", "/apis/*", "/version" }

local READ_VERBS = { get = true, list = true, watch = true }

-- What the engine does best effort (runner/events.lua): a run without it
-- goes on, so check reports its absence as a warning, not a block.
rbac.BEST_EFFORT = { ["events.k8s.io/events"] = true }

-- The engine's own needs in its namespace as permissions ({verb, group,
-- resource, name, best_effort}), for check's access reviews: the same as
-- the rules below.
function rbac.engine_permissions(preflight)
  local out = {}
  for _, rule in ipairs(rbac.engine_rules(preflight)) do
    for _, verb in ipairs(rule.verbs) do
      out[#out + 1] = { verb = verb, group = rule.apiGroups[1], resource = rule.resources[1],
        name = rule.resourceNames and rule.resourceNames[1] or nil,
        best_effort = rbac.BEST_EFFORT[rule.apiGroups[1] .. "/" .. rule.resources[1]] or nil }
    end
  end
  return out
end

-- The engine's own needs in its namespace, as rules. Objects are named where
-- Kubernetes allows it (create cannot be restricted by name).
function rbac.engine_rules(preflight)
  if preflight then
    return {
      { apiGroups = { "" }, resources = { "configmaps" }, resourceNames = { rbac.CONFIGMAP },
        verbs = { "get" } },
      { apiGroups = { "coordination.k8s.io" }, resources = { "leases" },
        resourceNames = { rbac.LEASE }, verbs = { "get" } },
    }
  end
  return {
    { apiGroups = { "" }, resources = { "configmaps" }, verbs = { "create" } },
    { apiGroups = { "" }, resources = { "configmaps" }, resourceNames = { rbac.CONFIGMAP },
      verbs = { "get", "patch" } },
    { apiGroups = { "coordination.k8s.io" }, resources = { "leases" }, verbs = { "create" } },
    -- taking over, renewing and releasing the Lease are all JSON patches
    { apiGroups = { "coordination.k8s.io" }, resources = { "leases" },
      resourceNames = { rbac.LEASE }, verbs = { "get", "patch" } },
    -- the run's Events, on the ConfigMap and the Job's pod (both in this
    -- namespace): created, never read, updated or deleted
    { apiGroups = { "events.k8s.io" }, resources = { "events" }, verbs = { "create" } },
  }
end

-- The engine's cluster-wide needs: discovery and its own access reviews
-- (check asks SelfSubjectAccessReviews; the preflight Job asks
-- SubjectAccessReviews about the hook's service account; `stamp`, run with
-- the hook's account, asks a SelfSubjectReview who it is).
function rbac.engine_cluster_rules(preflight)
  local rules = {
    { nonResourceURLs = rbac.DISCOVERY_URLS, verbs = { "get" } },
    { apiGroups = { "authorization.k8s.io" }, resources = { "selfsubjectaccessreviews" },
      verbs = { "create" } },
  }
  if not preflight then
    rules[#rules + 1] = { apiGroups = { "authentication.k8s.io" },
      resources = { "selfsubjectreviews" }, verbs = { "create" } }
  end
  if preflight then
    rules[#rules + 1] = { apiGroups = { "authorization.k8s.io" },
      resources = { "subjectaccessreviews" }, verbs = { "create" } }
  end
  return rules
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- Declared permissions -> rules grouped by (group, resource, name), verbs sorted,
-- one table per namespace ("" = cluster-wide). preflight keeps read verbs;
-- the hook's (not preflight) leaves out check_only ones.
function rbac.declared_rules(migrations, preflight)
  local by_ns = {}
  for _, m in ipairs(migrations) do
    -- the hook runs `run`, the preflight `check`: what only check() reads
    -- stays out of the hook's Role
    for _, p in ipairs(discovery.permissions_for(m.definition, preflight and "check" or "run")) do
      if not preflight or READ_VERBS[p.verb] then
        local ns = p.namespace or ""
        local resource = p.resource .. (p.subresource and ("/" .. p.subresource) or "")
        local key = (p.group or "") .. "\0" .. resource .. "\0" .. (p.name or "")
        by_ns[ns] = by_ns[ns] or {}
        local r = by_ns[ns][key]
        if not r then
          r = { group = p.group or "", resource = resource, name = p.name, verbs = {} }
          by_ns[ns][key] = r
        end
        r.verbs[p.verb] = true
      end
    end
  end
  local out = {}
  for ns, rules in pairs(by_ns) do
    local list = {}
    for _, key in ipairs(sorted_keys(rules)) do
      local r = rules[key]
      list[#list + 1] = { apiGroups = { r.group }, resources = { r.resource },
        resourceNames = r.name and { r.name } or nil, verbs = sorted_keys(r.verbs) }
    end
    out[ns] = list
  end
  return out
end

local function append(dst, src)
  for _, v in ipairs(src) do dst[#dst + 1] = v end
  return dst
end

local function meta(name, namespace, extra)
  local m = { name = name, namespace = namespace,
    labels = { ["app.kubernetes.io/name"] = "cozy-migrate",
      ["app.kubernetes.io/component"] = extra } }
  return m
end

local function subject(name, namespace)
  return { { kind = "ServiceAccount", name = name, namespace = namespace } }
end

-- The objects for `migrations` (the range, or the whole set). opts:
-- namespace, preflight (the check Job's read-only variant). Returns the
-- objects and the legacy migrations found in the range (nil when none).
function rbac.objects(migrations, opts)
  local ns = opts.namespace
  local preflight = opts.preflight
  local name = preflight and rbac.PREFLIGHT_NAME or rbac.NAME
  local component = preflight and "preflight" or "migration"
  local declared = rbac.declared_rules(migrations, preflight)
  local legacy = {}
  for _, m in ipairs(migrations) do
    if m.kind == "legacy" then legacy[#legacy + 1] = m end
  end
  local objects = {
    { apiVersion = "v1", kind = "ServiceAccount", metadata = meta(name, ns, component) },
    { apiVersion = "rbac.authorization.k8s.io/v1", kind = "ClusterRole",
      metadata = meta(name, nil, component),
      rules = append(rbac.engine_cluster_rules(preflight), declared[""] or {}) },
    { apiVersion = "rbac.authorization.k8s.io/v1", kind = "ClusterRoleBinding",
      metadata = meta(name, nil, component),
      roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole", name = name },
      subjects = subject(name, ns) },
    { apiVersion = "rbac.authorization.k8s.io/v1", kind = "Role",
      metadata = meta(name, ns, component),
      rules = append(rbac.engine_rules(preflight), declared[ns] or {}) },
    { apiVersion = "rbac.authorization.k8s.io/v1", kind = "RoleBinding",
      metadata = meta(name, ns, component),
      roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = name },
      subjects = subject(name, ns) },
  }
  for _, other in ipairs(sorted_keys(declared)) do
    if other ~= "" and other ~= ns then
      objects[#objects + 1] = { apiVersion = "rbac.authorization.k8s.io/v1", kind = "Role",
        metadata = meta(name, other, component), rules = declared[other] }
      objects[#objects + 1] = { apiVersion = "rbac.authorization.k8s.io/v1", kind = "RoleBinding",
        metadata = meta(name, other, component),
        roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = name },
        subjects = subject(name, ns) }
    end
  end
  if #legacy > 0 and not preflight then
    objects[#objects + 1] = rbac.cluster_admin_binding(ns)
  end
  return objects, #legacy > 0 and legacy or nil
end

-- Legacy scripts declare nothing: the run gets cluster-admin, as today.
function rbac.cluster_admin_binding(ns)
  local m = meta(rbac.CLUSTER_ADMIN_BINDING, nil, "migration")
  m.annotations = { ["cozystack.io/why"] =
    "the pending migrations include legacy scripts, which declare no permissions" }
  return { apiVersion = "rbac.authorization.k8s.io/v1", kind = "ClusterRoleBinding", metadata = m,
    roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole",
      name = "cluster-admin" },
    subjects = subject(rbac.NAME, ns) }
end

-- Multi-document YAML, one document per object, as kubectl prints them
-- (cozy.yaml: go-yaml's key order and quoting; the plan's diffs use it too).
function rbac.yaml(objects)
  local yaml = require "cozy.yaml"
  local out = {}
  for _, o in ipairs(objects) do
    out[#out + 1] = "---\n"
    out[#out + 1] = yaml.encode(o)
  end
  return table.concat(out)
end

return rbac
