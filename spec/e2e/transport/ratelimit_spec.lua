-- The client-side token bucket: `burst` requests at once, then `qps` per second.
local transport_harness = require("spec.helpers").transport
local sys = require "cozy.sys"

describe("cozy.kube rate limit", function()
  local srv
  setup(function() srv = transport_harness.start() end)
  teardown(function() if srv then srv:stop() end end)

  local function timed_gets(client, n)
    local cms = client:resource("v1", "configmaps")
    local t0 = sys.monotime()
    for _ = 1, n do cms:get("cozy-system", "settings") end
    return sys.monotime() - t0
  end

  it("spaces requests beyond the burst at 1/qps", function()
    local c = transport_harness.connect(srv, { qps = 10, burst = 2 })
    local took = timed_gets(c, 12) -- 2 from the burst, then 10 at 0.1 s
    assert.is_true(took >= 0.95, "too fast: " .. took)
    c:close()
  end)

  -- Under a watch, a wait for the limiter ends at the watch's deadline with
  -- DeadlineExceeded and nothing sent. At 0.001 qps a token is 1000 s away,
  -- so the deadlines below tell "did not wait" from "waited", whatever the
  -- machine's speed: the first only bounds the spec if the burst were
  -- throttled, the second ends the wait the 11th request must make.
  it("lets a burst through without waiting, and makes the next request wait", function()
    local kube = require "cozy.kube"
    local proc = require "cozy.proc"
    local c = transport_harness.connect(srv, { qps = 0.001, burst = 10 })
    local cms = c:resource("v1", "configmaps")
    srv:clear_requests()
    local function watched(seconds, fn)
      local w = proc.watch { deadline = sys.monotime() + seconds }
      local res = table.pack(pcall(fn))
      w:close()
      return table.unpack(res, 1, res.n)
    end
    for i = 1, 10 do
      local ok, err = watched(10, function() return cms:get("cozy-system", "settings") end)
      assert(ok, ("request %d of the burst waited for the limiter: %s"):format(i, tostring(err)))
    end
    local ok, err = watched(0.2, function() return cms:get("cozy-system", "settings") end)
    c:close()
    assert.is_false(ok, "the 11th request found a token: the burst is larger than 10")
    assert.is_true(kube.is_error(err), tostring(err))
    assert.same({ 0, "DeadlineExceeded" }, { err.code, err.reason })
    assert.equal(10, #transport_harness.api_requests(srv, "GET"))
  end)

  it("counts retries against the limit too", function()
    local c = transport_harness.connect(srv, { qps = 5, burst = 1,
      retry = { max_attempts = 5, max_time = 30, base_delay = 0.001, max_delay = 0.001 } })
    srv:clear_requests()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 3, status = { code = 503 } } }
    local took = timed_gets(c, 1) -- 4 requests: 3 waits of 0.2 s
    assert.is_true(took >= 0.55, "retries bypassed the limit: " .. took)
    assert.same({ "status", "status", "status" }, srv:fired())
    assert.equal(4, c.stats.requests)
    c:close()
  end)

  it("documents its defaults", function()
    local kube = require "cozy.kube"
    assert.equal(1000, kube.defaults.qps)
    assert.equal(2000, kube.defaults.burst)
    local c = transport_harness.connect(srv)
    assert.equal(1000, c.info.qps)
    assert.equal(2000, c.info.burst)
    c:close()
  end)
end)
