-- COZY_MIGRATE_PAGE_LIMIT: the page size of every list a run makes (the
-- fault campaign uses it to get several pages out of a 200-VM fleet).
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli

local FIXTURE = "spec/fixtures/59-vmi-hotplug/cluster.json"

-- The list requests of migration 59's run, per resource ("virtualmachines",
-- "virtualmachineinstances"), in the order sent: { limit = "5" or "none",
-- continue = the token sent, or nil }.
local function lists(srv)
  local by = {}
  for _, e in ipairs(srv:requests { method = "GET" }) do
    local resource = e.path:match("^/apis/kubevirt%.io/v1/(%a+)$")
    if resource then
      by[resource] = by[resource] or {}
      table.insert(by[resource], { limit = e.query:match("limit=(%d+)") or "none",
        continue = e.query:match("continue=([^&]+)") })
    end
  end
  return by
end

-- How many objects of each listed resource the fixture holds.
local function counts(srv)
  local n = { virtualmachines = 0, virtualmachineinstances = 0 }
  for _, o in ipairs(srv:objects()) do
    if o.kind == "VirtualMachine" then n.virtualmachines = n.virtualmachines + 1 end
    if o.kind == "VirtualMachineInstance" then n.virtualmachineinstances = n.virtualmachineinstances + 1 end
  end
  return n
end

describe("COZY_MIGRATE_PAGE_LIMIT", function()
  local srv
  setup(function() srv = fake.start { fixtures = { FIXTURE } } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(FIXTURE) end)

  it("sets the page size of the lists a run makes, and the pager follows the continue tokens", function()
    local n = counts(srv)
    assert.is_true(n.virtualmachines > 10 and n.virtualmachineinstances > 10, "the fixture is too small to page")
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig }, { COZY_MIGRATE_PAGE_LIMIT = "5" })
    assert.equal(0, r.code, r.stderr)
    local by = lists(srv)
    for resource, total in pairs(n) do
      local pages = by[resource] or {}
      -- every object read once, 5 a page: the server's continue token was
      -- followed to the last page and no further
      assert.equal((total + 4) // 5, #pages, resource .. ": pages for " .. total .. " objects")
      local seen = {}
      for i, p in ipairs(pages) do
        assert.equal("5", p.limit, resource .. " page " .. i)
        if i == 1 then
          assert.is_nil(p.continue, resource .. ": the first page carries no token")
        else
          assert.is_string(p.continue, resource .. " page " .. i .. " carries no continue token")
          assert.is_nil(seen[p.continue], resource .. " page " .. i .. " repeats a token")
          seen[p.continue] = true
        end
      end
    end
    assert.equal(60, cli.version(srv))
  end)

  for _, bad in ipairs({ "0", "-3", "2.5", "many" }) do
    it("keeps the default of 500 when it is not a positive integer (" .. bad .. ")", function()
      local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig }, { COZY_MIGRATE_PAGE_LIMIT = bad })
      assert.equal(0, r.code, r.stderr)
      local by = lists(srv)
      for _, resource in ipairs({ "virtualmachines", "virtualmachineinstances" }) do
        assert.same({ { limit = "500" } }, by[resource], bad .. ": " .. resource)
      end
    end)
  end
end)
