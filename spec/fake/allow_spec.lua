-- The fake's allow-list mode (spec/support/README.md, "Deny rules and access
-- reviews"): only what an allow rule covers is allowed, with RBAC's scoping of
-- namespaces and names; discovery and control endpoints stay open; a rule the
-- fake would misread is refused.
local fake = require("spec.helpers").server

local BASIC = "spec/fixtures/fake/basic.json"
local KUBEVIRT = "spec/fixtures/fake/kubevirt.json"
local CM = "/api/v1/namespaces/default/configmaps"
local SYSTEM_CM = "/api/v1/namespaces/cozy-system/configmaps"
local VM = "/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachines"
local SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"

describe("fake API server allow-list mode", function()
  local srv

  setup(function()
    srv = fake.start{ fixtures = { BASIC, KUBEVIRT } }
  end)
  teardown(function()
    if srv then srv:stop() end
  end)
  before_each(function()
    srv:reset{ BASIC, KUBEVIRT }
  end)

  local function review(verb, group, resource, namespace, name)
    local res = srv:request("POST", SSAR, { body = { apiVersion = "authorization.k8s.io/v1",
      kind = "SelfSubjectAccessReview", spec = { resourceAttributes = {
        namespace = namespace, verb = verb, group = group, resource = resource, name = name } } } })
    assert.equal(201, res.status, res.body)
    return res.json.status.allowed
  end

  it("is off until rules are given: everything not denied is allowed", function()
    assert.equal(200, srv:request("GET", CM).status)
    local state = srv:control("GET", "/_fake/allows")
    assert.is_false(state.enabled)
    assert.equal(fake.json.null, state.runtime)
  end)

  it("allows only what a rule covers and answers the rest 403 Forbidden", function()
    srv:allow{ { verb = "list", group = "", resource = "configmaps" },
               { verb = "get", group = "kubevirt.io", resource = "virtualmachines" } }
    assert.equal(200, srv:request("GET", CM).status)
    assert.equal(200, srv:request("GET", VM .. "/vm1").status)
    local res = srv:request("GET", CM .. "/cm-a")
    assert.equal(403, res.status)
    assert.equal("Forbidden", res.json.reason)
    assert.equal('configmaps "cm-a" is forbidden: User "fake" cannot get resource "configmaps" in API group "" '
      .. 'in the namespace "default"', res.json.message)
    assert.equal(403, srv:request("PATCH", VM .. "/vm1", { body = { metadata = { labels = { a = "b" } } },
      content_type = "application/merge-patch+json" }).status)
    assert.equal(403, srv:request("GET", "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases").status)
    -- the refused requests are in the log with their status
    local statuses = {}
    for _, e in ipairs(srv:requests()) do statuses[#statuses + 1] = ("%s %d"):format(e.method, e.status) end
    assert.same({ "GET 200", "GET 200", "GET 403", "PATCH 403", "GET 403" }, statuses)
  end)

  it("scopes a rule with a namespace to that namespace, one without to all and the cluster", function()
    srv:allow{ { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system" },
               { verb = "get", group = "", resource = "namespaces" } }
    assert.equal(200, srv:request("GET", SYSTEM_CM .. "/cozystack-version").status)
    assert.equal(403, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(403, srv:request("GET", "/api/v1/configmaps").status)       -- all namespaces: not a Role's
    assert.equal(200, srv:request("GET", "/api/v1/namespaces/default").status)  -- cluster-scoped
  end)

  it("covers only the named object with a name, never a list or a create", function()
    srv:allow{ { verb = "*", group = "", resource = "configmaps", name = "cm-a" } }
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(403, srv:request("GET", CM .. "/cm-b").status)
    assert.equal(403, srv:request("GET", CM).status)
    assert.equal(403, srv:request("POST", CM, { body = { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "cm-a" } } }).status)
  end)

  it("matches subresources as resource/subresource and * as anything", function()
    srv:allow{ { verb = "*", group = "kubevirt.io", resource = "virtualmachines/status" } }
    assert.equal(403, srv:request("GET", VM .. "/vm1").status)
    assert.equal(200, srv:request("GET", VM .. "/vm1/status").status)
    srv:allow{ { verb = "*", group = "*", resource = "*" } }
    assert.equal(200, srv:request("GET", VM .. "/vm1").status)
  end)

  it("keeps deny rules on top of the allow list", function()
    srv:allow{ { verb = "*", group = "*", resource = "*" } }
    srv:deny{ { verb = "get", group = "", resource = "configmaps" } }
    assert.equal(403, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(200, srv:request("GET", CM).status)
  end)

  it("never refuses discovery, /version or control endpoints; {} allows nothing else", function()
    srv:allow{}
    assert.equal(200, srv:request("GET", "/version").status)
    assert.equal(200, srv:request("GET", "/api/v1").status)
    assert.equal(200, srv:request("GET", "/apis/kubevirt.io/v1").status)
    assert.equal(403, srv:request("GET", CM).status)
    assert.is_table(srv:objects())
  end)

  it("answers access reviews from the same rules, and lets anyone ask (RBAC's system:basic-user)", function()
    srv:allow{ { verb = "create", group = "authorization.k8s.io", resource = "selfsubjectaccessreviews" },
               { verb = "patch", group = "", resource = "configmaps", namespace = "cozy-system", name = "x" } }
    assert.is_true(review("patch", "", "configmaps", "cozy-system", "x"))
    assert.is_false(review("patch", "", "configmaps", "cozy-system", "y"))
    assert.is_false(review("patch", "", "configmaps", "default", "x"))
    assert.is_false(review("get", "", "configmaps", "cozy-system", "x"))
    -- a user no rule covers may still ask, and is told no, as kube-apiserver's
    -- bootstrap RBAC does for every authenticated user
    srv:allow{}
    local res = srv:request("POST", SSAR, { body = { apiVersion = "authorization.k8s.io/v1",
      kind = "SelfSubjectAccessReview", spec = { resourceAttributes = { verb = "get", resource = "pods" } } } })
    assert.equal(201, res.status, res.body)
    assert.is_false(res.json.status.allowed)
    assert.equal(403, srv:request("GET", CM).status)
  end)

  it("ends with allow(nil) and with a reset", function()
    srv:allow{}
    assert.equal(403, srv:request("GET", CM).status)
    srv:allow(nil)
    assert.equal(200, srv:request("GET", CM).status)
    srv:allow{}
    srv:reset{ BASIC, KUBEVIRT }
    assert.equal(200, srv:request("GET", CM).status)
  end)

  it("takes FakeAllow items from a fixture", function()
    srv:reset{ BASIC, KUBEVIRT, { { kind = "FakeAllow", verb = "get", group = "", resource = "configmaps",
      namespace = "default" } } }
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(403, srv:request("GET", CM).status)
    assert.is_true(srv:control("GET", "/_fake/allows").enabled)
  end)

  it("refuses a rule it would misread, and keeps the rules it had", function()
    srv:allow{ { verb = "list", group = "", resource = "configmaps" } }
    for _, bad in ipairs({
      { { verb = "list", group = "", resource = "configmaps", resourceNames = { "x" } } },  -- unknown key
      { { verb = "list", resource = "configmaps" } },                                      -- no group
      { { verb = "list", group = "", resource = "configmaps", namespace = 3 } },
      { { verb = "", group = "", resource = "configmaps" } },
    }) do
      local ok, err = pcall(srv.allow, srv, bad)
      assert.is_false(ok)
      assert.matches("answered 400: allow rules: rule 0", err)
    end
    local res = srv:request("POST", "/_fake/allows", { body = "{}", token = false })
    assert.equal(400, res.status)
    assert.equal(200, srv:request("GET", CM).status)
    assert.equal(403, srv:request("GET", CM .. "/cm-a").status)
  end)
end)
