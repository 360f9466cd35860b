-- Fault rules, the request log and --latency-ms: the knobs the engine's transport
-- and conflict tests turn.
local fake = require("spec.helpers").server
local json = fake.json

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

  it("records method, path, query, content type, body, status, user agent and connection, never the token", function()
    srv:request("PATCH", CM .. "/cm-a?fieldManager=me", { content_type = "application/merge-patch+json",
      body = '{"data":{"k":"2"}}', headers = { ["User-Agent"] = "cozy-migrate/test" } })
    srv:request("GET", CM .. "/missing")
    srv:request("GET", "/_fake/objects", { token = false })   -- control: not logged
    local log = srv:requests()
    assert.equal(2, #log)
    -- when it arrived: a wall-clock time, now-ish
    assert.is_true(math.abs(log[1].at - os.time()) < 60, tostring(log[1].at))
    log[1].at = nil
    -- which connection carried it: the client's address:port
    assert.matches("^127%.0%.0%.1:%d+$", log[1].conn)
    log[1].conn = nil
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
    assert.same({ "status" }, srv:fired())
    assert.same({ action = "status", rule = 0 }, srv:requests()[3].fault)
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

  it("await: holds a request until the requests it awaits have arrived, then serves it", function()
    srv:faults{ { method = "GET", path = "/configmaps/cm-a$",
      await = { method = "GET", path = "/configmaps/cm-b$", count = 2, timeout_ms = 30000 } } }
    local dir = assert(io.popen("mktemp -d")):read("l")
    finally(function() os.execute("rm -rf '" .. dir .. "'") end)
    os.execute(("(curl -sS -o /dev/null -w '%%{http_code}' --cacert '%s' -H 'Authorization: Bearer %s' '%s' >'%s/status') "
      .. ">/dev/null 2>&1 &"):format(srv.ca, srv.token, srv.url .. CM .. "/cm-a", dir))
    assert(fake.poll(10, function() return srv:requests()[1] end), "the held request never reached the server")
    -- held: one awaited request is not enough
    assert.equal(200, srv:request("GET", CM .. "/cm-b").status)
    local first = srv:requests()[1]
    assert.is_true(first.status == nil or first.status == json.null, "answered before the second awaited request")
    assert.equal(200, srv:request("GET", CM .. "/cm-b").status)
    local done = fake.poll(10, function()
      local f = io.open(dir .. "/status")
      local v = f and f:read("a")
      if f then f:close() end
      return v ~= nil and v ~= "" and v
    end)
    assert.equal("200", done)
    local held = srv:requests { path = "/configmaps/cm%-a$" }[1]
    assert.same({ "await" }, srv:fired())
    assert.is_true(held.fault.awaited)
  end)

  it("await: serves the request after timeout_ms when the awaited requests never come, and says so", function()
    srv:faults{ { path = "/configmaps/cm-a$", await = { path = "/never$", count = 1, timeout_ms = 200 } } }
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
    assert.same({ "await" }, srv:fired())
    assert.is_false(srv:requests()[1].fault.awaited)
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
    assert.is_true(srv:requests{ method = "PATCH" }[1].fault.applied)
    -- a patch without a resourceVersion goes through after the bump
    srv:faults{ { method = "PATCH", path = "/virtualmachines/vm1$", bump = true } }
    res = srv:request("PATCH", VM .. "/vm1", { content_type = "application/merge-patch+json",
      body = '{"metadata":{"labels":{"x":"y"}}}' })
    assert.equal(200, res.status)
    assert.equal("y", res.json.metadata.labels.x)
    assert.same({ "bump", "bump" }, srv:fired{ method = "PATCH" })
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
    local log = srv:requests()
    assert.same({ { action = "status", rule = 0 }, { action = "status", rule = 1 } }, { log[1].fault, log[2].fault })
    assert.is_nil(log[3].fault)
  end)

  describe("refuses a rule it would not act on, with a Status naming the problem", function()
    local function refused(rules)
      local res = srv:request("POST", "/_fake/faults", { body = rules, token = false })
      assert.equal(400, res.status, res.body)
      assert.equal("Status", res.json.kind)
      assert.equal("Failure", res.json.status)
      assert.equal("BadRequest", res.json.reason)
      assert.equal(400, res.json.code)
      return res.json.message
    end

    it("an unknown key, e.g. an action spelled as a key's value", function()
      assert.matches('unknown key "action"', refused { { path = "cm-a", action = "status" } }, 1, true)
      assert.matches('unknown key in status: "retryAfter"',
        refused { { status = { code = 503, retryAfter = 1 } } }, 1, true)
      assert.matches('unknown key in respond: "code"', refused { { respond = { code = 200 } } }, 1, true)
    end)

    it("an await without a count or a timeout, or with an unknown key", function()
      for _, case in ipairs({
        { { path = "x", timeout_ms = 10 }, "await.count must be a positive integer" },
        { { path = "x", count = 1 }, "await.timeout_ms must be a positive number" },
        { { path = "x", count = 1, timeout_ms = 10, times = 2 }, 'unknown key in await: "times"' },
      }) do
        assert.matches(case[2], refused { { path = "cm-a", await = case[1] } }, 1, true)
      end
    end)

    it("no action, or two", function()
      assert.matches("no action", refused { { method = "GET", path = "cm-a" } }, 1, true)
      assert.matches("two actions in one rule (status, reset)",
        refused { { status = 500, reset = true } }, 1, true)
      assert.matches("two actions in one rule (bump, delete)",
        refused { { bump = true, delete = true } }, 1, true)
    end)

    it("a method that is not an HTTP method", function()
      assert.matches('method "P.*" is not an HTTP method', refused { { method = "P.*", status = 500 } }, 1, true)
      assert.matches('method "get" is not an HTTP method', refused { { method = "get", status = 500 } }, 1, true)
    end)

    it("a times that is not a positive integer or -1, a bad regex, a bad value", function()
      assert.matches('times must be a positive integer or -1 (forever), got "2"',
        refused { { times = "2", reset = true } }, 1, true)
      assert.matches("times must be", refused { { times = 1.5, reset = true } }, 1, true)
      assert.matches("times must be", refused { { times = 0, reset = true } }, 1, true)
      assert.matches('path "(" is not a valid regex', refused { { path = "(", reset = true } }, 1, true)
      assert.matches("reset must be true", refused { { reset = false } }, 1, true)
      assert.matches("status.code must be an integer", refused { { status = { code = "503" } } }, 1, true)
      assert.matches('continue must be one of "repeat", "rewind"', refused { { ["continue"] = "loop" } }, 1, true)
      assert.matches("delay_ms must be a positive number", refused { { delay_ms = "100" } }, 1, true)
      assert.matches("a fault rule must be a JSON object", refused { 5 }, 1, true)
      assert.matches("fault rules are not JSON", refused "[{", 1, true)
    end)

    it("installs nothing of a refused batch, and the helper raises with the message", function()
      srv:faults { { path = "cm-b", status = 500 } }
      local msg = refused { { path = "cm-a", status = 500 }, { path = "cm-a", action = "reset" } }
      assert.matches("fault rule 1 of this request", msg, 1, true)
      assert.matches("no rule of it was added", msg, 1, true)
      local rules = srv:control("GET", "/_fake/faults")
      assert.equal(1, #rules)
      assert.equal("cm-b", rules[1].path)
      assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
      local ok, err = pcall(srv.faults, srv, { { method = "P.*", status = 500 } })
      assert.is_false(ok)
      assert.matches('method \"P.*\" is not an HTTP method', err, 1, true)
    end)
  end)

  -- its own server: a rotation changes the token every later request needs
  it("rotate_token: answers 401, writes the new token to the file, and accepts only it from then on", function()
    local own <close> = fake.start{ fixtures = { BASIC }, token = "old-token" }
    local file = own.dir .. "/token"
    own:faults { { method = "GET", path = "/configmaps/cm-a$", rotate_token = { token = "new-token", file = file } } }
    local res = own:request("GET", CM .. "/cm-a")
    assert.equal(401, res.status)
    assert.equal("Unauthorized", res.json.reason)
    local f = assert(io.open(file))
    assert.equal("new-token\n", f:read("a"))
    f:close()
    assert.equal(401, own:request("GET", CM .. "/cm-a").status)                       -- the old one expired
    assert.equal(200, own:request("GET", CM .. "/cm-a", { token = "new-token" }).status)
    assert.same({ action = "rotate_token", rule = 0, applied = true }, own:requests()[1].fault)
    assert.is_nil(own:requests()[2].fault)
    assert.same({ "rotate_token" }, own:fired())
  end)

  it("refuses a rotate_token without a token or with an unknown key", function()
    local function message(rule)
      local res = srv:request("POST", "/_fake/faults", { body = { rule }, token = false })
      assert.equal(400, res.status, res.body)
      return res.json.message
    end
    assert.matches("rotate_token.token must be a non-empty header value", message { rotate_token = {} }, 1, true)
    assert.matches("rotate_token.token must be", message { rotate_token = { token = "a\nb" } }, 1, true)
    assert.matches('unknown key in rotate_token: "path"',
      message { rotate_token = { token = "x", path = "/tmp/x" } }, 1, true)
    assert.matches("two actions in one rule (status, rotate_token)",
      message { status = 401, rotate_token = { token = "x" } }, 1, true)
  end)

  it("lets the first `skip` matching requests through, then fires", function()
    srv:faults { { method = "GET", path = "/configmaps/cm-a$", skip = 2, status = 503 } }
    local got = {}
    for i = 1, 4 do got[i] = srv:request("GET", CM .. "/cm-a").status end
    assert.same({ 200, 200, 503, 200 }, got)
    local log = srv:requests()
    assert.is_nil(log[1].fault)
    assert.is_nil(log[2].fault)
    assert.same({ action = "status", rule = 0 }, log[3].fault)
  end)

  describe("respond", function()
    it("answers exactly the status, JSON body and content type given, serving nothing", function()
      srv:faults { { method = "GET", path = "/configmaps/cm-a$", respond = { body = {
        apiVersion = "v1", kind = "Secret", metadata = { name = "cm-a", namespace = "default" } } } } }
      local res = srv:request("GET", CM .. "/cm-a")
      assert.equal(200, res.status)
      assert.equal("application/json", res.headers["content-type"])
      assert.equal("Secret", res.json.kind)
      assert.same({ action = "respond", rule = 0 }, srv:requests()[1].fault)
      assert.equal(200, srv:requests()[1].status)
      assert.equal("ConfigMap", srv:request("GET", CM .. "/cm-a").json.kind)   -- once
    end)

    it("can answer a list whose items are null, [1], {} or absent", function()
      srv:faults {
        { path = "configmaps\\?limit", respond = { body = '{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":null}' } },
        -- string bodies: sent as they are, so the expected text does not depend on the encoder
        { path = "configmaps\\?limit", respond = { body = '{"apiVersion":"v1","items":[1],"kind":"ConfigMapList"}' } },
        { path = "configmaps\\?limit", respond = { body = '{"apiVersion":"v1","items":{},"kind":"ConfigMapList"}' } },
        { path = "configmaps\\?limit", respond = { status = 201, body = '{"apiVersion":"v1","kind":"ConfigMapList"}' } },
      }
      assert.equal('{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":null}',
        srv:request("GET", CM .. "?limit=1").body)
      assert.equal('{"apiVersion":"v1","items":[1],"kind":"ConfigMapList"}', srv:request("GET", CM .. "?limit=1").body)
      assert.equal('{"apiVersion":"v1","items":{},"kind":"ConfigMapList"}', srv:request("GET", CM .. "?limit=1").body)
      local res = srv:request("GET", CM .. "?limit=1")
      assert.equal(201, res.status)
      assert.equal('{"apiVersion":"v1","kind":"ConfigMapList"}', res.body)
      local log = srv:requests()
      for i = 1, 4 do assert.same({ action = "respond", rule = i - 1 }, log[i].fault) end
      assert.equal(201, log[4].status)
      assert.equal(1, #srv:request("GET", CM .. "?limit=1").json.items)   -- all used: served normally
      srv:faults { { path = "configmaps\\?limit", respond = { body = { kind = "ConfigMapList", items = { 1, 2 } } } } }
      local res2 = srv:request("GET", CM .. "?limit=1")
      assert.same({ kind = "ConfigMapList", items = { 1, 2 } }, res2.json)   -- a JSON value, sent as JSON
    end)

    it("sends a string body as it is, with the content type given, or no body at all", function()
      srv:faults { { path = "cm-a", respond = { status = 200, body = "<html>proxy</html>", content_type = "text/html" } },
                   { path = "cm-a", respond = { status = 204 } } }
      local res = srv:request("GET", CM .. "/cm-a")
      assert.equal("<html>proxy</html>", res.body)
      assert.equal("text/html", res.headers["content-type"])
      res = srv:request("GET", CM .. "/cm-a")
      assert.equal(204, res.status)
      assert.equal("", res.body)
      assert.same({ "respond", "respond" }, srv:fired())
    end)
  end)

  describe("continue", function()
    local function list(token)
      local q = "?limit=2" .. (token and ("&continue=" .. token) or "")
      local res = srv:request("GET", CM .. q)
      assert.equal(200, res.status, res.body)
      local names = {}
      for i, o in ipairs(res.json.items) do names[i] = o.metadata.name end
      return res.json.metadata["continue"], names
    end

    it("repeat: a continued page hands back the token it was asked with, every time", function()
      srv:faults { { path = "continue=", times = -1, ["continue"] = "repeat" } }
      local t1, first = list()
      assert.same({ "cm-a", "cm-b" }, first)
      local t2, second = list(t1)
      assert.equal(t1, t2)
      local t3, third = list(t2)
      assert.equal(t1, t3)
      assert.same(second, third)
      assert.is_nil(srv:requests()[1].fault)       -- a first page carries no token to repeat
      local log = srv:requests()
      assert.same({ action = "continue", rule = 0, applied = true, ["continue"] = t1 }, log[2].fault)
      assert.same({ action = "continue", rule = 0, applied = true, ["continue"] = t1 }, log[3].fault)
    end)

    it("repeat on a request without a token changes nothing and says so", function()
      srv:faults { { path = "limit=", ["continue"] = "repeat" } }
      local t1 = list()
      assert.is_string(t1)
      assert.same({ action = "continue", rule = 0, applied = false }, srv:requests()[1].fault)
    end)

    it("rewind: a valid token that leads back to the first object", function()
      srv:faults { { path = "limit=", ["continue"] = "rewind" } }
      local r1, first = list()
      local t_again, again = list(r1)
      assert.same(first, again)                    -- the objects already read, again
      assert.is_string(t_again)
      assert.is_true(srv:requests()[1].fault.applied)
      assert.equal(r1, srv:requests()[1].fault["continue"])
      assert.is_nil(srv:requests()[2].fault)
    end)

    it("does nothing to an answer that is not a list", function()
      srv:faults { { path = "cm-a", ["continue"] = "rewind" } }
      local res = srv:request("GET", CM .. "/cm-a")
      assert.equal(200, res.status)
      assert.is_nil(res.json.metadata["continue"])
      assert.same({ action = "continue", rule = 0, applied = false }, srv:requests()[1].fault)
    end)
  end)

  it("forgets rules and the log on reset", function()
    srv:faults{ { path = "cm-a", times = -1, status = { code = 500 } } }
    assert.equal(500, srv:request("GET", CM .. "/cm-a").status)
    assert.equal(500, srv:request("GET", CM .. "/cm-a").status)
    assert.same({ "status", "status" }, srv:fired())
    srv:reset{ BASIC, KUBEVIRT }
    assert.same({}, srv:control("GET", "/_fake/faults"))
    assert.same({}, srv:requests())
    assert.equal(200, srv:request("GET", CM .. "/cm-a").status)
  end)

  it("delays every API request, not control ones, with --latency-ms", function()
    -- Told apart by order, not speed (a loaded machine cannot make it flaky):
    -- a control request is answered while an API request sent before it is
    -- still held; the API request's delay has its exact lower bound.
    local slow = fake.start{ fixtures = { BASIC }, latency_ms = 2000 }
    local dir = assert(io.popen("mktemp -d")):read("l")
    finally(function() slow:stop(); os.execute("rm -rf '" .. dir .. "'") end)
    local t0 = now_ms()
    os.execute(("(curl -sS -o /dev/null -w '%%{http_code}' --cacert '%s' -H 'Authorization: Bearer %s' '%s' >'%s/status'; "
      .. "date +%%s%%3N >'%s/end') >/dev/null 2>&1 &"):format(slow.ca, slow.token, slow.url .. CM .. "/cm-a", dir, dir))
    local held = fake.poll(10, function() return slow:requests()[1] end)
    assert(held, "the API request never reached the server")
    slow:objects()
    local still = slow:requests()[1]
    assert.is_true(still.status == nil or still.status == json.null,
      "the API request was answered before a control request sent after it: " .. tostring(still.status))
    local ended = fake.poll(10, function()
      local f = io.open(dir .. "/end")
      local t = f and tonumber(f:read("a"))
      if f then f:close() end
      return t
    end)
    assert(ended, "the API request never ended")
    local f = assert(io.open(dir .. "/status"))
    assert.equal("200", f:read("a"))
    f:close()
    assert.is_true(ended - t0 >= 2000, "API request took " .. (ended - t0) .. " ms")
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
