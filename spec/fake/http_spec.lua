-- The kubectl cases again, at the HTTP level: exact status codes and Status bodies
-- as kube-apiserver writes them.
local fake = require("spec.helpers").server

local BASIC = "spec/fixtures/fake/basic.json"
local KUBEVIRT = "spec/fixtures/fake/kubevirt.json"
local CM = "/api/v1/namespaces/default/configmaps"
local VM = "/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachines"

local function status(code, reason, message, details)
  return { kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure",
           message = message, reason = reason, details = details, code = code }
end

local CONFLICT = "the object has been modified; please apply your changes to the latest version and try again"

describe("fake API server over HTTP", function()
  local srv

  setup(function()
    srv = fake.start{ fixtures = { BASIC, KUBEVIRT }, tls = true, token = "http-secret" }
  end)

  teardown(function()
    if srv then srv:stop() end
  end)

  before_each(function()
    srv:reset{ BASIC, KUBEVIRT }
  end)

  local function expect(res, code, body)
    assert.equal(code, res.status, res.body)
    assert.equal("application/json", res.headers["content-type"])
    if body then assert.same(body, res.json) end
    return res.json
  end

  describe("get", function()
    it("returns the stored object", function()
      local cm = expect(srv:request("GET", CM .. "/cm-a"), 200)
      assert.equal("v1", cm.apiVersion)
      assert.equal("ConfigMap", cm.kind)
      assert.equal("cm-a", cm.metadata.name)
      assert.equal("default", cm.metadata.namespace)
      assert.is_string(cm.metadata.uid)
      assert.truthy(cm.metadata.creationTimestamp:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"))
      assert.truthy(cm.metadata.resourceVersion:match("^%d+$"))
    end)

    it("answers NotFound with details.name for a missing object", function()
      expect(srv:request("GET", CM .. "/nope"), 404,
        status(404, "NotFound", 'configmaps "nope" not found', { name = "nope", kind = "configmaps" }))
      expect(srv:request("GET", VM .. "/vm9"), 404,
        status(404, "NotFound", 'virtualmachines.kubevirt.io "vm9" not found',
          { name = "vm9", group = "kubevirt.io", kind = "virtualmachines" }))
    end)

    it("answers kube-apiserver's plain-text 404 when no CRD serves the group", function()
      srv:reset(BASIC)
      for _, path in ipairs{ VM .. "/vm1", VM, "/apis/kubevirt.io/v1", "/apis/kubevirt.io" } do
        local res = srv:request("GET", path)
        assert.equal(404, res.status, res.body)
        assert.equal("text/plain; charset=utf-8", res.headers["content-type"])
        assert.equal("404 page not found\n", res.body)
      end
    end)

    it("answers NotFound without details.name for a resource a built-in group does not serve", function()
      local body = expect(srv:request("GET", "/apis/coordination.k8s.io/v1/namespaces/default/nopes"), 404,
        status(404, "NotFound", "the server could not find the requested resource", {}))
      assert.is_nil(body.details.name)
    end)

    it("serves every served version of a CRD and marks the preferred one", function()
      local vm = expect(srv:request("GET", "/apis/kubevirt.io/v1alpha3/namespaces/tenant-a/virtualmachines/vm1"), 200)
      assert.equal("kubevirt.io/v1alpha3", vm.apiVersion)
      local group = expect(srv:request("GET", "/apis/kubevirt.io"), 200)
      assert.equal("kubevirt.io/v1", group.preferredVersion.groupVersion)
      local rl = expect(srv:request("GET", "/apis/kubevirt.io/v1"), 200)
      local names = {}
      for _, r in ipairs(rl.resources) do names[r.name] = r end
      assert.same({ "vm", "vms" }, names.virtualmachines.shortNames)
      assert.same({ "all" }, names.virtualmachines.categories)
      assert.is_true(names.virtualmachines.namespaced)
      assert.same({ "get", "patch", "update" }, names["virtualmachines/status"].verbs)
      assert.same({ "vmi", "vmis" }, names.virtualmachineinstances.shortNames)
    end)
  end)

  describe("create", function()
    it("answers 201 with uid, creationTimestamp and a new resourceVersion", function()
      local before = srv:request("GET", CM).json.metadata.resourceVersion
      local cm = expect(srv:request("POST", CM, { body = '{"apiVersion":"v1","kind":"ConfigMap",'
        .. '"metadata":{"name":"new","uid":"client-made","resourceVersion":"7"},"data":{"x":"1"}}' }), 201)
      assert.equal(tostring(tonumber(before) + 1), cm.metadata.resourceVersion)
      assert.not_equal("client-made", cm.metadata.uid)
      assert.is_nil(cm.metadata.generation)     -- configmaps have none, as on a real server
      assert.same({ x = "1" }, srv:object("ConfigMap", "default", "new").data)
    end)

    it("answers AlreadyExists (409) for an existing name", function()
      expect(srv:request("POST", CM, { body = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cm-a" } } }),
        409, status(409, "AlreadyExists", 'configmaps "cm-a" already exists', { name = "cm-a", kind = "configmaps" }))
    end)

    it("answers NotFound for the namespace when it does not exist", function()
      expect(srv:request("POST", "/api/v1/namespaces/ghost/configmaps",
          { body = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "x" } } }),
        404, status(404, "NotFound", 'namespaces "ghost" not found', { name = "ghost", kind = "namespaces" }))
    end)

    it("answers BadRequest (400) for a malformed body", function()
      local body = expect(srv:request("POST", CM, { body = '{"metadata": {"name": ' }), 400)
      assert.equal("BadRequest", body.reason)
      assert.equal("Failure", body.status)
      assert.equal(400, body.code)
    end)

    it("answers Invalid (422) without a name", function()
      local body = expect(srv:request("POST", CM, { body = { apiVersion = "v1", kind = "ConfigMap", metadata = { labels = { a = "b" } } } }), 422)
      assert.equal("Invalid", body.reason)
      assert.equal('ConfigMap "" is invalid: metadata.name: Required value: name or generateName is required', body.message)
      assert.equal("metadata.name", body.details.causes[1].field)
    end)
  end)

  describe("update (PUT)", function()
    it("answers Conflict with the real message for a stale resourceVersion", function()
      local cm = srv:request("GET", CM .. "/cm-a").json
      local current = cm.metadata.resourceVersion
      cm.metadata.resourceVersion = tostring(tonumber(current) - 1)
      cm.data.k = "changed"
      expect(srv:request("PUT", CM .. "/cm-a", { body = cm }), 409,
        status(409, "Conflict", 'Operation cannot be fulfilled on configmaps "cm-a": ' .. CONFLICT,
          { name = "cm-a", kind = "configmaps" }))
      cm.metadata.resourceVersion = current
      local updated = expect(srv:request("PUT", CM .. "/cm-a", { body = cm }), 200)
      assert.equal("changed", updated.data.k)
      assert.is_true(tonumber(updated.metadata.resourceVersion) > tonumber(current))
    end)

    it("qualifies the resource with its group in a custom resource's Conflict", function()
      local vm = srv:request("GET", VM .. "/vm1").json
      vm.metadata.resourceVersion = "1"
      expect(srv:request("PUT", VM .. "/vm1", { body = vm }), 409,
        status(409, "Conflict", 'Operation cannot be fulfilled on virtualmachines.kubevirt.io "vm1": ' .. CONFLICT,
          { name = "vm1", group = "kubevirt.io", kind = "virtualmachines" }))
    end)

    it("requires a resourceVersion to update a custom resource, as CRD strategies do", function()
      local vm = srv:request("GET", VM .. "/vm1").json
      vm.metadata.resourceVersion = nil
      local body = expect(srv:request("PUT", VM .. "/vm1", { body = vm }), 422)
      assert.equal("Invalid", body.reason)
      assert.truthy(body.message:find("metadata.resourceVersion: Invalid value: 0x0: must be specified for an update", 1, true))
    end)

    it("answers NotFound for a missing object", function()
      expect(srv:request("PUT", CM .. "/nope", { body = { metadata = { name = "nope" } } }), 404,
        status(404, "NotFound", 'configmaps "nope" not found', { name = "nope", kind = "configmaps" }))
    end)
  end)

  describe("patch", function()
    it("answers Invalid (422) with kube-apiserver's generic body when a JSON-patch test fails", function()
      local before = srv:object("ConfigMap", "default", "cm-a")
      expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "application/json-patch+json",
          body = '[{"op":"test","path":"/data/k","value":"2"},{"op":"replace","path":"/data/k","value":"x"}]' }),
        422, status(422, "Invalid", "the server rejected our request due to an error in our request", {}))
      -- a path that does not exist fails the same way
      expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "application/json-patch+json",
          body = '[{"op":"remove","path":"/metadata/labels/absent"}]' }),
        422, status(422, "Invalid", "the server rejected our request due to an error in our request", {}))
      assert.same(before, srv:object("ConfigMap", "default", "cm-a"))
    end)

    it("applies RFC 6902 operations", function()
      local cm = expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "application/json-patch+json",
        body = '[{"op":"test","path":"/data/k","value":"1"},{"op":"add","path":"/data/n","value":"2"},'
          .. '{"op":"remove","path":"/metadata/labels/tier"},{"op":"copy","from":"/data/k","path":"/data/c"}]' }), 200)
      assert.same({ k = "1", n = "2", c = "1" }, cm.data)
      assert.same({ app = "a" }, cm.metadata.labels)
    end)

    it("answers Conflict for a merge patch carrying a stale resourceVersion", function()
      local before = srv:object("ConfigMap", "default", "cm-a")
      expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "application/merge-patch+json",
          body = '{"metadata":{"resourceVersion":"1"},"data":{"k":"x"}}' }),
        409, status(409, "Conflict", 'Operation cannot be fulfilled on configmaps "cm-a": ' .. CONFLICT,
          { name = "cm-a", kind = "configmaps" }))
      assert.same(before, srv:object("ConfigMap", "default", "cm-a"))
    end)

    it("follows RFC 7386: null deletes, objects merge, arrays replace", function()
      local vm = expect(srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
        body = '{"metadata":{"labels":{"app":null,"new":"1"}},"spec":{"template":{"spec":{"volumes":[]}}}}' }), 200)
      assert.same({ new = "1" }, vm.metadata.labels)
      assert.equal("Always", vm.spec.runStrategy)
      assert.equal(0, #vm.spec.template.spec.volumes)
      local raw = srv:request("GET", VM .. "/vm1").body
      assert.truthy(raw:find('"volumes":[]', 1, true))
    end)

    it("answers 415 for an unknown patch type and for strategic merge on a custom resource", function()
      local body = expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "text/plain", body = "{}" }), 415)
      assert.equal("UnsupportedMediaType", body.reason)
      body = expect(srv:request("PATCH", VM .. "/vm1", { content_type = "application/strategic-merge-patch+json",
        body = "{}" }), 415)
      assert.equal("UnsupportedMediaType", body.reason)
    end)

    it("answers BadRequest for a malformed patch", function()
      local body = expect(srv:request("PATCH", CM .. "/cm-a", { content_type = "application/merge-patch+json",
        body = "{not json" }), 400)
      assert.equal("BadRequest", body.reason)
    end)
  end)

  describe("delete", function()
    it("answers a Success Status and removes an object without finalizers", function()
      local uid = srv:object("ConfigMap", "default", "cm-a").metadata.uid
      expect(srv:request("DELETE", CM .. "/cm-a", { body = '{"propagationPolicy":"Background"}' }), 200,
        { kind = "Status", apiVersion = "v1", metadata = {}, status = "Success",
          details = { name = "cm-a", kind = "configmaps", uid = uid } })
      assert.is_nil(srv:object("ConfigMap", "default", "cm-a"))
      expect(srv:request("DELETE", CM .. "/cm-a"), 404,
        status(404, "NotFound", 'configmaps "cm-a" not found', { name = "cm-a", kind = "configmaps" }))
    end)

    it("keeps an object with finalizers, terminating, until a write empties them", function()
      local vm = expect(srv:request("DELETE", VM .. "/vm1"), 200)
      assert.equal("VirtualMachine", vm.kind)
      assert.is_string(vm.metadata.deletionTimestamp)
      local still = expect(srv:request("GET", VM .. "/vm1"), 200)
      assert.equal(vm.metadata.deletionTimestamp, still.metadata.deletionTimestamp)
      assert.equal(vm.metadata.resourceVersion, still.metadata.resourceVersion)
      -- deleting again changes nothing
      assert.same(still, expect(srv:request("DELETE", VM .. "/vm1"), 200))
      -- a write that keeps a finalizer keeps the object
      expect(srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
        body = '{"metadata":{"labels":{"x":"y"}}}' }), 200)
      assert.is_not_nil(srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1"))
      expect(srv:request("PATCH", VM .. "/vm1", { content_type = "application/json-patch+json",
        body = '[{"op":"replace","path":"/metadata/finalizers","value":[]}]' }), 200)
      assert.is_nil(srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1"))
      expect(srv:request("GET", VM .. "/vm1"), 404)
    end)

    it("checks DeleteOptions preconditions", function()
      local body = expect(srv:request("DELETE", CM .. "/cm-a",
        { body = '{"preconditions":{"resourceVersion":"1"}}' }), 409)
      assert.equal("Conflict", body.reason)
      assert.is_not_nil(srv:object("ConfigMap", "default", "cm-a"))
    end)
  end)

  describe("authentication", function()
    it("answers 401 without the bearer token or with a wrong one", function()
      local unauthorized = { kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure",
                             message = "Unauthorized", reason = "Unauthorized", code = 401 }
      expect(srv:request("GET", CM, { token = false }), 401, unauthorized)
      expect(srv:request("GET", CM, { token = "wrong" }), 401, unauthorized)
      expect(srv:request("GET", "/api", { token = false }), 401, unauthorized)
      expect(srv:request("GET", CM, { token = "http-secret" }), 200)
    end)

    it("needs no token on the control endpoints", function()
      assert.equal(200, srv:request("GET", "/_fake/objects", { token = false }).status)
      assert.equal(200, srv:request("GET", "/_fake/requests", { token = false }).status)
    end)
  end)

  describe("discovery", function()
    it("serves /version, /api, /apis and resource lists", function()
      local v = expect(srv:request("GET", "/version"), 200)
      assert.equal("1", v.major)
      assert.equal("32", v.minor)
      local api = expect(srv:request("GET", "/api"), 200)
      assert.same({ "v1" }, api.versions)
      local apis = expect(srv:request("GET", "/apis"), 200)
      assert.equal("APIGroupList", apis.kind)
      local groups = {}
      for _, g in ipairs(apis.groups) do groups[g.name] = g end
      for _, g in ipairs{ "coordination.k8s.io", "apiextensions.k8s.io", "authorization.k8s.io", "kubevirt.io" } do
        assert.is_not_nil(groups[g], g)
      end
      local core = expect(srv:request("GET", "/api/v1"), 200)
      local cm
      for _, r in ipairs(core.resources) do if r.name == "configmaps" then cm = r end end
      assert.same({ "cm" }, cm.shortNames)
      assert.equal("ConfigMap", cm.kind)
    end)

    it("serves a minimal OpenAPI v3 index and 404 for OpenAPI v2", function()
      local index = expect(srv:request("GET", "/openapi/v3"), 200)
      assert.truthy(index.paths["api/v1"].serverRelativeURL:match("^/openapi/v3/api/v1%?hash="))
      local doc = expect(srv:request("GET", index.paths["apis/kubevirt.io/v1"].serverRelativeURL), 200)
      local op = doc.paths["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}"].patch
      assert.same({ group = "kubevirt.io", version = "v1", kind = "VirtualMachine" }, op["x-kubernetes-group-version-kind"])
      assert.equal(404, srv:request("GET", "/openapi/v2").status)
    end)
  end)
end)
