-- Conformance of the fake API server, measured: every request shape the
-- engine and its specs send goes to the fake and to the real kube-apiserver
-- (spec/support/kube-apiserver), each loaded with the same fixture, and the
-- answers are compared: status code, reason, message, the shape of
-- `details` (name, group, kind, causes[].reason/field/message) and the object
-- that results. Server-assigned values (uid, resourceVersion, timestamps,
-- managedFields, continue tokens) are compared by presence only.
--
-- A difference is either fixed in the fake or listed in KNOWN below, with its
-- reason, and in spec/support/README.md ("Deliberate differences"). The spec
-- fails on a difference that is not listed AND on a listed one that no longer
-- occurs, so the list stays exactly true.
local fake = require("spec.helpers").server
local json = require "cozy.json"

local FIXTURE = "spec/fixtures/real/conformance.json"
local NS = "/api/v1/namespaces/conf"
local VMS = "/apis/kubevirt.io/v1/namespaces/conf/virtualmachines"
local JSON_PATCH = "application/json-patch+json"
local MERGE_PATCH = "application/merge-patch+json"

-- case name -> { aspect = reason }: the differences that stay, and why.
local KNOWN = {
  ["merge patch with an invalid label key"] = {
    details = "the real server lists each label cause three times on an update (its ObjectMeta checks run " ..
      "once per validation pass); the fake lists it once",
  },
  ["custom resource with an unknown field"] = {
    object = "the fake keeps fields a CRD's structural schema would prune (it validates no schema)",
  },
  ["custom resource with an invalid field"] = {
    status = "the fake accepts values a CRD's schema refuses (no OpenAPI validation)",
    reason = "as status", message = "as status", details = "as status", object = "as status",
  },
}

---------------------------------------------------------------------------
-- Normalising an answer

local SERVER_SET = { uid = true, resourceVersion = true, creationTimestamp = true, managedFields = true,
                     selfLink = true }

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  return keys
end

