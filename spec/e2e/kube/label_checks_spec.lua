-- cozy.obj's key and value checks against the API server itself: every key
-- and value below is sent to the server as a label (and each key as an
-- annotation), and the server accepts exactly those cozy.obj accepts. On the
-- fake this holds since it checks them as kube-apiserver does (it stored
-- "tenant.cozystack.io/tenant-" before); COZY_SPEC_SERVER=real runs the same
-- against the real kube-apiserver.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local obj = require "cozy.obj"

local KEYS = {
  "a", "A", "9", "a_b.c-D", "apps.cozystack.io/application.name", "tenant.cozystack.io/tenant-x",
  ("n"):rep(63), ("p"):rep(253) .. "/n", "1.2/3", "Example.com/x",
  "tenant.cozystack.io/tenant-", "-a", "a b", "", "x/", "/x", "a/b/c", "-a.com/x", "a..com/x",
  "a_b.com/x", ("n"):rep(64), ("p"):rep(254) .. "/n", "a.-b/x",
}

local VALUES = { "", "v", ("v"):rep(63), ("v"):rep(64), "x-", "-x", "a b", "a.b_c-d", "a/b" }

describe("label and annotation checks, cozy.obj's and the API server's", function()
  local srv
  setup(function()
    srv = fake.start { tls = true, token = "t", fixtures = { {
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "keys" } } } } }
  end)
  teardown(function() srv:stop() end)

  local function patch(field, key, value)
    local body = { metadata = { [field] = { [key] = value } } }
    local res = srv:request("PATCH", "/api/v1/namespaces/keys",
      { body = json.encode(body), content_type = "application/merge-patch+json" })
    if res.status == 200 then
      -- leave the namespace as it was for the next key
      body.metadata[field][key] = json.null
      assert.equal(200, srv:request("PATCH", "/api/v1/namespaces/keys",
        { body = json.encode(body), content_type = "application/merge-patch+json" }).status)
    end
    return res
  end

  it("the server accepts exactly the label keys cozy.obj accepts", function()
    for _, key in ipairs(KEYS) do
      local res = patch("labels", key, "v")
      local ours = obj.key_error(key)
      if ours == nil then
        assert.equal(200, res.status, key .. ": " .. res.body)
      else
        assert.equal(422, res.status, key .. ": " .. res.body)
        assert.equal("Invalid", res.json.reason)
        assert.equal("metadata.labels", res.json.details.causes[1].field)
      end
    end
  end)

  it("the server accepts exactly the label values cozy.obj accepts", function()
    for _, value in ipairs(VALUES) do
      local res = patch("labels", "k", value)
      if obj.label_value_error(value) == nil then
        assert.equal(200, res.status, value .. ": " .. res.body)
      else
        assert.equal(422, res.status, value .. ": " .. res.body)
        assert.equal("metadata.labels", res.json.details.causes[1].field)
      end
    end
  end)

  it("the server accepts exactly the annotation keys cozy.obj accepts (checked lowercased)", function()
    for _, key in ipairs(KEYS) do
      local res = patch("annotations", key, "any value: / -")
      local ok = pcall(obj.set_annotation, {}, key, "any value: / -")
      assert.equal(ok and 200 or 422, res.status, key .. ": " .. res.body)
    end
  end)
end)
