-- deploy/helm beside Helm: the preflight's `check` reviews the hook's account,
-- and the generated RBAC in templates/migration-hook.yaml stays in step with
-- generate-rbac.lua. What the chart renders, real Helm renders against the real
-- API server: spec/real/helm_chart_spec.lua.
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local CHART = "deploy/helm"
local NS = "cozy-system"

describe("deploy/helm", function()
  it("the preflight's check reviews the hook's account with SubjectAccessReviews", function()
    local fake = require("spec.helpers").server
    local srv = fake.start{ fixtures = { "spec/fixtures/59-vmi-hotplug/cluster.json" }, tls = true, token = "t",
      deny = { "patch:kubevirt.io:virtualmachines" } }
    finally(function() srv:stop() end)
    local r = cli.run({ "check", "--service-account", "cozystack-migration-hook", "--kubeconfig", srv.kubeconfig,
      "--output", "json" }, { NAMESPACE = NS, TARGET_VERSION = "60", COZY_MIGRATE_MIGRATIONS = "" })
    assert.equal(1, r.code, r.stderr)
    local report = json.decode(r.stdout)
    assert.is_true(report.blocked)
    local blocked = {}
    for _, f in ipairs(report.findings) do
      if f.severity == "block" then blocked[#blocked + 1] = f.message end
    end
    assert.equal(1, #blocked, table.concat(blocked, "; "))
    assert.matches("not allowed: patch virtualmachines%.kubevirt%.io", blocked[1])
    local sar, ssar = 0, 0
    for _, req in ipairs(srv:requests{ method = "POST" }) do
      if req.path:match("/subjectaccessreviews$") then
        sar = sar + 1
        local body = json.decode(req.body)
        assert.equal("system:serviceaccount:cozy-system:cozystack-migration-hook", body.spec.user)
      elseif req.path:match("selfsubjectaccessreviews") then
        ssar = ssar + 1
      end
    end
    assert.is_true(sar > 0)
    assert.equal(0, ssar)
    assert.same({}, cli.writes(srv))
  end)

  it("keeps the generated RBAC templates in step with generate-rbac.lua", function()
    local dir = cli.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local ok = os.execute(("COZY_MIGRATE_MIGRATIONS= %s lua %s/generate-rbac.lua %s >/dev/null"):format(
      cli.quote(cli.bin), CHART, cli.quote(dir)))
    assert.is_true(ok)
    local name = "migration-hook.yaml"
    assert.equal(cli.slurp(dir .. "/" .. name), cli.slurp(CHART .. "/templates/" .. name),
      name .. " is stale: run build/cozy-migrate lua deploy/helm/generate-rbac.lua")
  end)
end)
