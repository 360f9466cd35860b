-- API semantics the engine relies on: selectors, pagination and its expiry, dry run,
-- resourceVersion/generation bookkeeping, the status subresource, access reviews.
local fake = require("spec.helpers").server
local json = require "cozy.json"

local BASIC = "spec/fixtures/fake/basic.json"
local KUBEVIRT = "spec/fixtures/fake/kubevirt.json"
local CM = "/api/v1/namespaces/default/configmaps"
local VM = "/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachines"

local function names(list)
  local out = {}
  for i, item in ipairs(list.items) do out[i] = item.metadata.name end
  return out
end

local function rv(o)
  return tonumber(o.metadata.resourceVersion)
end

describe("fake API server semantics", function()
  local srv

  setup(function()
    srv = fake.start{ fixtures = { BASIC, KUBEVIRT } }   -- plain HTTP, no token
  end)

  teardown(function()
    if srv then srv:stop() end
  end)

  before_each(function()
    srv:reset{ BASIC, KUBEVIRT }
  end)

  local function get(path)
    local res = srv:request("GET", path)
    assert.equal(200, res.status, res.body)
    return res.json
  end

  local function send(method, path, body, content_type, want)
    local res = srv:request(method, path, { body = body, content_type = content_type })
    assert.equal(want or (method == "POST" and 201 or 200), res.status, res.body)
    return res.json
  end

  describe("labelSelector", function()
    local cases = {
      { "app=a", { "cm-a" } },
      { "app==b", { "cm-b" } },
      { "tier!=web", { "cm-c", "cm-d", "cm-e" } },
      { "tier", { "cm-a", "cm-b", "cm-c" } },
      { "!tier", { "cm-d", "cm-e" } },
      { "tier=web,app!=a", { "cm-b" } },
      { "app in (a,c),tier", { "cm-a", "cm-c" } },
      { "app notin (a,c)", { "cm-b", "cm-d", "cm-e" } },
    }
    for _, case in ipairs(cases) do
      it("selects " .. case[1], function()
        local list = get(CM .. "?labelSelector=" .. case[1]:gsub(" ", "%%20"):gsub("!", "%%21"):gsub("=", "%%3D"))
        assert.same(case[2], names(list))
      end)
    end

    it("works across all namespaces", function()
      local list = get("/api/v1/configmaps?labelSelector=platform.cozystack.io%2Fno-delete%3Dtrue")
      assert.same({ "cozystack-version" }, names(list))
      assert.equal("cozy-system", list.items[1].metadata.namespace)
    end)

    it("supports metadata.name field selectors", function()
      assert.same({ "cm-c" }, names(get(CM .. "?fieldSelector=metadata.name%3Dcm-c")))
      local res = srv:request("GET", CM .. "?fieldSelector=data.k%3D1")
      assert.equal(400, res.status)
      assert.equal("field label not supported: data.k", res.json.message)
    end)
  end)

  describe("lists", function()
    it("are typed lists with the current resourceVersion, items without kind", function()
      local list = get(CM)
      assert.equal("ConfigMapList", list.kind)
      assert.equal("v1", list.apiVersion)
      assert.equal(tostring(srv:control("GET", "/_fake/objects").metadata.resourceVersion), list.metadata.resourceVersion)
      assert.is_nil(list.items[1].kind)
      local vms = get(VM)
      assert.equal("VirtualMachineList", vms.kind)
      assert.equal("VirtualMachine", vms.items[1].kind)   -- custom resources keep them
    end)

    it("of custom resources show each object as stored now, in the version asked, after every write", function()
      local before = get(VM).items[1]
      local res = srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
        body = '{"metadata":{"labels":{"seen":"1"}}}' })
      assert.equal(200, res.status, res.body)
      local after = get(VM).items[1]
      assert.equal("1", after.metadata.labels.seen)
      assert.is_true(rv(after) > rv(before))
      local old = get("/apis/kubevirt.io/v1alpha3/namespaces/tenant-a/virtualmachines").items[1]
      assert.equal("kubevirt.io/v1alpha3", old.apiVersion)
      assert.equal("1", old.metadata.labels.seen)
      assert.equal("kubevirt.io/v1", get(VM).items[1].apiVersion)
    end)

    it("paginate with limit, continue and remainingItemCount", function()
      local p1 = get(CM .. "?limit=2")
      assert.same({ "cm-a", "cm-b" }, names(p1))
      assert.equal(3, p1.metadata.remainingItemCount)
      assert.is_string(p1.metadata.continue)
      local p2 = get(CM .. "?limit=2&continue=" .. p1.metadata.continue)
      assert.same({ "cm-c", "cm-d" }, names(p2))
      assert.equal(1, p2.metadata.remainingItemCount)
      assert.equal(p1.metadata.resourceVersion, p2.metadata.resourceVersion)
      local p3 = get(CM .. "?limit=2&continue=" .. p2.metadata.continue)
      assert.same({ "cm-e" }, names(p3))
      assert.is_nil(p3.metadata.continue)
      assert.is_nil(p3.metadata.remainingItemCount)
    end)

    it("serve continued pages from the first page's snapshot, as etcd does", function()
      local p1 = get(CM .. "?limit=2")
      send("PATCH", CM .. "/cm-c", '{"data":{"k":"changed"}}', "application/merge-patch+json")
      send("DELETE", CM .. "/cm-d")
      send("POST", CM, { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cm-f" } })
      local p2 = get(CM .. "?limit=2&continue=" .. p1.metadata.continue)
      assert.same({ "cm-c", "cm-d" }, names(p2))
      assert.equal("3", p2.items[1].data.k)
      local p3 = get(CM .. "?limit=2&continue=" .. p2.metadata.continue)
      assert.same({ "cm-e" }, names(p3))
      assert.equal(p1.metadata.resourceVersion, p3.metadata.resourceVersion)
      -- a new list sees the changes
      assert.same({ "cm-a", "cm-b", "cm-c", "cm-e", "cm-f" }, names(get(CM)))
    end)

    it("keep a snapshot's objects as they were when a JSON patch changes them afterwards", function()
      local p1 = get(CM .. "?limit=2")
      local c = get(CM .. "/cm-c")
      -- object keys only: applied to a copy that shares what the patch leaves alone
      send("PATCH", CM .. "/cm-c", json.encode { { op = "test", path = "/metadata/resourceVersion", value = c.metadata.resourceVersion },
        { op = "add", path = "/data/new", value = "x" }, { op = "replace", path = "/data/k", value = "changed" },
        { op = "add", path = "/metadata/labels/added", value = "yes" }, { op = "remove", path = "/metadata/labels/app" } },
        "application/json-patch+json")
      local p2 = get(CM .. "?limit=2&continue=" .. p1.metadata.continue)
      assert.same({ "cm-c", "cm-d" }, names(p2))
      assert.same(c.data, p2.items[1].data)
      assert.same(c.metadata.labels, p2.items[1].metadata.labels)
      local now = get(CM .. "/cm-c")
      assert.same({ k = "changed", new = "x" }, now.data)
      local labels = c.metadata.labels
      labels.app, labels.added = nil, "yes"
      assert.same(labels, now.metadata.labels)
    end)

    it("apply a JSON patch whose array indices shift as it goes, and keep a snapshot's object intact", function()
      local volumes = { { name = "root", dataVolume = { name = "vm2-root" } }, { name = "data", dataVolume = { name = "vm2-data" } } }
      send("POST", VM, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", metadata = { name = "vm2", namespace = "tenant-a" },
        spec = { template = { spec = { volumes = volumes } } } })
      local p1 = get(VM .. "?limit=1")
      assert.same({ "vm1" }, names(p1))
      local path = "/spec/template/spec/volumes"
      -- the replace names the element the remove moved up: the old second one
      send("PATCH", VM .. "/vm2", json.encode { { op = "remove", path = path .. "/0" },
        { op = "replace", path = path .. "/0/name", value = "renamed" } }, "application/json-patch+json")
      assert.same({ { name = "renamed", dataVolume = { name = "vm2-data" } } }, get(VM .. "/vm2").spec.template.spec.volumes)
      local p2 = get(VM .. "?limit=1&continue=" .. p1.metadata.continue)
      assert.same({ "vm2" }, names(p2))
      assert.same(volumes, p2.items[1].spec.template.spec.volumes)
    end)

    it("omit remainingItemCount when a selector filters", function()
      local p1 = get(CM .. "?limit=1&labelSelector=tier")
      assert.same({ "cm-a" }, names(p1))
      assert.is_string(p1.metadata.continue)
      assert.is_nil(p1.metadata.remainingItemCount)
      local p2 = get(CM .. "?limit=1&labelSelector=tier&continue=" .. p1.metadata.continue)
      assert.same({ "cm-b" }, names(p2))
    end)

    it("answer 410 Expired for a continue token older than a compaction", function()
      local p1 = get(CM .. "?limit=2")
      srv:compact()
      local res = srv:request("GET", CM .. "?limit=2&continue=" .. p1.metadata.continue)
      assert.equal(410, res.status)
      assert.equal("Expired", res.json.reason)
      assert.equal("Failure", res.json.status)
      assert.equal(410, res.json.code)
      assert.truthy(res.json.message:match("^The provided continue parameter is too old"))
      -- a fresh list works again
      assert.same({ "cm-a", "cm-b" }, names(get(CM .. "?limit=2")))
    end)

    it("answer 400 for a malformed continue token", function()
      local res = srv:request("GET", CM .. "?limit=2&continue=garbage")
      assert.equal(400, res.status)
      assert.equal("BadRequest", res.json.reason)
    end)
  end)

  describe("dryRun=All", function()
    it("answers every write as if done, and persists nothing", function()
      local before = srv:control("GET", "/_fake/objects")
      local created = send("POST", CM .. "?dryRun=All", { apiVersion = "v1", kind = "ConfigMap",
        metadata = { name = "dry" }, data = { a = "b" } })
      assert.equal("dry", created.metadata.name)
      assert.is_string(created.metadata.uid)
      local cm = get(CM .. "/cm-a")
      cm.data.k = "put"
      assert.equal("put", send("PUT", CM .. "/cm-a?dryRun=All", cm).data.k)
      assert.equal("merge", send("PATCH", CM .. "/cm-a?dryRun=All", '{"data":{"k":"merge"}}',
        "application/merge-patch+json").data.k)
      assert.equal("json", send("PATCH", CM .. "/cm-a?dryRun=All", '[{"op":"replace","path":"/data/k","value":"json"}]',
        "application/json-patch+json").data.k)
      assert.equal("Success", send("DELETE", CM .. "/cm-b?dryRun=All").status)
      assert.is_string(send("DELETE", VM .. "/vm1?dryRun=All").metadata.deletionTimestamp)
      -- validation still runs
      local res = srv:request("POST", CM .. "?dryRun=All", { body = { apiVersion = "v1", kind = "ConfigMap",
        metadata = { name = "cm-a" } } })
      assert.equal(409, res.status)
      res = srv:request("PATCH", CM .. "/cm-a?dryRun=All", { content_type = "application/merge-patch+json",
        body = '{"metadata":{"resourceVersion":"1"}}' })
      assert.equal(409, res.status)
      assert.same(before, srv:control("GET", "/_fake/objects"))
    end)
  end)

  describe("bookkeeping", function()
    it("bumps one global resourceVersion on every write, across resources", function()
      local last = tonumber(srv:control("GET", "/_fake/objects").metadata.resourceVersion)
      local function step(o)
        assert.equal(last + 1, rv(o))
        last = rv(o)
      end
      step(send("POST", CM, { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "n1" } }))
      step(send("PATCH", VM .. "/vm1", '{"metadata":{"labels":{"a":"b"}}}', "application/merge-patch+json"))
      step(send("POST", "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases",
        { apiVersion = "coordination.k8s.io/v1", kind = "Lease", metadata = { name = "l" },
          spec = { holderIdentity = "me", leaseDurationSeconds = 15 } }))
      send("DELETE", CM .. "/n1")
      last = last + 1
      assert.equal(tostring(last), get(CM).metadata.resourceVersion)
    end)

    it("does not write, nor bump, for a patch that changes nothing", function()
      local before = get(CM .. "/cm-a")
      local after = send("PATCH", CM .. "/cm-a", '{"data":{"k":"1"}}', "application/merge-patch+json")
      assert.equal(before.metadata.resourceVersion, after.metadata.resourceVersion)
    end)

    it("starts generation at 1 and bumps it on spec changes only", function()
      local vm = send("POST", VM, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
        metadata = { name = "vm2", generation = 9 }, spec = { runStrategy = "Halted" },
        status = { printableStatus = "Stopped" } })
      assert.equal(1, vm.metadata.generation)
      assert.is_nil(vm.status)     -- status is dropped on create with a status subresource
      vm = send("PATCH", VM .. "/vm2", '{"metadata":{"labels":{"a":"b"}}}', "application/merge-patch+json")
      assert.equal(1, vm.metadata.generation)
      vm = send("PATCH", VM .. "/vm2", '{"spec":{"runStrategy":"Always"}}', "application/merge-patch+json")
      assert.equal(2, vm.metadata.generation)
      vm.spec.runStrategy = "Manual"
      vm = send("PUT", VM .. "/vm2", vm)
      assert.equal(3, vm.metadata.generation)
    end)

    it("ignores status in main-resource writes and only writes status through /status", function()
      local before = get(VM .. "/vm1")
      local vm = send("PATCH", VM .. "/vm1", '{"status":{"ready":false}}', "application/merge-patch+json")
      assert.is_true(vm.status.ready)
      assert.equal(before.metadata.resourceVersion, vm.metadata.resourceVersion)   -- a no-op
      vm = send("PATCH", VM .. "/vm1/status", '{"status":{"ready":false},"spec":{"runStrategy":"Halted"},'
        .. '"metadata":{"labels":{"sneaky":"1"}}}', "application/merge-patch+json")
      assert.is_false(vm.status.ready)
      assert.equal("Always", vm.spec.runStrategy)
      assert.same(before.metadata.labels, vm.metadata.labels)
      assert.equal(before.metadata.generation, vm.metadata.generation)
      assert.is_true(rv(vm) > rv(before))
      vm.status.printableStatus = "Stopped"
      vm = send("PUT", VM .. "/vm1/status", vm)
      assert.equal("Stopped", vm.status.printableStatus)
      local stored = srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1")
      assert.is_false(stored.status.ready)
      assert.equal("Stopped", stored.status.printableStatus)
      -- configmaps have no status subresource
      assert.equal(404, srv:request("GET", CM .. "/cm-a/status").status)
    end)

    it("makes a CRD created at run time servable, and its removal unservable", function()
      local list = fake.json.decode(io.open(KUBEVIRT):read("a"))
      srv:reset(BASIC)
      assert.equal(404, srv:request("GET", VM).status)
      local crd = send("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", list.items[2])
      assert.equal(1, crd.metadata.generation)
      assert.equal(0, #get(VM).items)
      assert.same({ "vm", "vms" }, crd.status.acceptedNames.shortNames)
      send("POST", "/api/v1/namespaces", list.items[1])
      send("POST", VM, list.items[4])
      assert.equal(1, #get(VM).items)
      send("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/virtualmachines.kubevirt.io")
      assert.equal(404, srv:request("GET", VM).status)
    end)
  end)

  describe("selfsubjectaccessreviews", function()
    local SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    local function review(verb, group, resource)
      return send("POST", SSAR, { apiVersion = "authorization.k8s.io/v1", kind = "SelfSubjectAccessReview",
        spec = { resourceAttributes = { namespace = "tenant-a", verb = verb, group = group, resource = resource } } })
    end

    it("allows everything by default and denies what a deny rule names", function()
      assert.is_true(review("update", "kubevirt.io", "virtualmachines").status.allowed)
      srv:deny{ { verb = "update", group = "kubevirt.io", resource = "virtualmachines" } }
      assert.is_false(review("update", "kubevirt.io", "virtualmachines").status.allowed)
      assert.is_true(review("get", "kubevirt.io", "virtualmachines").status.allowed)
      local vm = get(VM .. "/vm1")
      local res = srv:request("PUT", VM .. "/vm1", { body = vm })
      assert.equal(403, res.status)
      assert.same({ kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure", reason = "Forbidden",
        code = 403, details = { name = "vm1", group = "kubevirt.io", kind = "virtualmachines" },
        message = 'virtualmachines.kubevirt.io "vm1" is forbidden: User "fake" cannot update resource '
          .. '"virtualmachines" in API group "kubevirt.io" in the namespace "tenant-a"' }, res.json)
      srv:deny{}
      assert.is_true(review("update", "kubevirt.io", "virtualmachines").status.allowed)
    end)

    it("takes deny rules from the fixture and from --deny", function()
      srv:reset{ BASIC, KUBEVIRT, "spec/fixtures/fake/deny.json" }
      assert.is_false(review("delete", "", "configmaps").status.allowed)
      assert.is_true(review("list", "", "configmaps").status.allowed)
      local s2 = fake.start{ fixtures = { BASIC }, deny = { "list::configmaps", { verb = "*", group = "coordination.k8s.io", resource = "leases" } } }
      finally(function() s2:stop() end)
      assert.equal(403, s2:request("GET", CM).status)
      assert.equal(403, s2:request("GET", "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/some-lease").status)
      assert.equal(200, s2:request("GET", CM .. "/cm-a").status)
    end)
  end)
end)
