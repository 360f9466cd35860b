-- ctx.kube:served(api_version, plural): discovery, cached; an error is never
-- read as "absent".
local fake = require("spec.helpers").server
local kube = require "cozy.kube"

describe("client:served", function()
  local srv, client
  setup(function()
    srv = fake.start { fixtures = { "spec/fixtures/59-vmi-hotplug/cluster.json" }, tls = true, token = "t" }
  end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:clear_faults()
    srv:clear_requests()
    client = kube.connect { kubeconfig = srv.kubeconfig, retry = { max_attempts = 1 } }
  end)
  after_each(function() client:close() end)

  it("answers from discovery for custom and built-in resources", function()
    assert.is_true(client:served("kubevirt.io/v1", "virtualmachines"))
    assert.is_true(client:served("kubevirt.io/v1", "virtualmachineinstances"))
    assert.is_false(client:served("kubevirt.io/v1", "nonexistent"))
    assert.is_true(client:served("v1", "configmaps"))
    assert.is_false(client:served("helm.toolkit.fluxcd.io/v2", "helmreleases"))
  end)

  it("asks once per group version", function()
    client:served("kubevirt.io/v1", "virtualmachines")
    client:served("kubevirt.io/v1", "virtualmachineinstances")
    assert.equal(1, #srv:requests { path = "^/apis/kubevirt%.io/v1$" })
  end)

  it("raises on a discovery error instead of answering 'absent'", function()
    srv:faults { { method = "GET", path = "^/apis/kubevirt\\.io/v1$", times = 1, status = 500 } }
    local ok, err = pcall(client.served, client, "kubevirt.io/v1", "virtualmachines")
    assert.is_false(ok)
    assert.equal(500, err.code)
    local fired = srv:requests { path = "^/apis/kubevirt%.io/v1$" }
    assert.equal(1, #fired)
    assert.is_not_nil(fired[1].fault)
  end)
end)
