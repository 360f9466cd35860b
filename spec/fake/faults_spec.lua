-- Fault rules, the request log and --latency-ms: the knobs the engine's transport
-- and conflict tests turn.
local fake = require "spec.support.fake"

local BASIC = "spec/fixtures/fake/basic.json"
local KUBEVIRT = "spec/fixtures/fake/kubevirt.json"
local CM = "/api/v1/namespaces/default/configmaps"
local VM = "/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachines"

local function now_ms()
  local p = io.popen("date +%s%3N")
  local t = tonumber(p:read("a"))
  p:close()
  return t
end

describe("fake API server faults and request log", function()
  local srv

  setup(function()
    srv = fake.start{ fixtures = { BASIC, KUBEVIRT }, token = "t0k3n" }
  end)

  teardown(function()
    if srv then srv:stop() end
  end)

  before_each(function()
    srv:reset{ BASIC, KUBEVIRT }
  end)

  it("records method, path, query, content type, body, status and user agent, never the token", function()
    srv:request("PATCH", CM .. "/cm-a?fieldManager=me", { content_type = "application/merge-patch+json",
      body = '{"data":{"k":"2"}}', headers = { ["User-Agent"] = "cozy-migrate/test" } })
    srv:request("GET", CM .. "/missing")
    srv:request("GET", "/_fake/objects", { token = false })   -- control: not logged
    local log = srv:requests()
    assert.equal(2, #log)
    assert.same({ method = "PATCH", path = CM .. "/cm-a", query = "fieldManager=me",
      content_type = "application/merge-patch+json", body = '{"data":{"k":"2"}}', status = 200,
      user_agent = "cozy-migrate/test" }, log[1])
    assert.equal(404, log[2].status)
    assert.equal("GET", log[2].method)
    assert.is_nil(srv:request("GET", "/_fake/requests", { token = false }).body:find("t0k3n", 1, true))
    srv:clear_requests()
    assert.same({}, srv:requests())
  end)

  it("logs unauthorized requests with their 401", function()
    srv:request("GET", CM, { token = false })
    assert.equal(401, srv:requests()[1].status)
  end)

  it("answers an injected status with its Retry-After header, `times` times, then recovers", function()
    srv:faults{ { method = "GET", path = "/configmaps/cm-a$", times = 2,
                  status = { code = 503, message = "etcd is sulking", retry_after = 3 } } }
    for _ = 1, 2 do
      local res = srv:request("GET", CM .. "/cm-a")
      assert.equal(503, res.status)
      assert.equal("3", res.headers["retry-after"])
      assert.same({ kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure",
        message = "etcd is sulking", reason = "ServiceUnavailable", details = { retryAfterSeconds = 3 },
        code = 503 }, res.json)
    end
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
    local log = srv:requests()
    assert.same({ 503, 503, 200 }, { log[1].status, log[2].status, log[3].status })
    assert.equal("status", log[1].fault.action)
    assert.is_nil(log[3].fault)
  end)

  it("matches the method and a regex searched in the target, query string included", function()
    srv:faults{ { method = "PATCH", path = "fieldManager=kubectl", status = { code = 429, reason = "TooManyRequests" } } }
    assert.equal(200, srv:request("GET", CM .. "/cm-a?fieldManager=kubectl").status)   -- wrong method
    assert.equal(200, srv:request("PATCH", CM .. "/cm-a", { content_type = "application/merge-patch+json",
      body = "{}" }).status)                                                        -- no match in target
    local res = srv:request("PATCH", CM .. "/cm-a?fieldManager=kubectl-patch",
      { content_type = "application/merge-patch+json", body = '{"data":{"k":"9"}}' })
    assert.equal(429, res.status)
    assert.equal("TooManyRequests", res.json.reason)
    assert.equal("1", srv:object("ConfigMap", "default", "cm-a").data.k)   -- nothing written
  end)

  it("drops the connection without a response on reset, and logs status 0", function()
    srv:faults{ { path = "/configmaps/cm-a", reset = true } }
    local res = srv:request("GET", CM .. "/cm-a")
    assert.equal(0, res.status)
    assert.is_string(res.error)
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
    local log = srv:requests()
    assert.equal(0, log[1].status)
    assert.equal("reset", log[1].fault.action)
  end)

  it("delays a matching request by delay_ms, then serves it", function()
    srv:faults{ { path = "/configmaps/cm-a", delay_ms = 400 } }
    local t0 = now_ms()
    local res = srv:request("GET", CM .. "/cm-a")
    local slow = now_ms() - t0
    assert.equal(200, res.status)
    assert.is_true(slow >= 400, "took " .. slow .. " ms")
    assert.equal("delay", srv:requests()[1].fault.action)
  end)

  it("bumps the target's resourceVersion before serving, like a concurrent writer", function()
    local vm = srv:request("GET", VM .. "/vm1").json
    srv:faults{ { method = "PUT", path = "/virtualmachines/vm1$", bump = true } }
    vm.spec.runStrategy = "Halted"
    local res = srv:request("PUT", VM .. "/vm1", { body = vm })
    assert.equal(409, res.status)
    assert.equal("Conflict", res.json.reason)
    local stored = srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1")
    assert.is_true(tonumber(stored.metadata.resourceVersion) > tonumber(vm.metadata.resourceVersion))
    assert.equal("Always", stored.spec.runStrategy)      -- a resourceVersion-only bump
    local entry = srv:requests{ method = "PUT" }[1]
    assert.same({ action = "bump", rule = 0, applied = true, resourceVersion = stored.metadata.resourceVersion },
      entry.fault)
    -- a re-read and retry wins
    vm = srv:request("GET", VM .. "/vm1").json
    vm.spec.runStrategy = "Halted"
    assert.equal(200, srv:request("PUT", VM .. "/vm1", { body = vm }).status)
  end)

  it("deletes the target before serving, like a concurrent deleter", function()
    local vm = srv:request("GET", VM .. "/vm1").json
    assert.is_table(vm.metadata.finalizers) -- finalizers do not hold a completed deletion
    srv:faults{ { method = "PATCH", path = "/virtualmachines/vm1$", delete = true },
                { method = "PATCH", path = "/virtualmachines/nope$", delete = true } }
    local res = srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
      body = '{"metadata":{"labels":{"x":"y"}}}' })
    assert.equal(404, res.status)
    assert.equal("NotFound", res.json.reason)
    assert.equal("vm1", res.json.details.name)
    assert.is_nil(srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1"))
    assert.same({ action = "delete", rule = 0, applied = true }, srv:requests{ method = "PATCH" }[1].fault)
    res = srv:request("PATCH", VM .. "/nope", { content_type = "application/merge-patch+json", body = "{}" })
    assert.equal(404, res.status)
    assert.same({ action = "delete", rule = 1, applied = false }, srv:requests{ method = "PATCH" }[2].fault)
  end)

  it("can bump with a merge patch, changing content as the concurrent writer would", function()
    srv:faults{ { method = "PATCH", path = "/virtualmachines/vm1$",
                  bump = { merge = { status = { printableStatus = "Migrating" } } } } }
    local vm = srv:request("GET", VM .. "/vm1").json
    local res = srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
      body = '{"metadata":{"resourceVersion":"' .. vm.metadata.resourceVersion .. '","labels":{"x":"y"}}}' })
    assert.equal(409, res.status)
    assert.equal("Migrating", srv:object("VirtualMachine.kubevirt.io", "tenant-a", "vm1").status.printableStatus)
    -- a patch without a resourceVersion goes through after the bump
    srv:faults{ { method = "PATCH", path = "/virtualmachines/vm1$", bump = true } }
    res = srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
      body = '{"metadata":{"labels":{"x":"y"}}}' })
    assert.equal(200, res.status)
    assert.equal("y", res.json.metadata.labels.x)
  end)

  it("records a bump whose target does not exist as not applied", function()
    srv:faults{ { method = "POST", bump = true } }
    local res = srv:request("POST", CM, { body = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "z" } } })
    assert.equal(201, res.status)
    assert.is_false(srv:requests()[1].fault.applied)
  end)

  it("fires the first matching rule only, in the order given", function()
    srv:faults{ { path = "cm-a", status = { code = 500 } }, { path = "cm-a", status = { code = 502 } } }
    assert.equal(500, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(502, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
  end)

  it("forgets rules and the log on reset", function()
    srv:faults{ { path = "cm-a", times = -1, status = { code = 500 } } }
    assert.equal(500, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(500, srv:request("GET", CM .. "/cm-a").status)
    srv:reset{ BASIC, KUBEVIRT }
    assert.same({}, srv:requests())
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
  end)

  it("delays every API request, not control ones, with --latency-ms", function()
    -- The lower bound is exact; the upper bound for control requests only
    -- needs to tell "not delayed" from "delayed by 2 s", so a loaded machine
    -- (curl start-up counts here) does not make it flaky.
    local slow = fake.start{ fixtures = { BASIC }, latency_ms = 2000 }
    finally(function() slow:stop() end)
    local t0 = now_ms()
    slow:objects()
    local control = now_ms() - t0
    t0 = now_ms()
    assert.equal(200, slow:request("GET", CM .. "/cm-a").status)
    local api = now_ms() - t0
    assert.is_true(api >= 2000, "API request took " .. api .. " ms")
    assert.is_true(control < 2000, "control request took " .. control .. " ms")
  end)

  it("streams watch events after a resourceVersion", function()
    local list = srv:request("GET", CM).json
    srv:request("PATCH", CM .. "/cm-c", { content_type = "application/merge-patch+json", body = '{"data":{"k":"w"}}' })
    srv:request("DELETE", CM .. "/cm-d")
    local res = srv:request("GET", CM .. "?watch=true&timeoutSeconds=1&resourceVersion=" .. list.metadata.resourceVersion)
    assert.equal(200, res.status)
    local events = {}
    for line in res.body:gmatch("[^\n]+") do
      local e = fake.json.decode(line)
      events[#events + 1] = e.type .. " " .. e.object.metadata.name
    end
    assert.same({ "MODIFIED cm-c", "DELETED cm-d" }, events)
  end)

  it("starts a watch without a resourceVersion with the current objects as ADDED", function()
    local res = srv:request("GET", CM .. "?watch=true&timeoutSeconds=1&labelSelector=tier%3Dweb")
    assert.equal(200, res.status)
    local events = {}
    for line in res.body:gmatch("[^\n]+") do
      local e = fake.json.decode(line)
      events[#events + 1] = e.type .. " " .. e.object.metadata.name
    end
    assert.same({ "ADDED cm-a", "ADDED cm-b" }, events)
  end)
end)
