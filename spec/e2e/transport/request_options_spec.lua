-- The C transport's handling of a request's options: the strings it reads
-- stay alive for the whole request (core/transport.c), and curl's options
-- are clamped or fail the request naming them (core/transport_http.c).
describe("core/transport.c: option strings stay alive for the whole request", function()
  local transport_harness = require("spec.helpers").transport
  local transport = require "cozy.transport"
  local json = require "cozy.json"
  local srv
  setup(function() srv = transport_harness.start() end)
  teardown(function() if srv then srv:stop() end end)

  -- The body and content type used to be popped right after they were read,
  -- "kept alive by the options table"; an on_retry that changes the table
  -- then let the collector free the body the retry sends (ASan: heap use
  -- after free; without it, the retry sends whatever reused the memory).
  it("sends the same body on a retry after on_retry dropped it from the options", function()
    local t = assert(transport.new { kubeconfig = srv.kubeconfig,
      retry = { max_attempts = 3, base_delay = 0.01, max_delay = 0.05 } })
    local filler = {}
    for i = 1, 2000 do filler[i] = ("%04d"):format(i) end
    local body = json.encode { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "kept-alive", namespace = "team-a" }, data = { big = table.concat(filler, "-") } }
    srv:clear_requests()
    srv:faults { { method = "POST", path = "namespaces/team-a/configmaps$", times = 1, status = { code = 500 } } }
    local opts = { body = body, content_type = "application/json", retry_safe = true }
    body = nil -- luacheck: ignore 311 (only opts holds the body from here on)
    opts.on_retry = function()
      opts.body, opts.content_type = nil, nil
      collectgarbage("collect")
      -- churn the heap so that a freed body would be overwritten
      for i = 1, 200 do local _ = ("x"):rep(8000 + i) end
      collectgarbage("collect")
    end
    local status, _, attempts = t:request("POST", "/api/v1/namespaces/team-a/configmaps", opts)
    t:close()
    assert.equal(201, status)
    assert.equal(2, #attempts)
    local posts = transport_harness.api_requests(srv, "POST", "namespaces/team%-a/configmaps$")
    assert.equal(2, #posts)
    assert.truthy(posts[1].fault, "the fault rule did not fire")
    assert.equal(posts[1].body, posts[2].body)
    assert.equal("application/json", posts[2].content_type)
    assert.equal(table.concat(filler, "-"), srv:object("ConfigMap", "team-a", "kept-alive").data.big)
  end)
end)

describe("core/transport_http.c: curl options", function()
  local transport_harness = require("spec.helpers").transport
  local transport = require "cozy.transport"
  local srv
  setup(function() srv = transport_harness.start() end)
  teardown(function() if srv then srv:stop() end end)

  -- (long)(1e300 * 1000) is undefined behaviour; on x86 it is LONG_MIN, which
  -- curl refuses with CURLE_BAD_FUNCTION_ARGUMENT, a result nobody checked.
  -- Seconds are now clamped, and a refused option would fail the request
  -- with a message naming it.
  it("takes a timeout too large for milliseconds in a long as no limit", function()
    local t = assert(transport.new { kubeconfig = srv.kubeconfig, request_timeout = 1e300, connect_timeout = 1e300 })
    local status, body, attempts = t:request("GET", "/api/v1/namespaces/cozy-system/configmaps/settings", {})
    t:close()
    assert.equal(200, status, attempts[1] and attempts[1].message)
    assert.matches('"name":"settings"', body)
  end)
end)
