-- A write whose labels or annotations the API server would refuse is refused
-- before it is sent (cozy.kube.labels, docs/engine-api.md "Labels and
-- annotations"): whatever the way it is written (create, merge patch, JSON
-- patch, the difference a change sends), in a run and in a plan alike, as a
-- 422 Invalid naming the key, and the server's request log shows nothing sent.
-- Before, the write went out and its 422 came back in the middle of a batch
-- (on the old binary every case here finds the request in the log).
local fake = require("spec.helpers").server
local harness = require "spec.helpers"
local json = require "cozy.json"
local kube = require "cozy.kube"
local obj = require "cozy.obj"

local BAD = "tenant.cozystack.io/tenant-"

describe("writes carrying labels the API server refuses", function()
  local srv
  setup(function()
    srv = fake.start { tls = true, token = "t", fixtures = { {
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
      { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cm", namespace = "cozy-system" }, data = { a = "1" } },
    } } }
  end)
  teardown(function() srv:stop() end)

  local function client(dry_run)
    local opts = { kubeconfig = srv.kubeconfig, dry_run = dry_run, record = function() end }
    for k, v in pairs(harness.CONNECT) do opts[k] = v end
    return kube.connect(opts)
  end

  local WRITES = {
    { "create", function(cms)
      return cms:create { metadata = { name = "new", namespace = "cozy-system", labels = { [BAD] = "x" } } }
    end, "labels", BAD },
    { "merge patch of a label", function(cms)
      return cms:merge_patch("cozy-system", "cm", { metadata = { labels = { [BAD] = "x" } } })
    end, "labels", BAD },
    { "merge patch of an annotation", function(cms)
      return cms:merge_patch("cozy-system", "cm", { metadata = { annotations = { ["a/b/c"] = "x" } } })
    end, "annotations", "a/b/c" },
    { "merge patch of a label value", function(cms)
      return cms:merge_patch("cozy-system", "cm", { metadata = { labels = { ok = "x-" } } })
    end, "labels", "x-" },
    { "JSON patch of one label", function(cms)
      return cms:json_patch("cozy-system", "cm", { { op = "add", path = "/metadata/labels", value = {} },
        { op = "add", path = "/metadata/labels/tenant.cozystack.io~1tenant-", value = "x" } })
    end, "labels", BAD },
    { "JSON patch of the labels map", function(cms)
      return cms:json_patch("cozy-system", "cm", { { op = "add", path = "/metadata/labels", value = { [BAD] = "x" } } })
    end, "labels", BAD },
    { "change", function(cms)
      return cms:change("cozy-system", "cm", function(cm)
        cm.metadata.labels = cm.metadata.labels or {}
        cm.metadata.labels[BAD] = "x" -- written directly, past obj.set_label's own check
      end)
    end, "labels", BAD },
  }

  for _, mode in ipairs { "run", "plan" } do
    for _, w in ipairs(WRITES) do
      local name, write, field, shown = w[1], w[2], w[3], w[4]
      it(("refuses a %s, unsent, in a %s"):format(name, mode), function()
        local c = client(mode == "plan" and "client" or nil)
        local cms = c:resource("v1", "configmaps")
        srv:clear_requests()
        local ok, err = pcall(write, cms)
        assert.is_false(ok)
        assert.equal(422, err.code, tostring(err))
        assert.equal("Invalid", err.reason)
        assert.matches("metadata." .. field .. ": invalid ", err.message, 1, true)
        assert.matches(("%q"):format(shown), err.message, 1, true)
        assert.matches("not sent: the API server refuses it", err.message, 1, true)
        assert.same({}, srv:requests { method = "POST" })
        assert.same({}, srv:requests { method = "PATCH" })
        c:close()
      end)
    end
  end

  it("sends valid keys, and the removal of a key it would refuse", function()
    local c = client()
    local cms = c:resource("v1", "configmaps")
    local cm = cms:merge_patch("cozy-system", "cm", { metadata = { labels = { [BAD] = json.null, ok = "v" },
      annotations = { ["Example.COM/x"] = "any" } } })
    assert.equal("v", obj.label(cm, "ok"))
    assert.equal("any", obj.annotation(cm, "Example.COM/x"))
    c:close()
  end)
end)
