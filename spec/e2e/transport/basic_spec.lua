-- cozy.kube over TLS with a token against the fake API server: reads, writes,
-- absent object vs absent type, structured errors, headers.
local transport_harness = require("spec.helpers").transport
local kube = require "cozy.kube"
local json = require "cozy.json"

describe("cozy.kube basics (TLS + token)", function()
  local srv, client, cms
  setup(function()
    srv = transport_harness.start()
  end)
  teardown(function()
    if srv then srv:stop() end
  end)
  before_each(function()
    srv:reset { transport_harness.FIXTURE }
    srv:clear_faults()
    srv:clear_requests()
    client = transport_harness.connect(srv)
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  it("connects from the kubeconfig and reports no secret in its info", function()
    assert.equal(srv.url, client.server)
    assert.equal("token", client.info.auth)
    assert.equal("configured", client.info.ca)
    assert.is_false(client.info.insecure)
    for _, v in pairs(client.info) do
      assert.is_nil(tostring(v):find(transport_harness.TOKEN, 1, true))
    end
  end)

  it("gets an object and sends the User-Agent, Accept and gzip headers", function()
    local cm = cms:get("cozy-system", "settings")
    assert.equal("prod", cm.data.mode)
    assert.equal("ConfigMap", cm.kind)
    local reqs = transport_harness.api_requests(srv, "GET", "/configmaps/settings$")
    assert.equal(1, #reqs)
    assert.matches("^cozy%-migrate/%d+%.%d+", reqs[1].user_agent)
    assert.equal(1, client.stats.requests)
  end)

  it("tells an absent object from an absent type", function()
    assert.is_nil(cms:find("cozy-system", "nope"))
    local ok, err = pcall(cms.get, cms, "cozy-system", "nope")
    assert.is_false(ok)
    assert.is_true(kube.is_error(err))
    assert.equal(404, err.code)
    assert.equal("NotFound", err.reason)
    assert.equal("object", err.absent)
    assert.equal("GET", err.method)
    assert.equal("/api/v1/namespaces/cozy-system/configmaps/nope", err.path)
    assert.matches("NotFound %(404%)", tostring(err))

    local vms = client:resource("kubevirt.io/v1", "virtualmachines")
    local ok2, err2 = pcall(vms.find, vms, "team-a", "vm1")
    assert.is_false(ok2)
    assert.equal("type", err2.absent)
    assert.equal(404, err2.code)
    local ok3, err3 = pcall(function() for _ in vms:list{} do end end)
    assert.is_false(ok3)
    assert.equal("type", err3.absent)
  end)

  it("creates, merge-patches, json-patches and deletes", function()
    local created = cms:create { metadata = { name = "new", namespace = "team-a" }, data = { a = "1" } }
    assert.equal("new", created.metadata.name)
    assert.equal("ConfigMap", created.kind)
    local merged = cms:merge_patch("team-a", "new", { data = { b = "2", a = json.null } })
    assert.same({ b = "2" }, merged.data)
    local patched = cms:json_patch("team-a", "new", { { op = "add", path = "/data/c", value = "3" } })
    assert.same({ b = "2", c = "3" }, patched.data)
    assert.same({ b = "2", c = "3" }, transport_harness.object(srv, "team-a", "new").data)
    assert.is_nil(cms:delete("team-a", "new"))
    assert.is_nil(transport_harness.object(srv, "team-a", "new"))
    local ok, err = pcall(cms.delete, cms, "team-a", "new")
    assert.is_false(ok)
    assert.equal("object", err.absent)
    assert.equal(5, client.stats.writes) -- the failed delete was sent too
    local kinds = {}
    for _, e in ipairs(transport_harness.api_requests(srv, nil, "/configmaps")) do
      kinds[#kinds + 1] = e.method .. " " .. (type(e.content_type) == "string" and e.content_type or "-")
    end
    assert.same({ "POST application/json", "PATCH application/merge-patch+json",
      "PATCH application/json-patch+json", "DELETE -", "DELETE -" }, kinds)
  end)

  it("raises AlreadyExists on a plain create of an existing object, once", function()
    local ok, err = pcall(cms.create, cms, { metadata = { name = "settings", namespace = "cozy-system" } })
    assert.is_false(ok)
    assert.equal(409, err.code)
    assert.equal("AlreadyExists", err.reason)
    assert.equal(1, #transport_harness.api_requests(srv, "POST"))
  end)

  it("raises a failed test of a JSON patch as 422 Invalid", function()
    local ok, err = pcall(cms.json_patch, cms, "cozy-system", "settings",
      { { op = "test", path = "/data/mode", value = "dev" }, { op = "replace", path = "/data/mode", value = "x" } })
    assert.is_false(ok)
    assert.equal(422, err.code)
    assert.equal("prod", transport_harness.object(srv, "cozy-system", "settings").data.mode)
  end)

  it("works with cluster-scoped resources", function()
    local nss = client:resource("v1", "namespaces", { namespaced = false })
    assert.equal("team-a", nss:get("team-a").metadata.name)
    local names = {}
    for ns in nss:list {} do names[#names + 1] = ns.metadata.name end
    assert.same({ "cozy-system", "default", "team-a", "team-b" }, names)
    assert.has_error(function() nss:get("a", "b", "c") end, 'get: opts must be a table whose absent is "skip" or "fail"')
    assert.has_error(function() cms:get("only-a-name") end, "configmaps is namespaced: expected (namespace, name, ...)")
  end)

  it("rejects misuse with argument errors, not API errors", function()
    assert.has_error(function() cms:create { data = {} } end, "create(obj): obj.metadata must be a table")
    assert.has_error(function() cms:create { metadata = { name = "x" } } end,
      "create(obj): configmaps is namespaced and obj.metadata.namespace is not set")
    assert.has_error(function() cms:update("team-a", "cm-00", "not a function") end,
      "update: the last argument must be a function")
    assert.has_error(function() kube.connect { kubeconfig = srv.kubeconfig, dry_run = "yes" } end,
      'kube.connect: dry_run must be nil, "server", "client" or "rehearse", got "yes"')
  end)

  it("preserves big integers and empty arrays through a round trip", function()
    cms:create { metadata = { name = "big", namespace = "team-a", annotations = { n = "x" } },
      data = { v = "12345678901234567" } }
    local patched = cms:json_patch("team-a", "big", {
      { op = "add", path = "/metadata/finalizers", value = json.array {} } })
    assert.equal("12345678901234567", patched.data.v)
    assert.equal("[]", json.encode(patched.metadata.finalizers))
  end)
end)