-- A deterministic text of a value, for comparison and for messages.
local function canon(v)
  if v == nil then return "(absent)" end
  if type(v) ~= "table" then return json.encode(v) end
  if json.is_array and json.is_array(v) or (#v > 0 and next(v, #v) == nil) then
    local parts = {}
    for i = 1, #v do parts[i] = canon(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local parts = {}
  for _, k in ipairs(sorted_keys(v)) do parts[#parts + 1] = json.encode(k) .. ":" .. canon(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- An object with what the server assigns reduced to "set".
local function object_shape(o)
  if type(o) ~= "table" then return o end
  local copy = json.decode(json.encode(o))
  local md = copy.metadata
  if type(md) == "table" then
    for k in pairs(SERVER_SET) do
      if md[k] ~= nil then md[k] = "set" end
    end
    md.managedFields = nil
    if md.continue ~= nil then md.continue = "set" end
    if next(md) == nil then copy.metadata = nil end
  end
  for _, item in ipairs(type(copy.items) == "table" and copy.items or {}) do
    local imd = item.metadata or {}
    for k in pairs(SERVER_SET) do
      if imd[k] ~= nil then imd[k] = "set" end
    end
    imd.managedFields = nil
  end
  return copy
end

-- The user a 403 names differs by construction (the fake has one user):
-- the rest of the message must agree.
local function message_shape(m)
  if type(m) ~= "string" then return m end
  return (m:gsub('User "[^"]*"', 'User "<user>"'))
end

local function details_shape(d)
  if type(d) ~= "table" then return d end
  local out = { name = d.name, group = d.group, kind = d.kind, uid = d.uid and "set" or nil,
                retryAfterSeconds = d.retryAfterSeconds }
  if d.causes then
    out.causes = {}
    for i, c in ipairs(d.causes) do
      out.causes[i] = { reason = c.reason, field = c.field, message = c.message }
    end
  end
  return out
end

-- The aspects of an answer that are compared.
local function aspects(res)
  local body = res.json
  local is_status = type(body) == "table" and body.kind == "Status"
  return {
    status = res.status,
    reason = is_status and body.reason or nil,
    message = is_status and message_shape(body.message) or nil,
    details = is_status and details_shape(body.details) or nil,
    object = not is_status and object_shape(body) or nil,
    -- an answer that is not JSON (kube-apiserver's plain-text 404) by its text
    text = body == nil and res.body ~= "" and res.body or nil,
  }
end

---------------------------------------------------------------------------
-- The request shapes. Each case runs on a server freshly reset to FIXTURE:
-- `steps` are requests whose answers are compared one by one (a step's
-- `after` is a GET whose answer is compared too: the object that results);
-- `as = "nobody"` sends a step with a token RBAC grants nothing.

local function cm(name, data, extra)
  local o = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, namespace = "conf" }, data = data }
  for k, v in pairs(extra or {}) do o.metadata[k] = v end
  return o
end

local function lease(holder, rv, transitions)
  return {
    apiVersion = "coordination.k8s.io/v1", kind = "Lease",
    metadata = { name = "held", namespace = "conf", resourceVersion = rv },
    spec = { holderIdentity = holder, leaseDurationSeconds = 30, acquireTime = "2026-01-01T00:00:00.000000Z",
             renewTime = "2026-01-01T00:01:00.000000Z", leaseTransitions = transitions },
  }
end

local LEASES = "/apis/coordination.k8s.io/v1/namespaces/conf/leases"
local PVCS = NS .. "/persistentvolumeclaims"
local DEPLOYS = "/apis/apps/v1/namespaces/conf/deployments"

-- What discovery says of each resource named (and which of its subresources
-- exist), for kubectl-name lookups: scope, kind, short names, categories, verbs.
local function discovered(names)
  return function(o)
    local out = {}
    for _, r in ipairs(o.resources or {}) do
      local base, sub = r.name:match("^([^/]+)/?(.*)$")
      for _, want in ipairs(names) do
        if base == want then
          local e = out[want] or {}
          if sub == "" then
            local verbs = {}
            for i, v in ipairs(r.verbs or {}) do verbs[i] = v end
            table.sort(verbs)
            e.namespaced, e.kind, e.singular, e.verbs = r.namespaced, r.kind, r.singularName, table.concat(verbs, ",")
            e.shortNames = table.concat(r.shortNames or {}, ",")
            e.categories = table.concat(r.categories or {}, ",")
          elseif sub == "status" then
            e.status = true
          end
          out[want] = e
        end
      end
    end
    return out
  end
end

local function labels_of(o) return { kind = o.kind, labels = o.metadata and o.metadata.labels } end

local function names_of(o)
  local out = {}
  for i, item in ipairs(o.items or {}) do out[i] = item.metadata.name end
  return { kind = o.kind, names = out }
end

local CASES = {
  { "list with limit and continue", steps = {
    { "GET", NS .. "/configmaps?limit=1" },
    { "GET", NS .. "/configmaps?limit=1&continue=<<continue>>" },
    { "GET", NS .. "/configmaps?limit=1&continue=<<continue>>" },
  } },
  { "list with a label selector", steps = { { "GET", NS .. "/configmaps?labelSelector=app%3Da" } } },
  { "get", steps = { { "GET", NS .. "/configmaps/cm-a" } } },
  { "get of a missing object", steps = { { "GET", NS .. "/configmaps/nope" } } },
  { "get of a custom resource", steps = { { "GET", VMS .. "/vm1" } } },
  { "create", steps = { { "POST", NS .. "/configmaps", body = cm("new", { a = "1" }), after = NS .. "/configmaps/new" } } },
  { "create of an existing object", steps = { { "POST", NS .. "/configmaps", body = cm("cm-a", { a = "1" }) } } },
  { "create without a name", steps = { { "POST", NS .. "/configmaps", body = cm(nil, {}) } } },
  { "create in a missing namespace", steps = {
    { "POST", "/api/v1/namespaces/nope/configmaps", body = cm("x", {}) } } },
  { "PUT with a stale resourceVersion", steps = {
    { "PUT", NS .. "/configmaps/cm-b", body = cm("cm-b", { k = "9" }, { resourceVersion = "1" }),
      after = NS .. "/configmaps/cm-b" } } },
  { "PUT with the current resourceVersion", steps = {
    { "PUT", NS .. "/configmaps/cm-b", body = cm("cm-b", { k = "9" }, { resourceVersion = "<<rv:cm-b>>" }),
      after = NS .. "/configmaps/cm-b" } } },
  { "JSON patch whose test fails", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH,
      body = '[{"op":"test","path":"/metadata/resourceVersion","value":"1"},{"op":"replace","path":"/data/k","value":"9"}]',
      after = NS .. "/configmaps/cm-a" } } },
  { "JSON patch whose test passes", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH,
      body = '[{"op":"test","path":"/metadata/resourceVersion","value":"<<rv:cm-a>>"},{"op":"replace","path":"/data/k","value":"9"}]',
      after = NS .. "/configmaps/cm-a" } } },
  { "JSON patch add under a missing parent", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH, body = '[{"op":"add","path":"/spec/x/y","value":"9"}]' } } },
  { "JSON patch remove of a missing key", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH, body = '[{"op":"remove","path":"/data/nope"}]' } } },
  { "JSON patch with an unknown op", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH, body = '[{"op":"frob","path":"/data/k"}]' } } },
  { "JSON patch that is not a list of ops", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH, body = '{"op":"add"}' } } },
  { "JSON patch on a custom resource", steps = {
    { "PATCH", VMS .. "/vm1", content_type = JSON_PATCH,
      body = '[{"op":"add","path":"/spec/template/spec/volumes/-","value":{"name":"hp","persistentVolumeClaim":{"claimName":"hp","hotpluggable":true}}}]',
      after = VMS .. "/vm1" } } },
  { "merge patch with null", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = MERGE_PATCH, body = '{"data":{"drop":null},"metadata":{"labels":{"app":null}}}',
      after = NS .. "/configmaps/cm-a" } } },
  { "merge patch that removes a custom resource's last label", steps = {
    { "PATCH", VMS .. "/vm1", content_type = MERGE_PATCH, body = '{"metadata":{"labels":{"a":"b"}}}' },
    { "PATCH", VMS .. "/vm1", content_type = MERGE_PATCH, body = '{"metadata":{"labels":{"a":null}}}', after = VMS .. "/vm1" } } },
  { "merge patch that empties a ConfigMap's data", steps = {
    { "PATCH", NS .. "/configmaps/cm-b", content_type = MERGE_PATCH, body = '{"data":{"k":null}}', after = NS .. "/configmaps/cm-b" } } },
  { "JSON patch whose ops are not objects", steps = {
    { "PATCH", NS .. "/configmaps/cm-a", content_type = JSON_PATCH, body = '[1]' } } },
  { "a path of a group no server part serves", steps = { { "GET", "/apis/nope.example.com/v1/namespaces/conf/things" } } },
  { "a resource a CRD's group does not serve", steps = { { "GET", "/apis/kubevirt.io/v1/namespaces/conf/nopes" } } },
  { "a resource a built-in group does not serve", steps = { { "GET", "/apis/coordination.k8s.io/v1/namespaces/conf/nopes" } } },
  { "merge patch of a missing object", steps = {
    { "PATCH", NS .. "/configmaps/nope", content_type = MERGE_PATCH, body = '{"data":{"a":"1"}}' } } },
  { "delete", steps = { { "DELETE", NS .. "/configmaps/cm-c", after = NS .. "/configmaps/cm-c" } } },
  { "delete of a missing object", steps = { { "DELETE", NS .. "/configmaps/nope" } } },
  { "delete of a custom resource", steps = { { "DELETE", VMS .. "/vm1", after = VMS .. "/vm1" } } },
  { "dryRun=All create", steps = {
    { "POST", NS .. "/configmaps?dryRun=All", body = cm("dry", { a = "1" }), after = NS .. "/configmaps/dry" } } },
  { "dryRun=All patch", steps = {
    { "PATCH", NS .. "/configmaps/cm-a?dryRun=All", content_type = MERGE_PATCH, body = '{"data":{"k":"dry"}}',
      after = NS .. "/configmaps/cm-a" } } },
  { "dryRun=All delete", steps = {
    { "DELETE", NS .. "/configmaps/cm-a?dryRun=All", after = NS .. "/configmaps/cm-a" } } },
  -- kubectl's delete: its options in a body, which the server then reads
  -- alone (the query's dryRun ignored: the object is deleted) ...
  { "delete with a DeleteOptions body and dryRun=All in the query", steps = {
    { "DELETE", NS .. "/configmaps/cm-b?dryRun=All", body = '{"propagationPolicy":"Background"}',
      after = NS .. "/configmaps/cm-b" } } },
  -- ... and a dry run when the body says so
  { "delete with dryRun in its DeleteOptions body", steps = {
    { "DELETE", NS .. "/configmaps/cm-a", body = '{"propagationPolicy":"Background","dryRun":["All"]}',
      after = NS .. "/configmaps/cm-a" } } },
  { "Lease create", steps = {
    { "POST", LEASES, body = (function() local l = lease("runner-b", nil, 0); l.metadata.name = "fresh"; return l end)(),
      after = LEASES .. "/fresh" } } },
  { "Lease renew", steps = {
    { "PUT", LEASES .. "/held", body = lease("runner-a", "<<rv:lease>>", 0), after = LEASES .. "/held" } } },
  { "Lease takeover", steps = {
    { "PUT", LEASES .. "/held", body = lease("runner-b", "<<rv:lease>>", 1), after = LEASES .. "/held" } } },
  { "Lease takeover that lost the race", steps = {
    { "PUT", LEASES .. "/held", body = lease("runner-b", "1", 1), after = LEASES .. "/held" } } },
  { "SelfSubjectAccessReview", steps = {
    { "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
      body = { apiVersion = "authorization.k8s.io/v1", kind = "SelfSubjectAccessReview",
               spec = { resourceAttributes = { verb = "patch", resource = "configmaps", namespace = "conf" } } },
      pick = function(o) return { kind = o.kind, allowed = o.status and o.status.allowed } end } } },
  { "SelfSubjectAccessReview of a user RBAC grants nothing", steps = {
    { "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", as = "nobody",
      body = { apiVersion = "authorization.k8s.io/v1", kind = "SelfSubjectAccessReview",
               spec = { resourceAttributes = { verb = "patch", resource = "configmaps", namespace = "conf" } } },
      pick = function(o) return { kind = o.kind, allowed = o.status and o.status.allowed } end } } },
  -- who we are (`cozy-migrate stamp`): the user's name differs between the
  -- servers (the fake has its own), the answer's shape does not
  { "SelfSubjectReview", steps = {
    { "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
      body = { apiVersion = "authentication.k8s.io/v1", kind = "SelfSubjectReview" },
      pick = function(o)
        local u = o.status and o.status.userInfo or {}
        local authenticated = false
        for _, g in ipairs(u.groups or {}) do authenticated = authenticated or g == "system:authenticated" end
        return { kind = o.kind, named = type(u.username) == "string" and u.username ~= "", authenticated = authenticated }
      end } } },
  { "a request RBAC does not allow", steps = { { "GET", NS .. "/configmaps/cm-a", as = "nobody" } } },
  { "a write RBAC does not allow", steps = {
    { "PATCH", VMS .. "/vm1", as = "nobody", content_type = MERGE_PATCH, body = '{"metadata":{"labels":{"x":"y"}}}' } } },
  { "discovery of the core group", steps = { { "GET", "/api/v1",
    pick = function(o)
      local out = {}
      for _, r in ipairs(o.resources or {}) do
        if r.name == "configmaps" or r.name == "namespaces" then
          out[r.name] = { namespaced = r.namespaced, kind = r.kind }
        end
      end
      return out
    end } } },
  { "discovery of a CRD's group", steps = {
    { "GET", "/apis/kubevirt.io", pick = function(o)
      return { kind = o.kind, name = o.name, preferred = o.preferredVersion and o.preferredVersion.version }
    end },
    { "GET", "/apis/kubevirt.io/v1", pick = function(o)
      for _, r in ipairs(o.resources or {}) do
        if r.name == "virtualmachines" then
          local verbs = {}
          for _, v in ipairs(r.verbs or {}) do verbs[v] = true end
          return { namespaced = r.namespaced, kind = r.kind, shortNames = r.shortNames,
                   get = verbs.get, list = verbs.list, patch = verbs.patch }
        end
      end
      return "no virtualmachines"
    end } } },
  { "discovery of the core types a migration may touch", steps = { { "GET", "/api/v1", pick = discovered {
    "namespaces", "configmaps", "secrets", "services", "pods", "persistentvolumeclaims", "persistentvolumes",
    "serviceaccounts" } } } },
  { "discovery of the apps/v1 types a migration may touch", steps = { { "GET", "/apis/apps/v1", pick = discovered {
    "deployments", "statefulsets", "daemonsets", "replicasets" } } } },
  -- the built-in types are stored as sent, without the real server's
  -- defaulting (spec/support/README.md): their labels are compared
  { "merge patch of a PVC's labels", steps = {
    { "PATCH", PVCS .. "/data-0", content_type = MERGE_PATCH, body = '{"metadata":{"labels":{"app":null,"tier":"x"}}}',
      pick = labels_of },
    { "GET", PVCS .. "/data-0", pick = labels_of } } },
  { "JSON patch of a Deployment's labels", steps = {
    { "PATCH", DEPLOYS .. "/web", content_type = JSON_PATCH,
      body = '[{"op":"add","path":"/metadata/labels/apps.cozystack.io~1application.name","value":"web"}]',
      pick = labels_of },
    { "GET", DEPLOYS .. "/web", pick = labels_of } } },
  { "merge patch that removes a namespace's name label", steps = {
    { "PATCH", "/api/v1/namespaces/conf", content_type = MERGE_PATCH,
      body = '{"metadata":{"labels":{"kubernetes.io/metadata.name":null,"tenant":"a"}}}',
      after = "/api/v1/namespaces/conf" } } },
  { "list of Deployments and PVCs with a label selector", steps = {
    { "GET", DEPLOYS .. "?labelSelector=app%3Dweb", pick = names_of },
    { "GET", PVCS .. "?labelSelector=app%3Dweb", pick = names_of } } },
  { "merge patch with an invalid label key", steps = {
    { "PATCH", "/api/v1/namespaces/conf", content_type = MERGE_PATCH,
      body = '{"metadata":{"labels":{"tenant.cozystack.io/tenant-":"a"}}}', pick = labels_of,
      after = "/api/v1/namespaces/conf" } } },
  { "create with an invalid label value", steps = {
    { "POST", NS .. "/configmaps", body = cm("badlabel", {}, { labels = { a = "x-" } }), after = NS .. "/configmaps/badlabel" } } },
  { "create with an invalid annotation key", steps = {
    { "POST", NS .. "/configmaps", body = cm("badnote", {}, { annotations = { ["a/b/c"] = "x" } }) } } },
  { "create with an uppercase annotation prefix", steps = {
    { "POST", NS .. "/configmaps", body = cm("uppernote", {}, { annotations = { ["Example.COM/x"] = "x" } }),
      after = NS .. "/configmaps/uppernote" } } },
  { "discovery of a group that is not served", steps = { { "GET", "/apis/nope.example.com/v1" } } },
  { "custom resource with an unknown field", steps = {
    { "PATCH", VMS .. "/vm1", content_type = MERGE_PATCH, body = '{"spec":{"bogusField":1}}', after = VMS .. "/vm1" } } },
  { "custom resource with an invalid field", steps = {
    { "PATCH", VMS .. "/vm1", content_type = MERGE_PATCH, body = '{"spec":{"runStrategy":5}}', after = VMS .. "/vm1" } } },
}

