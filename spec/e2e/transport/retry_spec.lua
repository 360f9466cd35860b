-- Retries, one fault rule per behaviour (docs/transport.md): every retry is
-- visible in the request log, no write is lost and none is applied twice.
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local sys = require "cozy.sys"

local SETTINGS = "/api/v1/namespaces/cozy%-system/configmaps/settings$"

describe("cozy.kube retries", function()
  local srv, client, cms, captured
  transport_harness.fresh_server(function(s)
    srv = s
    captured = harness.capture_log(1)
    client = transport_harness.connect(srv, { log = captured.log })
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  local function statuses(entries)
    local out = {}
    for i, e in ipairs(entries) do out[i] = e.status end
    return out
  end

  it("retries a GET answered 503 three times with Retry-After, honouring it", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 3,
      status = { code = 503, retry_after = 1 } } }
    local t0 = sys.monotime()
    local cm = cms:get("cozy-system", "settings")
    local took = sys.monotime() - t0
    assert.equal("prod", cm.data.mode)
    assert.is_true(took >= 2.9, "Retry-After: 1 was not honoured (took " .. took .. "s)")
    assert.same({ 503, 503, 503, 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    assert.equal(4, client.stats.requests)
    assert.equal(3, client.stats.retries)
    assert.equal(3, captured.count("warn", "retrying"))
    assert.same({ "status", "status", "status" }, srv:fired())
  end)

  it("retries a 429 even on a write that is not retry-safe (it was not processed)", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 1,
      status = { code = 429, retry_after = 0 } } }
    local cm = cms:merge_patch("cozy-system", "settings", { data = { count = "2" } })
    assert.equal("2", cm.data.count)
    assert.same({ 429, 200 }, statuses(transport_harness.api_requests(srv, "PATCH", SETTINGS)))
    assert.same({ "status" }, srv:fired())
    assert.equal("2", transport_harness.object(srv, "cozy-system", "settings").data.count)
  end)

  it("does not retry a 503 on a write that is not retry-safe, and says so", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 1,
      status = { code = 503, retry_after = 0 } } }
    local ok, err = pcall(cms.merge_patch, cms, "cozy-system", "settings", { data = { count = "2" } })
    assert.is_false(ok)
    assert.equal(503, err.code)
    assert.equal(1, #err.attempts)
    assert.same({ 503 }, statuses(transport_harness.api_requests(srv, "PATCH", SETTINGS)))
    assert.same({ "status" }, srv:fired())
    assert.equal("1", transport_harness.object(srv, "cozy-system", "settings").data.count)
  end)

  it("retries a 5xx on a JSON patch guarded by a test, applying it once", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 2, status = { code = 500 } } }
    local rv = transport_harness.object(srv, "cozy-system", "settings").metadata.resourceVersion
    local cm = cms:json_patch("cozy-system", "settings", {
      { op = "test", path = "/metadata/resourceVersion", value = rv },
      { op = "replace", path = "/data/count", value = "5" } })
    assert.equal("5", cm.data.count)
    assert.same({ 500, 500, 200 }, statuses(transport_harness.api_requests(srv, "PATCH", SETTINGS)))
    assert.same({ "status", "status" }, srv:fired())
  end)

  it("retries a GET whose connection was reset", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, reset = true } }
    local cm = cms:get("cozy-system", "settings")
    assert.equal("prod", cm.data.mode)
    assert.same({ 0, 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    assert.same({ "reset" }, srv:fired())
    assert.equal(1, client.stats.retries)
    assert.matches("ConnectionReset", captured.text()..(" "):rep(0)) -- the retry line names the reason
  end)

  it("does not retry a reset merge patch (its fate is unknown) and reports it", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 1, reset = true } }
    local ok, err = pcall(cms.merge_patch, cms, "cozy-system", "settings", { data = { count = "9" } })
    assert.is_false(ok)
    assert.equal(0, err.code)
    assert.equal("ConnectionReset", err.reason)
    assert.equal(1, #transport_harness.api_requests(srv, "PATCH", SETTINGS))
    assert.same({ "reset" }, srv:fired())
  end)

  it("retries a GET that outlives the request timeout", function()
    client:close()
    client = transport_harness.connect(srv, { log = captured.log, request_timeout = 0.5 })
    cms = client:resource("v1", "configmaps")
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, delay_ms = 2000 } }
    local cm = cms:get("cozy-system", "settings")
    assert.equal("prod", cm.data.mode)
    local reqs = transport_harness.api_requests(srv, "GET", SETTINGS)
    assert.equal(2, #reqs)
    assert.same({ "delay" }, srv:fired())
    assert.is_nil(reqs[2].fault)
    assert.equal(1, client.stats.retries)
    -- the first attempt was cut at the timeout (the 2 s delay would have
    -- answered it), and the retry says so
    assert.equal(1, captured.count("warn", "retrying"))
    local retry = captured.lines[#captured.lines]
    assert.same({ "retrying API request", "Timeout" }, { retry.message, retry.fields.reason })
  end)

  it("gives up within the attempt bound and reports every attempt", function()
    client:close()
    client = transport_harness.connect(srv, { log = captured.log,
      retry = { max_attempts = 3, max_time = 30, base_delay = 0.01, max_delay = 0.05 } })
    cms = client:resource("v1", "configmaps")
    srv:faults { { method = "GET", path = "configmaps/settings", times = 10, status = { code = 502 } } }
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(502, err.code)
    assert.equal(3, #err.attempts)
    assert.equal(502, err.attempts[1].code)
    assert.equal("BadGateway", err.attempts[1].reason)
    assert.equal("injected fault", err.attempts[3].message)
    assert.is_number(err.attempts[1].after_s)
    assert.is_nil(err.attempts[3].after_s)
    assert.matches("#1 502.-#2 502.-#3 502", tostring(err))
    assert.equal(3, #transport_harness.api_requests(srv, "GET", SETTINGS))
    assert.same({ "status", "status", "status" }, srv:fired())
  end)

  it("gives up within the time bound", function()
    client:close()
    client = transport_harness.connect(srv, { log = captured.log,
      retry = { max_attempts = 100, max_time = 1.5, base_delay = 0.01, max_delay = 5 } })
    cms = client:resource("v1", "configmaps")
    srv:faults { { method = "GET", path = "configmaps/settings", times = 100,
      status = { code = 503, retry_after = 1 } } }
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(2, #err.attempts) -- a third would start after the 1.5 s bound
    assert.same({ "status", "status" }, srv:fired())
  end)

  -- By default a refused connection is retried for refused_time (5 s), not
  -- the 120 s of 5xx and 429 (docs/transport.md, "Retries"; client-go does
  -- not retry it at all). The watch's 60 s deadline tells the two apart
  -- whatever the machine's speed: under the old rule the retries (about
  -- 90 s of backoff) run into it and the request ends DeadlineExceeded.
  it("fails a refused connection within refused_time by default, while a 503 keeps its ten attempts", function()
    local kube = require "cozy.kube"
    local proc = require "cozy.proc"
    local kc = transport_harness.read_file(srv.kubeconfig):gsub("https://127%.0%.0%.1:%d+", "https://127.0.0.1:1")
    local path = os.tmpname()
    transport_harness.write_file(path, kc)
    finally(function() os.remove(path) end)
    local function watched(c, fn)
      local w = proc.watch { deadline = sys.monotime() + 60 }
      local res = table.pack(pcall(fn, c:resource("v1", "configmaps")))
      w:close()
      c:close()
      return table.unpack(res, 1, res.n)
    end
    -- the production defaults: no retry option
    local ok, err = watched(kube.connect { kubeconfig = path, log = captured.log }, function(r)
      return r:get("cozy-system", "settings")
    end)
    assert.is_false(ok)
    assert.same({ 0, "ConnectionRefused" }, { err.code, err.reason })
    assert.is_true(#err.attempts >= 2 and #err.attempts < 10, #err.attempts .. " attempts")
    local waited = 0
    for _, a in ipairs(err.attempts) do waited = waited + (a.after_s or 0) end
    assert.is_true(waited <= 5, "waited " .. waited .. " s between attempts")
    assert.is_nil(err.attempts[#err.attempts].after_s)
    -- a live server's 503 keeps the default budget: ten attempts
    srv:faults { { method = "GET", path = "configmaps/settings", times = 9, status = { code = 503, retry_after = 0 } } }
    local ok2, cm = watched(kube.connect { kubeconfig = srv.kubeconfig, log = captured.log }, function(r)
      return r:get("cozy-system", "settings")
    end)
    assert.is_true(ok2, tostring(cm))
    assert.equal("prod", cm.data.mode)
    assert.equal(9, #srv:fired())
  end)

  it("retries a refused connection on reads, up to the bound, reporting each attempt", function()
    -- a port nobody listens on: the kubeconfig of srv, pointed elsewhere
    local kc = transport_harness.read_file(srv.kubeconfig):gsub("https://127%.0%.0%.1:%d+", "https://127.0.0.1:1")
    local path = os.tmpname()
    transport_harness.write_file(path, kc)
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log,
      retry = { max_attempts = 3, max_time = 30, base_delay = 0.01, max_delay = 0.02 } })
    local r = c:resource("v1", "configmaps")
    local ok, err = pcall(r.get, r, "cozy-system", "settings")
    os.remove(path)
    assert.is_false(ok)
    assert.equal(0, err.code)
    assert.equal("ConnectionRefused", err.reason)
    assert.equal(3, #err.attempts)
    assert.equal(2, captured.count("warn", "retrying"))
    -- nothing was sent, so even a write that is not retry-safe is retried
    local ok2, err2 = pcall(r.merge_patch, r, "cozy-system", "settings", { data = { x = "1" } })
    assert.is_false(ok2)
    assert.equal(3, #err2.attempts)
    c:close()
  end)

  describe("create", function()
    it("is retried after a reset and lands once", function()
      srv:faults { { method = "POST", path = "configmaps", times = 1, reset = true } }
      local cm = cms:create { metadata = { name = "fresh", namespace = "team-a" }, data = { x = "1" } }
      assert.equal("1", cm.data.x)
      assert.same({ 0, 201 }, statuses(transport_harness.api_requests(srv, "POST", "team%-a/configmaps$")))
      assert.same({ "reset" }, srv:fired())
    end)

    it("resolves AlreadyExists after an attempt that landed by reading the object back", function()
      client:close()
      -- the first attempt times out at 0.3 s; the server creates the object at
      -- 0.5 s; the retry goes out after a backoff of 1 to 2 s (base 2 with
      -- jitter [0.5, 1.5), capped at 2), so at least 0.8 s after the create
      client = transport_harness.connect(srv, { log = captured.log, request_timeout = 0.3,
        retry = { max_attempts = 4, max_time = 30, base_delay = 2, max_delay = 2 } })
      cms = client:resource("v1", "configmaps")
      srv:faults { { method = "POST", path = "configmaps", times = 1, delay_ms = 500 } }
      local cm = cms:create { metadata = { name = "slow", namespace = "team-a", labels = { l = "v" } },
        data = { x = "1" } }
      assert.equal("1", cm.data.x)
      assert.same({ 201, 409 }, statuses(transport_harness.api_requests(srv, "POST", "team%-a/configmaps$")))
      assert.equal(1, #transport_harness.api_requests(srv, "GET", "team%-a/configmaps/slow$"))
      assert.equal(1, captured.count("warn", "earlier attempt landed"))
      assert.same({ "delay" }, srv:fired())
    end)

    it("raises AlreadyExists when the object read back differs from what was sent", function()
      cms:create { metadata = { name = "taken", namespace = "team-a" }, data = { x = "other" } }
      srv:clear_requests()
      srv:faults { { method = "POST", path = "configmaps", times = 1, reset = true } }
      local ok, err = pcall(cms.create, cms, { metadata = { name = "taken", namespace = "team-a" },
        data = { x = "mine" } })
      assert.is_false(ok)
      assert.equal("AlreadyExists", err.reason)
      assert.matches("read back differs", err.message)
      assert.same({ 0, 409 }, statuses(transport_harness.api_requests(srv, "POST", "team%-a/configmaps$")))
      assert.same({ "reset" }, srv:fired())
      assert.equal("other", transport_harness.object(srv, "team-a", "taken").data.x)
    end)

    it("never retries a generateName create after an uncertain attempt", function()
      srv:faults { { method = "POST", path = "configmaps", times = 1, reset = true } }
      local ok, err = pcall(cms.create, cms, { metadata = { generateName = "gen-", namespace = "team-a" } })
      assert.is_false(ok)
      assert.equal(0, err.code)
      assert.equal(1, #transport_harness.api_requests(srv, "POST", "team%-a/configmaps$"))
      assert.same({ "reset" }, srv:fired())
    end)
  end)
end)
