-- Two clients in two threads (two Lua states), as the runner's lease renewer
-- runs beside a migration: per-client C state, no shared mutable globals.
local transport_harness = require("spec.helpers").transport
local json = require "cozy.json"
local worker = require "cozy.worker"   -- part of every build: missing, the spec fails

describe("cozy.kube in two threads", function()
  local srv
  setup(function() srv = transport_harness.start() end)
  teardown(function() if srv then srv:stop() end end)

  it("runs independent clients concurrently, each write applied exactly once", function()
    local client = transport_harness.connect(srv)
    local opts = client.options
    local N = 40
    local w = worker.start("spec.fixtures.transport.worker", "run",
      json.encode { opts = opts, n = N, namespace = "team-a", name = "cm-00" })
    local cms = client:resource("v1", "configmaps")
    for _ = 1, N do
      cms:update("team-b", "cm-00", function(obj)
        return { { op = "replace", path = "/data/i", value = tostring(tonumber(obj.data.i) + 1) } }
      end)
    end
    local done, err = w:stop()
    assert.is_true(done, tostring(err))
    assert.equal(tostring(N), transport_harness.object(srv, "team-a", "cm-00").data.i)
    assert.equal(tostring(N), transport_harness.object(srv, "team-b", "cm-00").data.i)
    assert.equal(N, #transport_harness.api_requests(srv, "PATCH", "team%-a/configmaps/cm%-00$"))
    assert.equal(N, #transport_harness.api_requests(srv, "PATCH", "team%-b/configmaps/cm%-00$"))
    assert.equal(2 * N, client.stats.requests)
    client:close()
  end)
end)
