-- Connections (docs/transport.md, "Connections"): reads and writes that are
-- safe to resend go out on kept-alive connections; any other write on a
-- connection opened for it. Which connection carried a request is read from
-- the fake's request log (`conn`: the client's address:port).
local transport_harness = require("spec.helpers").transport
local transport = require "cozy.transport"

local SETTINGS = "/api/v1/namespaces/cozy-system/configmaps/settings"
local MERGE = "application/merge-patch+json"

local function connect(srv, opts)
  local o = { kubeconfig = srv.kubeconfig, request_timeout = 5, qps = 0,
    retry = { max_attempts = 4, max_time = 30, base_delay = 0.01, max_delay = 1 } }
  for k, v in pairs(opts or {}) do o[k] = v end
  return assert(transport.new(o))
end

local function conns(log)
  local out = {}
  for i, e in ipairs(log) do out[i] = e.conn end
  return out
end

local function count(srv)
  return transport_harness.object(srv, "cozy-system", "settings").data.count
end

describe("transport connections", function()
  local srv, t
  transport_harness.fresh_server(function(s)
    srv = s
    t = connect(srv)
  end)
  after_each(function() t:close() end)

  it("logs the client's address:port of every request", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    local log = srv:requests { path = "configmaps/settings$" }
    assert.equal(1, #log)
    assert.matches("^127%.0%.0%.1:%d+$", log[1].conn)
  end)

  it("carries reads on one kept-alive connection", function()
    for _ = 1, 4 do assert.equal(200, (t:request("GET", SETTINGS, {}))) end
    local c = conns(srv:requests { method = "GET", path = "configmaps/settings$" })
    assert.equal(4, #c)
    assert.same({ c[1], c[1], c[1], c[1] }, c)
  end)

  it("carries writes guarded by a precondition (retry_safe) on the kept-alive connection", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    for i = 2, 4 do
      assert.equal(200, (t:request("PATCH", SETTINGS, { body = '{"data":{"count":"' .. i .. '"}}',
        content_type = MERGE, retry_safe = true })))
    end
    local log = srv:requests { path = "configmaps/settings$" }
    assert.same({ "GET", "PATCH", "PATCH", "PATCH" }, { log[1].method, log[2].method, log[3].method, log[4].method })
    local c = conns(log)
    assert.same({ c[1], c[1], c[1], c[1] }, c)
    assert.equal("4", count(srv))
  end)

  it("opens a connection of its own for every unguarded write", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    for i = 2, 4 do
      assert.equal(200, (t:request("PATCH", SETTINGS, { body = '{"data":{"count":"' .. i .. '"}}',
        content_type = MERGE })))
    end
    local c = conns(srv:requests { path = "configmaps/settings$" })
    assert.equal(4, #c)
    local seen = {}
    for _, conn in ipairs(c) do
      assert.is_nil(seen[conn], "a connection carried two requests, one an unguarded write: " .. conn)
      seen[conn] = true
    end
  end)

  it("a read and a guarded write share the pool with a batch (t:multi)", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    local m <close> = t:multi { concurrency = 1 }
    m:submit("PATCH", SETTINGS, { body = '{"data":{"count":"7"}}', content_type = MERGE, retry_safe = true })
    local _, status = m:wait()
    assert.equal(200, status)
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    local c = conns(srv:requests { path = "configmaps/settings$" })
    assert.same({ c[1], c[1], c[1] }, c)
  end)

  -- libcurl re-sends an attempt by itself when the kept-alive connection it
  -- reused dies before any byte of the answer. The fake's `reset` reads the
  -- request, then drops the connection: exactly that case.
  it("lets libcurl re-send a read whose reused connection died (one attempt, two requests)", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))   -- the connection to reuse
    srv:clear_requests()
    srv:faults { { method = "GET", path = "configmaps/settings$", times = 1, reset = true } }
    local status, _, attempts = t:request("GET", SETTINGS, {})
    assert.equal(200, status)
    assert.equal(1, #attempts)
    assert.same({ "reset" }, srv:fired())
    local log = srv:requests { path = "configmaps/settings$" }
    assert.equal(2, #log)
    assert.are_not.equal(log[1].conn, log[2].conn)
  end)

  it("refuses libcurl's own re-send of a guarded write: the retry rule decides, visibly", function()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
    srv:clear_requests()
    srv:faults { { method = "PATCH", path = "configmaps/settings$", times = 1, reset = true } }
    local asked, retried = {}, {}
    local status, _, attempts = t:request("PATCH", SETTINGS, { body = '{"data":{"count":"5"}}',
      content_type = MERGE, retry_safe = true,
      before_attempt = function(info) asked[#asked + 1] = info.attempt end,
      on_retry = function(a) retried[#retried + 1] = a.reason end })
    assert.equal(200, status)
    assert.equal(2, #attempts)
    assert.same({ 0, "ConnectionReset" }, { attempts[1].code, attempts[1].reason })
    assert.matches("re%-send of the write was refused", attempts[1].message)
    assert.same({ 1, 2 }, asked)            -- the guard saw the second send
    assert.same({ "ConnectionReset" }, retried)
    assert.same({ "reset" }, srv:fired())
    assert.equal(2, #srv:requests { method = "PATCH", path = "configmaps/settings$" })
    assert.equal("5", count(srv))
  end)

  it("never re-sends an unguarded write: it went out on its own connection, and failed", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings$", times = 1, reset = true } }
    local status, _, attempts = t:request("PATCH", SETTINGS, { body = '{"data":{"count":"6"}}',
      content_type = MERGE })
    assert.equal(0, status)
    assert.equal(1, #attempts)
    assert.equal("ConnectionReset", attempts[1].reason)
    assert.same({ "reset" }, srv:fired())
    assert.equal(1, #srv:requests { method = "PATCH", path = "configmaps/settings$" })
  end)
end)
