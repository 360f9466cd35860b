-- COZY_MIGRATE_PAGE_LIMIT: the page size of every list a run makes (the
-- fault campaign uses it to get several pages out of a 200-VM fleet).
local fake = require "spec.support.fake"
local support = require "spec.helpers.cli"

local FIXTURE = "spec/fixtures/59-vmi-hotplug/cluster.json"

-- The limit= of each list request of migration 59's run, and how many were
-- continued pages.
local function lists(srv)
  local limits, continued = {}, 0
  for _, e in ipairs(srv:requests { method = "GET" }) do
    if e.path:match("^/apis/kubevirt%.io/v1/[%a]+$") then
      limits[#limits + 1] = e.query:match("limit=(%d+)") or "none"
      if e.query:find("continue=", 1, true) then continued = continued + 1 end
    end
  end
  return limits, continued
end

describe("COZY_MIGRATE_PAGE_LIMIT", function()
  it("sets the page size of the lists a run makes", function()
    local srv <close> = fake.start { fixtures = { FIXTURE } }
    local r = support.run({ "run", "--kubeconfig", srv.kubeconfig }, { COZY_MIGRATE_PAGE_LIMIT = "5" })
    assert.equal(0, r.code, r.stderr)
    local limits, continued = lists(srv)
    assert.is_true(#limits > 2, #limits .. " list requests")
    for _, l in ipairs(limits) do assert.equal("5", l) end
    assert.is_true(continued >= 2, continued .. " continued pages")
    assert.equal(60, support.version(srv))
  end)

  it("keeps the default of 500 when it is not a positive integer", function()
    for _, bad in ipairs({ "0", "-3", "2.5", "many" }) do
      local srv <close> = fake.start { fixtures = { FIXTURE } }
      local r = support.run({ "run", "--kubeconfig", srv.kubeconfig }, { COZY_MIGRATE_PAGE_LIMIT = bad })
      assert.equal(0, r.code, r.stderr)
      local limits, continued = lists(srv)
      assert.same({ "500", "500" }, limits, bad)
      assert.equal(0, continued, bad)
    end
  end)
end)
