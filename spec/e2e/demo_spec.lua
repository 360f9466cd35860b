-- hack/demo.sh, the README's first command after the set-up, end to end: it
-- starts its own fake API server with hack/demo/fleet.json and runs status,
-- check, plan, run twice and status against it with the binary under test.
local cli = require "spec.helpers.cli"

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
    local r = cli.shell(("COZY_MIGRATE_BIN=%s hack/demo.sh 2>&1 </dev/null"):format(cli.quote(cli.bin)))
    assert.equal(0, r.code, r.stdout)
    -- the first run copies, the second finds nothing left, status ends up to date
    assert.equal(1, #lines_with(r.stdout, "updated 6 VMs: 10 volumes, 9 disks copied from their VMIs; 2 VMs already complete"))
    assert.equal(1, #lines_with(r.stdout, "nothing to update: no running VMI holds a hotplugged volume missing from its VM spec"))
    assert.equal(3, #lines_with(r.stdout, "[WARN] 59-vmi-hotplug: "))
    assert.truthy(r.stdout:find("state:      up to date", 1, true), r.stdout)
  end)
end)
