-- Answers decoded by the transport (t:request and m:wait with `decode`): a
-- 2xx body is decoded straight from the transfer's buffer, with the
-- projection it was given; what is not JSON comes back as text with the
-- decoder's message, and cozy.kube turns that into an InvalidResponse.
local transport_harness = require("spec.helpers").transport
local transport = require "cozy.transport"
local json = require "cozy.json"
local kube = require "cozy.kube"

local SETTINGS = "/api/v1/namespaces/cozy-system/configmaps/settings"
local TEAM_A = "/api/v1/namespaces/team-a/configmaps"

describe("answers decoded by the transport", function()
  local srv, t
  transport_harness.fresh_server(function(s)
    srv = s
    t = assert(transport.new { kubeconfig = srv.kubeconfig, request_timeout = 5, qps = 0,
      retry = { max_attempts = 2, max_time = 10, base_delay = 0.01, max_delay = 0.1 } })
  end)
  after_each(function() t:close() end)

  local function respond(status, body)
    srv:faults { { method = "GET", path = "configmaps/settings$", times = -1, respond = { status = status, body = body } } }
  end

  -- t:request's results, and m:wait's for the same request (its id dropped)
  local function both(opts)
    local one = table.pack(t:request("GET", SETTINGS, opts))
    local m <close> = t:multi { concurrency = 1 }
    m:submit("GET", SETTINGS, opts)
    local batch = table.pack(m:wait())
    return one, table.pack(table.unpack(batch, 2, batch.n))
  end

  it("hands over a 2xx answer decoded, as json.decode would", function()
    for _, r in ipairs { both { decode = true } } do
      assert.equal(200, r[1])
      assert.equal("settings", r[2].metadata.name)
      assert.equal(json.object_mt, getmetatable(r[2]))
      assert.equal("table", type(r[3])) -- the attempts
      assert.is_nil(r[5])               -- no decode error
    end
  end)

  it("decodes only what the projection keeps", function()
    for _, r in ipairs { both { decode = { metadata = { name = true } } } } do
      assert.same({ name = "settings" }, setmetatable(r[2].metadata, nil))
      assert.is_nil(r[2].data)
      assert.is_nil(r[2].kind)
    end
  end)

  it("without decode, or for a non-2xx answer, hands over the text", function()
    for _, r in ipairs { both {} } do
      assert.equal("string", type(r[2]))
      assert.equal("settings", json.decode(r[2]).metadata.name)
    end
    respond(503, '{"kind":"Status","code":503}')
    for _, r in ipairs { both { decode = true } } do
      assert.equal(503, r[1])
      assert.equal('{"kind":"Status","code":503}', r[2])
      assert.is_nil(r[5])
    end
    assert.is_true(#srv:fired() >= 2, "the 503 rule never fired")
  end)

  it("an empty 2xx body is nil", function()
    respond(200, "")
    for _, r in ipairs { both { decode = true } } do
      assert.equal(200, r[1])
      assert.is_nil(r[2])
      assert.is_nil(r[5])
    end
    assert.equal(2, #srv:fired())
  end)

  it("a 2xx body that is not JSON comes back as text, with where the decoder stopped", function()
    respond(200, '{"kind":"ConfigMap",')
    for _, r in ipairs { both { decode = true } } do
      assert.equal(200, r[1])
      assert.equal('{"kind":"ConfigMap",', r[2])
      assert.matches("^cozy%.json: .* at byte 21$", r[5])
    end
    assert.equal(2, #srv:fired())
  end)

  it("refuses a decode option that is neither true nor a table", function()
    for _, bad in ipairs { false, "yes", 1 } do
      local ok, err = pcall(t.request, t, "GET", SETTINGS, { decode = bad })
      assert.is_false(ok)
      assert.matches("option 'decode' must be true or a projection table", err, 1, true)
      local m <close> = t:multi { concurrency = 1 }
      ok, err = pcall(m.submit, m, "GET", SETTINGS, { decode = bad })
      assert.is_false(ok)
      assert.matches("option 'decode' must be true or a projection table", err, 1, true)
    end
    assert.same({}, srv:requests { path = "configmaps/settings$" })
  end)
end)

describe("cozy.kube and an answer that is not JSON", function()
  local srv, client
  transport_harness.fresh_server(function(s)
    srv = s
    client = transport_harness.connect(srv)
  end)
  after_each(function() client:close() end)

  local function assert_not_json(err, method)
    assert.is_true(kube.is_error(err), tostring(err))
    assert.equal("InvalidResponse", err.reason)
    assert.equal(method, err.method)
    assert.equal(200, err.code)
    assert.matches("the server's answer is not JSON: cozy.json: ", err.message, 1, true)
  end

  it("a read answered with a truncated page is an InvalidResponse", function()
    srv:faults { { method = "GET", path = "/team-a/configmaps\\?", respond = { body = '{"kind":"ConfigMapList","items":[' } } }
    local ok, err = pcall(function()
      for _ in client:resource("v1", "configmaps"):list { namespace = "team-a", limit = 2 } do end
    end)
    assert.is_false(ok)
    assert_not_json(err, "GET")
    assert.matches("at byte 34", err.message, 1, true)
    assert.equal(TEAM_A .. "?limit=2", err.path)
    assert.same({ "respond" }, srv:fired())
  end)

  it("a write of a batch answered with text is an InvalidResponse, and stops the batch", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings$", respond = { body = "ok" } } }
    local cms = client:resource("v1", "configmaps")
    local items = { cms:get("cozy-system", "settings") }
    local ok, err = pcall(cms.update_each, cms, function() return table.remove(items) end, function(cm)
      cm.data.mode = "changed"
      return true
    end, { concurrency = 2 })
    assert.is_false(ok)
    assert_not_json(err, "PATCH")
    assert.same({ "respond" }, srv:fired())
  end)
end)
