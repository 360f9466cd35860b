-- No header injection (issue 13): values that go into the request line or a
-- header from Lua (method, path, query, content type) and a re-read token
-- file are checked for CR, LF, NUL and other control characters. Lua-given
-- values are a Lua argument error at request time, and nothing is sent; a
-- rotated token file that would inject is not used (the token loaded before
-- stays). Tokens at load time: spec/unit/kubeconfig_limits_spec.lua.
local transport_harness = require("spec.helpers").transport
local transport = require "cozy.transport"

local SETTINGS = "/api/v1/namespaces/cozy-system/configmaps/settings"

describe("header injection", function()
  local srv, dir, t
  setup(function()
    srv = transport_harness.start()
    dir = transport_harness.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)
  before_each(function()
    srv:clear_requests()
    t = assert(transport.new { kubeconfig = srv.kubeconfig })
  end)
  after_each(function() t:close() end)

  local function refused(pattern, ...)
    local ok, err = pcall(t.request, t, ...)
    assert.is_false(ok, "the request was accepted")
    assert.matches("bad argument", err)
    assert.matches(pattern, err)
    assert.same({}, srv:requests(), "a refused request reached the server")
  end

  it("refuses a content type with CR LF, LF or NUL, before sending", function()
    for _, ct in ipairs { "application/json\r\nX-Evil: 1", "application/json\nX-Evil: 1", "application/json\0x" } do
      refused("content_type contains a control character", "POST", "/api/v1/namespaces/team-a/configmaps",
        { body = "{}", content_type = ct })
    end
  end)

  it("refuses a content type longer than 200 bytes instead of cutting it", function()
    refused("content_type is longer than 200 bytes", "POST", "/api/v1/namespaces/team-a/configmaps",
      { body = "{}", content_type = "application/" .. ("x"):rep(200) })
  end)

  it("refuses a method that is not a word in capitals", function()
    refused("method must be an HTTP method", "GET / HTTP/1.1\r\nX-Evil: 1\r\n\r\nGET", SETTINGS, {})
    refused("method must be an HTTP method", "get", SETTINGS, {})
    refused("method must be an HTTP method", "", SETTINGS, {})
  end)

  it("refuses a path or query with a space or a control character", function()
    refused("path contains a space or a control character", "GET", SETTINGS .. " HTTP/1.1\r\nX-Evil: 1", {})
    refused("path contains a space or a control character", "GET", SETTINGS .. "\0", {})
    refused("query contains a space or a control character", "GET", SETTINGS, { query = "a=b\r\nX-Evil: 1" })
  end)

  it("still sends a request whose values are plain", function()
    local status = t:request("GET", SETTINGS, { query = "resourceVersion=0" })
    assert.equal(200, status)
    local status2 = t:request("POST", "/api/v1/namespaces/team-a/configmaps", {
      body = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"plain"}}',
      content_type = "application/json" })
    assert.equal(201, status2)
    assert.equal(2, #srv:requests())
  end)

  it("keeps the loaded token when the token file is rewritten with a line break inside", function()
    local tok = dir .. "/token"
    transport_harness.write_file(tok, transport_harness.TOKEN .. "\n")
    local kc = dir .. "/kubeconfig"
    local text = transport_harness.read_file(srv.kubeconfig)
    text = text:gsub("token: [^\n]*", "tokenFile: " .. tok)
    transport_harness.write_file(kc, text)
    local tt = assert(transport.new { kubeconfig = kc, token_refresh = 0.000001 })
    assert.equal("token-file", tt:info().auth)
    assert.equal(200, (tt:request("GET", SETTINGS, {})))
    -- rotated to a value that would add a header; token_refresh re-reads it
    -- before every request, and a 401 would make it try once more
    transport_harness.write_file(tok, "wrong\r\nX-Evil: 1\n")
    local status, _, attempts = tt:request("GET", SETTINGS, {})
    tt:close()
    assert.equal(200, status)
    assert.equal(1, #attempts)
    local got = transport_harness.api_requests(srv, "GET", "configmaps/settings$")
    assert.same({ 200, 200 }, { got[1].status, got[2].status })
  end)
end)
