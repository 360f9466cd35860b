-- Resources by kubectl name (docs/engine-api.md, "Resources by kubectl
-- name"): Client:lookup and ctx.kube:lookup resolve "pvc", "deployments.apps",
-- "widgets.example.com" from discovery at the version the server prefers, as
-- kubectl does (each name is also handed to `kubectl get`, which must list
-- the same resource at the same version); an API the server does not serve is nil and why, a discovery
-- failure raises. Runs on the fake and on the real server (COZY_SPEC_SERVER=real).
local fake = require("spec.helpers").server
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local kube = require "cozy.kube"
local runner = require "cozy.runner"

-- A CRD served at v1beta1 and v1 (v1 preferred), with a short name and a
-- plural, "secrets", that the core group has too.
local function crd(plural, kind, short)
  local function version(name, storage)
    return { name = name, served = true, storage = storage,
             schema = { openAPIV3Schema = { type = "object", ["x-kubernetes-preserve-unknown-fields"] = true } } }
  end
  return {
    apiVersion = "apiextensions.k8s.io/v1", kind = "CustomResourceDefinition",
    metadata = { name = plural .. ".example.com" },
    spec = { group = "example.com", scope = "Namespaced",
             names = { plural = plural, singular = kind:lower(), kind = kind, listKind = kind .. "List",
                       shortNames = short },
             versions = { version("v1beta1", false), version("v1", true) } },
  }
end

local FIXTURE = {
  { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
  crd("widgets", "Widget", { "wdg" }),
  crd("secrets", "Secret", nil),
  -- a plural the engine's own discovery cache once held a list under
  crd("groups", "Group", nil),
}

describe("resources by kubectl name", function()
  local srv, c
  setup(function()
    srv = fake.start { tls = true, token = "t", fixtures = { FIXTURE } }
    local opts = { kubeconfig = srv.kubeconfig }
    for k, v in pairs(harness.CONNECT) do opts[k] = v end
    c = kube.connect(opts)
  end)
  teardown(function() srv:stop() end)

  -- What kubectl resolves `name` to: the api version and plural of the list
  -- `kubectl get NAME -A` sends (its -v=6 log names the URL).
  local function kubectl_pick(name)
    local r = srv:kubectl("get", name, "-A", "-v=6")
    assert(r.ok, r.stderr)
    local path
    for _, req in ipairs(fake.kubectl_requests(r.stderr)) do
      path = path or (req[1] == "GET" and req[2]:match("^/(apis?/[^?]+)%?limit="))
    end
    assert(path, r.stderr)
    local gv, plural = path:match("^apis?/(.+)/([^/]+)$")
    return gv, plural
  end

  local CASES = {
    { "pvc", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true },
    { "PersistentVolumeClaims", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true },
    { "persistentvolumeclaim", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true },
    { "namespaces", "v1", "namespaces", "Namespace", false },
    { "ns", "v1", "namespaces", "Namespace", false },
    { "pods", "v1", "pods", "Pod", true },
    { "po", "v1", "pods", "Pod", true },
    { "svc", "v1", "services", "Service", true },
    { "deploy", "apps/v1", "deployments", "Deployment", true },
    { "deployments.apps", "apps/v1", "deployments", "Deployment", true },
    { "deployments.v1.apps", "apps/v1", "deployments", "Deployment", true },
    { "Deployment", "apps/v1", "deployments", "Deployment", true },
    { "sts", "apps/v1", "statefulsets", "StatefulSet", true },
    { "ds", "apps/v1", "daemonsets", "DaemonSet", true },
    { "widgets.example.com", "example.com/v1", "widgets", "Widget", true },
    { "wdg", "example.com/v1", "widgets", "Widget", true },
    { "widgets.v1beta1.example.com", "example.com/v1beta1", "widgets", "Widget", true },
    { "secrets", "v1", "secrets", "Secret", true },          -- the core group first
    { "secrets.example.com", "example.com/v1", "secrets", "Secret", true },
  }

  for _, case in ipairs(CASES) do
    local name, api_version, plural, kind, namespaced = table.unpack(case)
    it(("takes %q for %s %s, as kubectl does"):format(name, api_version, plural), function()
      local res, about = c:lookup(name)
      assert.is_table(res, tostring(about))
      assert.equal(api_version, res.api_version)
      assert.equal(plural, res.plural)
      assert.equal(namespaced, res.namespaced)
      assert.equal(kind, about.kind)
      assert.equal(api_version, (about.group == "" and "" or about.group .. "/") .. about.version)
      local kubectl_gv, kubectl_plural = kubectl_pick(name)
      assert.equal(api_version, kubectl_gv)
      assert.equal(plural, kubectl_plural)
    end)
  end

  it("answers nil and why for what the server does not serve, sending nothing more the second time", function()
    local cases = {
      { "backups.velero.io", 'API group "velero.io" is not served' },
      { "gadgets.example.com", 'API group "example.com" serves no resource "gadgets"' },
      { "widgets.v2.example.com", 'API group "example.com" serves no resource "widgets" at version v2' },
      { "nosuchthing", 'no resource named "nosuchthing" is served' },
      -- kubectl expands short names as the server spells them: "PVC" is no resource to it either
      { "PVC", 'no resource named "PVC" is served' },
    }
    for _, case in ipairs(cases) do
      local res, why = c:lookup(case[1])
      assert.is_nil(res)
      assert.equal(case[2], why)
    end
    local before = c.stats.requests
    for _, case in ipairs(cases) do assert.equal(case[2], select(2, c:lookup(case[1]))) end
    assert.is_truthy(c:lookup("pvc"))
    assert.equal(before, c.stats.requests)
  end)

  it("takes a resource named as the discovery cache's own lists are (\"groups\")", function()
    assert.is_truthy(c:lookup("pvc"))                 -- the group list is cached by now
    local res = c:lookup("groups")
    assert.is_table(res)
    assert.equal("example.com/v1", res.api_version)
    assert.equal("groups", res.plural)
  end)

  -- What `kubectl api-resources --api-group GROUP -o wide` lists: NAME and
  -- APIVERSION of each resource.
  local function kubectl_api_resources(group)
    local r = srv:kubectl("api-resources", "--api-group=" .. group, "--no-headers", "-o", "wide")
    assert(r.ok, r.stderr)
    local out = {}
    for line in r.stdout:gmatch("[^\n]+") do
      local name = line:match("^(%S+)")
      local api_version = line:match("%s(%S+/v[%w]+)%s") or line:match("%s(v%d[%w]*)%s")
      out[#out + 1] = name .. " " .. tostring(api_version)
    end
    table.sort(out)
    return out
  end

  for _, group in ipairs { "example.com", "apps", "" } do
    it(("lists the resources of API group %q as kubectl api-resources does"):format(group), function()
      local list = assert(c:api_resources(group))
      local ours = {}
      for i, r in ipairs(list) do ours[i] = r.plural .. " " .. r.api_version end
      table.sort(ours)
      assert.same(kubectl_api_resources(group), ours)
      for _, r in ipairs(list) do
        assert.equal(group, r.group)
        assert.is_boolean(r.namespaced)
        assert.is_string(r.kind)
      end
    end)
  end

  it("answers nil and why for an API group the server does not serve, and refuses what is no group", function()
    local list, why = c:api_resources("velero.io")
    assert.is_nil(list)
    assert.equal('API group "velero.io" is not served', why)
    assert.has_error(function() c:api_resources("apps/v1") end,
      'api_resources(group): group must be an API group ("apps", "" for the core group), not "apps/v1"')
  end)

  it("refuses a name kubectl would not take", function()
    assert.has_error(function() c:lookup("") end,
      'lookup(name): name must be a resource as kubectl names it ("pvc", "deployments.apps"), not ""')
    assert.has_error(function() c:lookup("pods/status") end,
      'lookup(name): name must be a resource as kubectl names it ("pvc", "deployments.apps"), not "pods/status"')
    assert.has_error(function() c:lookup(nil) end,
      'lookup(name): name must be a resource as kubectl names it ("pvc", "deployments.apps"), not a nil')
  end)

  it("raises a discovery failure instead of reading it as an absent API #fakeonly", function()
    local opts = { kubeconfig = srv.kubeconfig }
    for k, v in pairs(harness.CONNECT) do opts[k] = v end
    local fresh = kube.connect(opts)
    srv:faults { { method = "GET", path = "^/apis$", times = -1, status = { code = 500 } } }
    local ok, err = pcall(fresh.lookup, fresh, "backups.velero.io")
    srv:clear_faults()
    assert.is_false(ok)
    assert.equal(500, err.code)
    assert.is_true(#srv:fired { path = "^/apis$" } > 0)
  end)

  it("is ctx.kube:lookup and :api_resources in a migration: a resource of ctx.kube, copies of discovery", function()
    local dir = cli.migration_dir { ["1-probe.lua"] = [[
      return { description = "probe",
        permissions = { { verb = "list", group = "example.com", resource = "widgets" } },
        run = function(ctx)
          local widgets, about = ctx.kube:lookup("wdg")
          assert(widgets.api_version == "example.com/v1" and widgets.kind == "Widget")
          assert(#widgets:list{}:collect() == 0)
          about.plural = "changed"                      -- a copy: the next answer is intact
          local _, again = ctx.kube:lookup("wdg")
          assert(again.plural == "widgets")
          local sealed, err = pcall(function() widgets.plural = "x" end)
          assert(not sealed and err:find("a resource of ctx.kube is read-only", 1, true), err)
          local none, why = ctx.kube:lookup("backups.velero.io")
          assert(none == nil and why == 'API group "velero.io" is not served')
          local listed = ctx.kube:api_resources("example.com")   -- plain copies
          assert(#listed == 3 and listed[1].plural == "groups" and listed[3].api_version == "example.com/v1")
          listed[1].plural = "changed"
          assert(ctx.kube:api_resources("example.com")[1].plural == "groups")
          ctx:outcome { looked_up = true }
        end }
    ]] }
    local m = runner.load_file(dir .. "/1-probe.lua")
    files.rm_rf(dir)
    local res = runner.run_migration(m, { kubeconfig = srv.kubeconfig, mode = "run", log = harness.capture_log().log })
    assert.is_true(res.outcome.counts.looked_up)
  end)
end)