---------------------------------------------------------------------------
-- Running a case on one server

-- Fills <<continue>> and {rv:name} from the server's current state.
local function expand(text, srv, state)
  return (text:gsub("<<([^>]+)>>", function(key)
    if key == "continue" then return state.continue or "" end
    local what = key:match("^rv:(.+)$")
    local paths = { ["cm-a"] = NS .. "/configmaps/cm-a", ["cm-b"] = NS .. "/configmaps/cm-b", lease = LEASES .. "/held" }
    local res = srv:request("GET", assert(paths[what], key))
    return res.json.metadata.resourceVersion
  end))
end

local function send(srv, step, state, tokens)
  local body = step.body
  if type(body) == "table" then body = json.encode(body) end
  if body then body = expand(body, srv, state) end
  local res = srv:request(step[1], expand(step[2], srv, state), {
    body = body, content_type = step.content_type or (body and "application/json") or nil,
    token = step.as and tokens[step.as] or nil })
  if type(res.json) == "table" and type(res.json.metadata) == "table" then
    state.continue = res.json.metadata.continue
  end
  local a = aspects(res)
  if step.pick and a.object ~= nil then a.object = step.pick(res.json) end
  return a
end

local function run_case(srv, case, tokens)
  local out = {}
  local state = {}
  for i, step in ipairs(case.steps) do
    out[#out + 1] = { label = ("step %d: %s %s"):format(i, step[1], step[2]), aspects = send(srv, step, state, tokens) }
    if step.after then
      out[#out + 1] = { label = ("step %d: then GET %s"):format(i, step.after),
                        aspects = send(srv, { "GET", step.after }, state, tokens) }
    end
  end
  return out
end

---------------------------------------------------------------------------

describe("the fake API server against the real kube-apiserver", function()
  local fake_srv, real_srv
  local tokens = {}

  setup(function()
    fake_srv = fake.start { server = "fake", tls = true, token = "t", fixtures = { FIXTURE } }
    real_srv = fake.start { server = "real", token = "t", fixtures = { FIXTURE } }
    -- the real server's user with no RBAC at all; the fake's is the same
    -- token in allow-list mode with nothing allowed
    local minted = real_srv:control("POST", "/_real/token", json.encode { namespace = "conf", name = "nobody" })
    tokens.real = { nobody = minted.token }
    tokens.fake = {}
  end)
  teardown(function()
    if fake_srv then fake_srv:stop() end
    if real_srv then real_srv:stop() end
  end)

  for _, case in ipairs(CASES) do
    local name = case[1]
    it(name, function()
      fake_srv:reset(FIXTURE)
      real_srv:reset(FIXTURE)
      local minted = real_srv:control("POST", "/_real/token", json.encode { namespace = "conf", name = "nobody" })
      tokens.real.nobody = minted.token
      local uses_nobody = false
      for _, step in ipairs(case.steps) do uses_nobody = uses_nobody or step.as == "nobody" end
      if uses_nobody then fake_srv:allow {} end
      -- on the fake the restricted user is the same token in allow-list mode
      local fake_tokens = setmetatable({}, { __index = function() return "t" end })
      local real_answers = run_case(real_srv, case, tokens.real)
      local fake_answers = run_case(fake_srv, case, fake_tokens)
      if uses_nobody then fake_srv:allow(nil) end

      local known = KNOWN[name] or {}
      local differences = {}
      local unexplained = {}
      for i, r in ipairs(real_answers) do
        local f = fake_answers[i]
        for _, aspect in ipairs { "status", "reason", "message", "details", "object", "text" } do
          local rt, ft = canon(r.aspects[aspect]), canon(f.aspects[aspect])
          if rt ~= ft then
            differences[aspect] = true
            if not known[aspect] then
              unexplained[#unexplained + 1] = ("%s: %s differs\n  real: %s\n  fake: %s"):format(r.label, aspect, rt, ft)
            end
          end
        end
      end
      assert.is_true(#unexplained == 0, table.concat(unexplained, "\n"))
      for aspect in pairs(known) do
        assert.is_true(differences[aspect] == true,
          ("KNOWN lists %q/%s as a difference, but the servers now agree: remove it (and from spec/support/README.md)"):format(name, aspect))
      end
    end)
  end

  it("lists no difference for a case that does not exist", function()
    for name in pairs(KNOWN) do
      local exists = false
      for _, case in ipairs(CASES) do exists = exists or case[1] == name end
      assert.is_true(exists, "KNOWN names no case: " .. name)
    end
  end)
end)
