-- A real kubectl (1.32) against the fake API server, over TLS with a bearer token,
-- through the kubeconfig the server writes.  If kubectl accepts the fake's answers
-- and reports them as it reports a real server's, the fake is faithful enough.
local fake = require("spec.helpers").server

local BASIC = "spec/fixtures/fake/basic.json"
local KUBEVIRT = "spec/fixtures/fake/kubevirt.json"

local function has(haystack, needle)
  return haystack:find(needle, 1, true) ~= nil
end

describe("kubectl against the fake API server", function()
  local srv

  setup(function()
    srv = fake.start{ fixtures = { BASIC, KUBEVIRT }, tls = true, token = "kubectl-secret" }
  end)

  teardown(function()
    if srv then srv:stop() end
  end)

  before_each(function()
    srv:reset{ BASIC, KUBEVIRT }
  end)

  local function ok(res)
    assert(res.ok, "kubectl failed (" .. res.code .. "): " .. res.stderr)
    return res
  end

  it("uses the kubeconfig written by the server: TLS with the generated CA and the token", function()
    local kc = io.open(srv.kubeconfig):read("a")
    assert.truthy(srv.url:match("^https://127%.0%.0%.1:%d+$"))
    assert.truthy(has(kc, "certificate-authority-data"))
    assert.truthy(has(kc, 'token: "kubectl-secret"'))
    assert.truthy(has(kc, "current-context: fake"))
    local res = ok(srv:kubectl("get", "configmap", "cm-a", "-n", "default", "-o", "json"))
    local cm = fake.json.decode(res.stdout)
    assert.equal("cm-a", cm.metadata.name)
    assert.equal("1", cm.data.k)
  end)

  it("lists with --chunk-size=2 across several pages", function()
    srv:clear_requests()
    local res = ok(srv:kubectl("get", "configmaps", "-n", "default", "--chunk-size=2", "-o", "name"))
    assert.equal("configmap/cm-a\nconfigmap/cm-b\nconfigmap/cm-c\nconfigmap/cm-d\nconfigmap/cm-e\n", res.stdout)
    local pages = srv:requests{ method = "GET", path = "^/api/v1/namespaces/default/configmaps$" }
    assert.equal(3, #pages)
    assert.truthy(pages[1].query:match("limit=2"))
    assert.is_nil(pages[1].query:match("continue="))
    assert.truthy(pages[2].query:match("continue="))
    assert.truthy(pages[3].query:match("continue="))
    for _, p in ipairs(pages) do assert.equal(200, p.status) end
  end)

  it("lists all namespaces with a label selector, table output included", function()
    local res = ok(srv:kubectl("get", "cm", "-A", "-l", "tier=web", "--chunk-size=1"))
    assert.truthy(res.stdout:match("^NAMESPACE%s+NAME%s+AGE\n"))
    assert.truthy(res.stdout:match("default%s+cm%-a"))
    assert.truthy(res.stdout:match("default%s+cm%-b"))
    assert.is_nil(res.stdout:match("cm%-c"))
  end)

  it("resolves short names and CRD short names from discovery", function()
    local res = ok(srv:kubectl("get", "ns", "-o", "name"))
    assert.equal("namespace/cozy-system\nnamespace/default\nnamespace/tenant-a\n", res.stdout)
    res = ok(srv:kubectl("get", "vm", "-n", "tenant-a", "-o", "name"))
    assert.equal("virtualmachine.kubevirt.io/vm1\n", res.stdout)
    res = ok(srv:kubectl("get", "vmi", "-n", "tenant-a", "-o", "name"))
    assert.equal("", res.stdout)
  end)

  it("reports a failed JSON-patch test as an invalid request and changes nothing", function()
    local before = srv:object("ConfigMap", "default", "cm-a")
    local res = srv:kubectl("patch", "cm", "cm-a", "-n", "default", "--type=json", "-p",
      '[{"op":"test","path":"/data/k","value":"not-1"},{"op":"replace","path":"/data/k","value":"x"}]')
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, "The request is invalid: the server rejected our request due to an error in our request"),
      res.stderr)
    assert.same(before, srv:object("ConfigMap", "default", "cm-a"))
    local patch = srv:requests{ method = "PATCH" }
    assert.equal(422, patch[#patch].status)
    assert.equal("application/json-patch+json", patch[#patch].content_type)
  end)

  it("applies a JSON patch whose test passes", function()
    ok(srv:kubectl("patch", "cm", "cm-a", "-n", "default", "--type=json", "-p",
      '[{"op":"test","path":"/data/k","value":"1"},{"op":"replace","path":"/data/k","value":"x"}]'))
    assert.equal("x", srv:object("ConfigMap", "default", "cm-a").data.k)
  end)

  it("gets Conflict for a merge patch with a stale resourceVersion", function()
    local before = srv:object("ConfigMap", "default", "cm-a")
    local stale = tostring(tonumber(before.metadata.resourceVersion) - 1)
    local res = srv:kubectl("patch", "cm", "cm-a", "-n", "default", "--type=merge", "-p",
      '{"metadata":{"resourceVersion":"' .. stale .. '"},"data":{"k":"x"}}')
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, 'Error from server (Conflict): Operation cannot be fulfilled on configmaps "cm-a": '
      .. "the object has been modified; please apply your changes to the latest version and try again"), res.stderr)
    assert.same(before, srv:object("ConfigMap", "default", "cm-a"))
    -- the current resourceVersion is accepted
    ok(srv:kubectl("patch", "cm", "cm-a", "-n", "default", "--type=merge", "-p",
      '{"metadata":{"resourceVersion":"' .. before.metadata.resourceVersion .. '"},"data":{"k":"x"}}'))
    assert.equal("x", srv:object("ConfigMap", "default", "cm-a").data.k)
  end)

  it("leaves an object with a finalizer terminating until the finalizer is removed", function()
    ok(srv:kubectl("patch", "cm", "cm-b", "-n", "default", "--type=merge", "-p",
      '{"metadata":{"finalizers":["example.com/hold"]}}'))
    local res = ok(srv:kubectl("delete", "cm", "cm-b", "-n", "default", "--wait=false"))
    assert.truthy(has(res.stdout, 'configmap "cm-b" deleted'))
    local cm = srv:object("ConfigMap", "default", "cm-b")
    assert.is_not_nil(cm)
    assert.is_string(cm.metadata.deletionTimestamp)
    assert.same({ "example.com/hold" }, cm.metadata.finalizers)
    ok(srv:kubectl("get", "cm", "cm-b", "-n", "default"))
    ok(srv:kubectl("patch", "cm", "cm-b", "-n", "default", "--type=json", "-p",
      '[{"op":"remove","path":"/metadata/finalizers"}]'))
    assert.is_nil(srv:object("ConfigMap", "default", "cm-b"))
    res = srv:kubectl("get", "cm", "cm-b", "-n", "default")
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, 'configmaps "cm-b" not found'))
  end)

  it("waits in delete (through a watch) until the finalizer is gone", function()
    -- vm1 carries KubeVirt's finalizer in the fixture
    local res = ok(srv:kubectl("delete", "vm", "vm1", "-n", "tenant-a", "--wait=false"))
    assert.truthy(has(res.stdout, 'virtualmachine.kubevirt.io "vm1" deleted'))
    assert.is_string(srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1").metadata.deletionTimestamp)
    -- a second delete with --wait times out while the finalizer is there
    res = srv:kubectl("delete", "vm", "vm1", "-n", "tenant-a", "--timeout=1s")
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, "timed out waiting"), res.stderr)
    local watches = srv:requests{ method = "GET", path = "virtualmachines$" }
    local watched = false
    for _, w in ipairs(watches) do watched = watched or (w.query:match("watch=true") ~= nil) end
    assert.is_true(watched)
    ok(srv:kubectl("patch", "vm", "vm1", "-n", "tenant-a", "--type=merge", "-p", '{"metadata":{"finalizers":null}}'))
    assert.is_nil(srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1"))
  end)

  it("gets AlreadyExists when creating an existing object", function()
    local res = srv:kubectl{ "create", "-f", "-", stdin = [[
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-a
  namespace: default
data:
  k: "other"
]] }
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, 'Error from server (AlreadyExists)'), res.stderr)
    assert.truthy(has(res.stderr, 'configmaps "cm-a" already exists'), res.stderr)
    assert.equal("1", srv:object("ConfigMap", "default", "cm-a").data.k)
  end)

  it("gets NotFound for a missing object", function()
    local res = srv:kubectl("get", "cm", "nope", "-n", "default")
    assert.is_false(res.ok)
    assert.equal('Error from server (NotFound): configmaps "nope" not found\n', res.stderr)
    res = srv:kubectl("get", "vm", "nope", "-n", "tenant-a")
    assert.is_false(res.ok)
    assert.equal('Error from server (NotFound): virtualmachines.kubevirt.io "nope" not found\n', res.stderr)
  end)

  it("says the server doesn't have a resource type whose CRD is absent, until the CRD is created", function()
    srv:reset(BASIC)
    local res = srv:kubectl("get", "vm", "-A")
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, 'the server doesn\'t have a resource type "vm"'), res.stderr)
    local crd = io.open(KUBEVIRT):read("a")
    local list = fake.json.decode(crd)
    local vm_crd = list.items[2]
    assert.equal("virtualmachines.kubevirt.io", vm_crd.metadata.name)
    ok(srv:kubectl{ "create", "-f", "-", stdin = fake.json.encode(vm_crd) })
    res = ok(srv:kubectl("get", "vm", "-A"))
    assert.truthy(has(res.stderr .. res.stdout, "No resources found"))
  end)

  it("creates and updates a configmap with kubectl apply -f -, as legacy scripts do", function()
    local manifest = [[
apiVersion: v1
kind: ConfigMap
metadata:
  name: applied
  namespace: cozy-system
  labels:
    owner: legacy
data:
  a: "1"
]]
    local res = ok(srv:kubectl{ "apply", "--filename", "-", stdin = manifest })
    assert.equal("configmap/applied created\n", res.stdout)
    local cm = srv:object("ConfigMap", "cozy-system", "applied")
    assert.same({ a = "1" }, cm.data)
    assert.is_string(cm.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"])
    res = ok(srv:kubectl{ "apply", "--filename", "-", stdin = manifest:gsub('a: "1"', 'a: "2"\n  b: "3"') })
    assert.equal("configmap/applied configured\n", res.stdout)
    cm = srv:object("ConfigMap", "cozy-system", "applied")
    assert.same({ a = "2", b = "3" }, cm.data)
    assert.same({ owner = "legacy" }, cm.metadata.labels)
    res = ok(srv:kubectl{ "apply", "--filename", "-", stdin = manifest:gsub('a: "1"', 'a: "2"\n  b: "3"') })
    assert.equal("configmap/applied unchanged\n", res.stdout)
    -- default validation went through the OpenAPI v3 document, then JSON writes
    local posts = srv:requests{ method = "POST", path = "/configmaps$" }
    assert.truthy(posts[#posts].query:match("fieldValidation=Strict"))
    local patches = srv:requests{ method = "PATCH", path = "/configmaps/applied$" }
    assert.equal("application/strategic-merge-patch+json", patches[#patches].content_type)
  end)

  it("answers kubectl auth can-i through selfsubjectaccessreviews, honouring deny rules", function()
    local res = ok(srv:kubectl("auth", "can-i", "patch", "virtualmachines.kubevirt.io", "-n", "tenant-a"))
    assert.equal("yes\n", res.stdout)
    srv:deny{ { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" } }
    finally(function() srv:deny{} end)
    res = srv:kubectl("auth", "can-i", "patch", "virtualmachines.kubevirt.io", "-n", "tenant-a")
    assert.is_false(res.ok)
    assert.equal("no\n", res.stdout)
    res = srv:kubectl("patch", "vm", "vm1", "-n", "tenant-a", "--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}')
    assert.is_false(res.ok)
    assert.truthy(has(res.stderr, 'Error from server (Forbidden): virtualmachines.kubevirt.io "vm1" is forbidden: '
      .. 'User "fake" cannot patch resource "virtualmachines" in API group "kubevirt.io" in the namespace "tenant-a"'),
      res.stderr)
  end)

  it("never records the bearer token in the request log", function()
    ok(srv:kubectl("get", "cm", "-n", "default"))
    local raw = srv:request("GET", "/_fake/requests", { token = false }).body
    assert.is_nil(raw:find("kubectl-secret", 1, true))
    local log = srv:requests()
    assert.truthy(#log > 0)
    for _, e in ipairs(log) do
      assert.truthy(e.user_agent:match("^kubectl"))
      assert.is_nil(e.path:match("^/_fake"))
    end
  end)
end)
