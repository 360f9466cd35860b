-- hack/demo.sh, the README's first command after the set-up, end to end: it
-- starts its own API server with hack/demo/fleet.json and runs status, check,
-- plan, run twice and status against it with the binary under test. The
-- server is the one this run of the specs uses (COZY_SPEC_SERVER): the fake,
-- or, under COZY_SPEC_SERVER=real, the real control plane (the demo's
-- COZY_DEMO_SERVER=real).
local cli = require("spec.helpers").cli
local fake = require("spec.helpers").server

-- The lines of `text` that contain `needle`.
local function lines_with(text, needle)
  local out = {}
  for line in text:gmatch("[^\n]+") do
    if line:find(needle, 1, true) then out[#out + 1] = line end
  end
  return out
end

describe("the demo (hack/demo.sh)", function()
  it("runs check, plan, run twice and status against its fleet", function()
    local server = fake.server_kind()
    local r = cli.shell(("COZY_DEMO_SERVER=%s COZY_MIGRATE_BIN=%s hack/demo.sh 2>&1 </dev/null")
      :format(server, cli.quote(cli.bin)))
    assert.equal(0, r.code, r.stdout)
    local started = server == "real" and "Starting a cluster (real kube-apiserver and etcd"
      or "Starting a simulated cluster (fake API server"
    assert.truthy(r.stdout:find(started, 1, true), r.stdout)
    -- the first run copies, the second finds nothing left, status ends up to date
    assert.equal(1, #lines_with(r.stdout, "updated 6 VMs: 10 volumes, 9 disks copied from their VMIs; 2 VMs already complete"))
    assert.equal(1, #lines_with(r.stdout, "nothing to update: no running VMI holds a hotplugged volume missing from its VM spec"))
    assert.equal(3, #lines_with(r.stdout, "[WARN] 59-vmi-hotplug: "))
    assert.truthy(r.stdout:find("state:      up to date", 1, true), r.stdout)
  end)
end)
