-- Batches (docs/engine-api.md, cozy.transport, t:multi): independent requests
-- in parallel with bounded concurrency, each under t:request's rules. What
-- was in flight when is read from the fake's request log: `at` is when a
-- request arrived, and --latency-ms holds every request that long.
local transport_harness = require("spec.helpers").transport
local cli = require("spec.helpers").cli
local json = require "cozy.json"
local proc = require "cozy.proc"
local sys = require "cozy.sys"
local transport = require "cozy.transport"

local MERGE = "application/merge-patch+json"
local CHILD = "spec/fixtures/transport/interrupt_child.lua"

local function cm_path(ns, i)
  return ("/api/v1/namespaces/%s/configmaps/cm-%02d"):format(ns, i)
end

local function connect(srv, opts)
  local o = { kubeconfig = srv.kubeconfig, request_timeout = 5, qps = 0,
    retry = { max_attempts = 4, max_time = 30, base_delay = 0.01, max_delay = 5 } }
  for k, v in pairs(opts or {}) do o[k] = v end
  return assert(transport.new(o))
end

-- Every result of m, by id: { status, body, attempts, warnings, order }.
local function drain(m)
  local out, order = {}, 0
  while true do
    local id, status, body, attempts, warnings = m:wait()
    if id == nil then return out end
    order = order + 1
    assert.is_nil(out[id], "a result handed out twice")
    out[id] = { status = status, body = body, attempts = attempts, warnings = warnings, order = order }
  end
end

local function arrivals(log)
  local at = {}
  for i, e in ipairs(log) do at[i] = e.at end
  table.sort(at)
  return at
end

local function pending(entry)
  return entry.status == nil or entry.status == json.null
end

describe("t:multi", function()
  local srv, t
  transport_harness.fresh_server(function(s)
    srv = s
    t = connect(srv)
  end)
  after_each(function() t:close() end)

  it("completes N requests at concurrency K with each one's own result", function()
    local m <close> = t:multi { concurrency = 3 }
    local want = {}
    for i = 0, 11 do
      local id = m:submit("PATCH", cm_path("team-a", i), { body = ('{"data":{"i":"v%d"}}'):format(i),
        content_type = MERGE, retry_safe = true })
      want[id] = i
    end
    for i = 0, 3 do want[m:submit("GET", cm_path("team-b", i), {})] = "b" .. i end
    assert.equal(16, m:pending())
    local got = drain(m)
    assert.equal(0, m:pending())
    assert.is_nil(m:wait())
    for id, what in pairs(want) do
      local r = got[id]
      assert.is_table(r, "no result for request " .. id)
      assert.equal(200, r.status)
      assert.equal(1, #r.attempts)
      local obj = json.decode(r.body)
      if type(what) == "number" then
        assert.same({ ("cm-%02d"):format(what), "v" .. what }, { obj.metadata.name, obj.data.i })
        assert.equal("v" .. what, srv:object("ConfigMap", "team-a", ("cm-%02d"):format(what)).data.i)
      else
        assert.same({ "team-b", "cm-0" .. what:sub(2) }, { obj.metadata.namespace, obj.metadata.name })
      end
    end
    assert.equal(16, #transport_harness.api_requests(srv))
  end)

  -- t:request and m:submit read their arguments with one parser
  -- (cozy_request_read): each bad call is refused the same way by both.
  it("checks its arguments as t:request does, with the same messages", function()
    assert.has_error(function() t:multi { concurrency = 0 } end,
      "option 'concurrency' must be an integer from 1 to 64")
    assert.has_error(function() t:multi { concurrency = 2.5 } end,
      "option 'concurrency' must be an integer from 1 to 64")
    local m <close> = t:multi {}
    local cases = {
      { { "get", "/api", {} }, "method must be an HTTP method in capitals" },
      { { "GET", "api", {} }, "path must start with '/'" },
      { { "GET", "/api\r\nX: y", {} }, "path contains a space or a control character" },
      { { "GET", "/api", { query = "a b" } }, "query contains a space or a control character" },
      { { "PATCH", "/api", { content_type = "a\nb", body = "{}" } }, "content_type contains a control character" },
      { { "GET", "/api", { before_attempt = 1 } }, "option 'before_attempt' must be a function" },
      { { "GET", "/api", { on_retry = 1 } }, "option 'on_retry' must be a function" },
      { { "POST", "/api", { body = 1 } }, "option 'body' must be a string" },
      { { "GET", "/api", { timeout = -1 } }, "option 'timeout' must be >= 0" },
      { { "GET", "/api", { decode = false } }, "option 'decode' must be true or a projection table" },
    }
    local calls = {
      request = function(args) return t:request(table.unpack(args)) end,
      submit = function(args) return m:submit(table.unpack(args)) end,
    }
    for _, case in ipairs(cases) do
      for name, call in pairs(calls) do
        local ok, err = pcall(call, case[1])
        assert.is_false(ok, name .. " accepted what should fail with: " .. case[2])
        assert.truthy(tostring(err):find(case[2], 1, true), name .. ": " .. tostring(err))
      end
    end
    assert.equal(0, m:pending())
    m:close()
    assert.has_error(function() m:submit("GET", "/api", {}) end, "calling 'submit' on bad self (batch is closed)")
    assert.equal(0, m:pending())
  end)

  it("shares the client's rate limiter across the batch: one token per attempt", function()
    local slow = connect(srv, { qps = 10, burst = 2 })
    local m <close> = slow:multi { concurrency = 6 }
    for i = 0, 5 do m:submit("GET", cm_path("team-a", i), {}) end
    local t0 = sys.monotime()
    local got = drain(m)
    local took = sys.monotime() - t0
    slow:close()
    for id = 1, 6 do assert.equal(200, got[id].status) end
    local at = arrivals(transport_harness.api_requests(srv))
    assert.equal(6, #at)
    -- two from the burst at once, then one every 0.1 s: the sixth token comes 0.4 s in
    assert.is_true(took >= 0.38, "the batch bypassed the limiter: " .. took)
    assert.is_true(at[6] - at[3] >= 0.25, ("requests 3 to 6 came within %.3f s"):format(at[6] - at[3]))
  end)

  it("follows t:request's retry rule for each request", function()
    srv:faults {
      { method = "PATCH", path = "team-a/configmaps/cm-00$", times = 1, status = { code = 429, retry_after = 0 } },
      { method = "PATCH", path = "team-a/configmaps/cm-01$", times = 1, status = 503 },
      { method = "PATCH", path = "team-a/configmaps/cm-02$", times = 1, status = 503 },
      { method = "GET", path = "team-a/configmaps/cm-03$", times = 1, status = 503 },
    }
    local m <close> = t:multi { concurrency = 4 }
    local unguarded_429 = m:submit("PATCH", cm_path("team-a", 0), { body = '{"data":{"i":"x"}}', content_type = MERGE })
    local unguarded_503 = m:submit("PATCH", cm_path("team-a", 1), { body = '{"data":{"i":"x"}}', content_type = MERGE })
    local guarded_503 = m:submit("PATCH", cm_path("team-a", 2), { body = '{"data":{"i":"x"}}', content_type = MERGE,
      retry_safe = true })
    local read_503 = m:submit("GET", cm_path("team-a", 3), {})
    local got = drain(m)
    assert.same({ 200, 2, 429 }, { got[unguarded_429].status, #got[unguarded_429].attempts, got[unguarded_429].attempts[1].code })
    assert.same({ 503, 1 }, { got[unguarded_503].status, #got[unguarded_503].attempts })
    assert.same({ 200, 2, 503 }, { got[guarded_503].status, #got[guarded_503].attempts, got[guarded_503].attempts[1].code })
    assert.same({ 200, 2 }, { got[read_503].status, #got[read_503].attempts })
    assert.is_number(got[guarded_503].attempts[1].after_s)
    assert.same({ "status", "status", "status", "status" }, srv:fired())
  end)

  it("retries one request without holding up the others", function()
    srv:faults { { method = "GET", path = "team-a/configmaps/cm-00$", times = 1,
      status = { code = 503, retry_after = 1 } } }
    local m <close> = t:multi { concurrency = 2 }
    local slow = m:submit("GET", cm_path("team-a", 0), {})
    for i = 1, 7 do m:submit("GET", cm_path("team-a", i), {}) end
    local t0 = sys.monotime()
    local got = drain(m)
    local took = sys.monotime() - t0
    assert.equal(8, got[slow].order)          -- handed out last: the others did not wait for it
    assert.same({ 200, 2, 1 }, { got[slow].status, #got[slow].attempts, got[slow].attempts[1].after_s })
    for id = 2, 8 do assert.same({ 200, 1 }, { got[id].status, #got[id].attempts }) end
    local log = transport_harness.api_requests(srv, "GET")
    assert.equal(9, #log)
    local retry_at = log[#log].at
    assert.matches("cm%-00$", log[#log].path)
    for i = 1, #log - 1 do assert.is_true(log[i].at < retry_at) end
    assert.is_true(took >= 0.95, "the retry did not wait its Retry-After: " .. took)
    assert.same({ "status" }, srv:fired())
  end)

  it("refuses libcurl's own re-send of a guarded write on a reused connection", function()
    local m <close> = t:multi { concurrency = 1 }
    m:submit("GET", cm_path("team-a", 0), {})             -- opens the connection to reuse
    assert.equal(200, select(2, m:wait()))
    srv:clear_requests()
    srv:faults { { method = "PATCH", path = "team-a/configmaps/cm-01$", times = 1, reset = true } }
    local asked = 0
    local id = m:submit("PATCH", cm_path("team-a", 1), { body = '{"data":{"i":"z"}}', content_type = MERGE,
      retry_safe = true, before_attempt = function() asked = asked + 1 end })
    local got = drain(m)
    assert.same({ 200, 2, "ConnectionReset" }, { got[id].status, #got[id].attempts, got[id].attempts[1].reason })
    assert.equal(2, asked)
    assert.same({ "reset" }, srv:fired())
    local log = transport_harness.api_requests(srv, "PATCH")
    assert.equal(2, #log)
    assert.equal("z", srv:object("ConfigMap", "team-a", "cm-01").data.i)
  end)

  it("replays each request once after a 401 with a rotated token file", function()
    local dir = transport_harness.tmpdir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local tf, kc = dir .. "/token", dir .. "/kubeconfig"
    transport_harness.write_file(tf, "old-token\n")
    transport_harness.write_file(kc, table.concat({ "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts:", "- name: c", "  context: {cluster: k, user: u}",
      "clusters:", "- name: k", "  cluster:", "    server: " .. srv.url, "    certificate-authority: " .. srv.ca,
      "users:", "- name: u", "  user:", "    tokenFile: " .. tf, "" }, "\n"))
    local rotated = connect(srv, { kubeconfig = kc })
    transport_harness.write_file(tf, transport_harness.TOKEN .. "\n")   -- rotated after the client read it
    local m <close> = rotated:multi { concurrency = 2 }
    m:submit("GET", cm_path("team-a", 0), {})
    m:submit("GET", cm_path("team-a", 1), {})
    local got = drain(m)
    rotated:close()
    -- both went out with the old token before either was answered; each is
    -- replayed once, at once, with the token read again
    for id = 1, 2 do
      assert.equal(200, got[id].status)
      assert.same({ 401, 200 }, { got[id].attempts[1].code, got[id].attempts[2].code })
      assert.is_nil(got[id].attempts[1].after_s)
    end
    local statuses = {}
    for _, e in ipairs(transport_harness.api_requests(srv, "GET")) do statuses[#statuses + 1] = e.status end
    table.sort(statuses)
    assert.same({ 200, 200, 401, 401 }, statuses)
  end)

  it("calls before_attempt before every attempt of every request", function()
    srv:faults { { method = "GET", path = "team-a/configmaps/cm-01$", times = 1, status = 503 } }
    local m <close> = t:multi { concurrency = 2 }
    local calls = {}
    local ids = {}
    for i = 0, 2 do
      ids[i] = m:submit("GET", cm_path("team-a", i), { before_attempt = function(info)
        calls[#calls + 1] = { id = info.id, attempt = info.attempt, path = info.path, method = info.method,
          sent = #transport_harness.api_requests(srv, "GET", ("cm%%-%02d$"):format(i)) }
      end })
    end
    local got = drain(m)
    local per = {}
    for _, c in ipairs(calls) do
      per[c.id] = per[c.id] or {}
      per[c.id][#per[c.id] + 1] = c.attempt
      assert.equal("GET", c.method)
      assert.equal(c.attempt - 1, c.sent)   -- asked before the attempt went out
    end
    assert.same({ 1 }, per[ids[0]])
    assert.same({ 1, 2 }, per[ids[1]])
    assert.same({ 1 }, per[ids[2]])
    assert.equal(2, #got[ids[1]].attempts)
  end)

  it("a number from before_attempt delays that request only", function()
    local m <close> = t:multi { concurrency = 2 }
    local asked = 0
    local held = m:submit("GET", cm_path("team-a", 0), { before_attempt = function()
      asked = asked + 1
      if asked == 1 then return 0.5 end
    end })
    for i = 1, 3 do m:submit("GET", cm_path("team-a", i), {}) end
    local got = drain(m)
    assert.equal(4, got[held].order)
    assert.equal(2, asked)
    assert.same({ 200, 1 }, { got[held].status, #got[held].attempts })
  end)

  it("raises an error of before_attempt from m:wait; the other requests go on", function()
    local m <close> = t:multi { concurrency = 2 }
    local bad = m:submit("GET", cm_path("team-a", 0), { before_attempt = function() error("lease lost", 0) end })
    m:submit("GET", cm_path("team-a", 1), {})
    local ok, err = pcall(m.wait, m)
    assert.is_false(ok)
    assert.equal("lease lost", err)
    assert.equal(1, m:pending())
    local got = drain(m)
    assert.is_nil(got[bad])
    assert.equal(200, got[2].status)
    assert.equal(0, #transport_harness.api_requests(srv, "GET", "cm%-00$"))
  end)

  it("refuses to be used from its own callbacks", function()
    local m <close> = t:multi { concurrency = 1 }
    m:submit("GET", cm_path("team-a", 0), { before_attempt = function() m:submit("GET", cm_path("team-a", 1), {}) end })
    local ok, err = pcall(m.wait, m)
    assert.is_false(ok)
    assert.matches("batch used from a callback of one of its own requests", err)
    assert.equal(0, m:pending())
  end)

  it("close() cancels what is in flight and what waits, at once", function()
    -- the fast one is held long enough for the three slow ones to be sent meanwhile
    srv:faults { { method = "GET", path = "team-a/configmaps/cm-0[1-3]$", times = -1, delay_ms = 10000 },
                 { method = "GET", path = "team-a/configmaps/cm-00$", times = 1, delay_ms = 300 } }
    local m = t:multi { concurrency = 4 }
    local fast = m:submit("GET", cm_path("team-a", 0), {})
    for i = 1, 5 do m:submit("GET", cm_path("team-a", i), {}) end
    local id, status = m:wait()
    assert.same({ fast, 200 }, { id, status })
    assert(cli.poll(5, function()
      return #transport_harness.api_requests(srv, "GET", "cm%-0[1-3]$") == 3
    end), "the slow requests did not reach the server")
    m:close()
    assert.equal(0, m:pending())
    assert.has_error(function() m:wait() end, "calling 'wait' on bad self (batch is closed)")
    m:close()   -- twice is fine
    -- the three in flight were cut (never answered); cm-04/05 never sent
    local log = transport_harness.api_requests(srv, "GET")
    assert.equal(4, #log)
    for _, e in ipairs(log) do
      if e.path:match("cm%-0[1-3]$") then assert.is_true(pending(e)) end
    end
    assert.same({ "delay", "delay", "delay", "delay" }, srv:fired())
    -- the client goes on
    srv:clear_faults()
    assert.equal(200, (t:request("GET", cm_path("team-a", 4), {})))
  end)

  it("closing the client closes its batches", function()
    local c = connect(srv)
    local m = c:multi { concurrency = 2 }
    m:submit("GET", cm_path("team-a", 0), {})
    c:close()
    assert.equal(0, m:pending())
    assert.has_error(function() m:wait() end, "calling 'wait' on bad self (batch is closed)")
  end)

  it("ends every request at an armed watch's deadline: in flight and waiting", function()
    srv:faults { { method = "GET", path = "team-a/configmaps/cm-0[0-1]$", times = -1, delay_ms = 10000 } }
    local m <close> = t:multi { concurrency = 2 }
    for i = 0, 3 do m:submit("GET", cm_path("team-a", i), {}) end
    local w = proc.watch { deadline = sys.monotime() + 0.4 }
    local res = table.pack(pcall(function()
      local out = {}
      for _ = 1, 4 do out[#out + 1] = table.pack(m:wait()) end
      return out
    end))
    w:close()
    assert.is_true(res[1], tostring(res[2]))
    local sent = 0
    for _, r in ipairs(res[2]) do
      local last = r[4][#r[4]]
      assert.same({ 0, "DeadlineExceeded" }, { r[2], last.reason })
      if last.sent then sent = sent + 1 end
    end
    assert.equal(2, sent)
    assert.equal(2, #transport_harness.api_requests(srv, "GET"))
  end)
end)

describe("t:multi under a latency", function()
  local srv, t
  local LATENCY = 0.15
  setup(function() srv = transport_harness.start { latency_ms = LATENCY * 1000 } end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function()
    srv:reset { transport_harness.FIXTURE }
    srv:clear_requests()
    t = connect(srv)
  end)
  after_each(function() t:close() end)

  it("keeps at most K requests in flight, and K at once", function()
    local K = 3
    local m <close> = t:multi { concurrency = K }
    for i = 0, 8 do m:submit("GET", cm_path("team-a", i), {}) end
    local got = drain(m)
    for id = 1, 9 do assert.equal(200, got[id].status) end
    local at = arrivals(transport_harness.api_requests(srv, "GET"))
    assert.equal(9, #at)
    -- request i+K can only arrive once one of the K before it was answered,
    -- and each is held LATENCY: so no K+1 of them within LATENCY
    for i = 1, #at - K do
      assert.is_true(at[i + K] - at[i] >= LATENCY * 0.9,
        ("requests %d and %d arrived %.3f s apart"):format(i, i + K, at[i + K] - at[i]))
    end
    -- and really in parallel: the first K all arrived before the server
    -- answered the first (it holds each LATENCY from its arrival)
    for j = 2, K do
      assert.is_true(at[j] < at[1] + LATENCY,
        ("request %d arrived after request 1 was answered (%.3f s later)"):format(j, at[j] - at[1]))
    end
  end)

  it("reuses the kept-alive connections: K of them for reads and guarded writes", function()
    local m <close> = t:multi { concurrency = 2 }
    for i = 0, 5 do
      m:submit("PATCH", cm_path("team-a", i), { body = '{"data":{"i":"r"}}', content_type = MERGE, retry_safe = true })
    end
    for i = 0, 5 do m:submit("GET", cm_path("team-b", i), {}) end
    drain(m)
    local distinct = {}
    for _, e in ipairs(transport_harness.api_requests(srv)) do distinct[e.conn] = true end
    local n = 0
    for _ in pairs(distinct) do n = n + 1 end
    assert.equal(2, n)
  end)

  it("opens a connection of its own for every unguarded write", function()
    local m <close> = t:multi { concurrency = 2 }
    for i = 0, 3 do
      m:submit("PATCH", cm_path("team-a", i), { body = '{"data":{"i":"u"}}', content_type = MERGE })
    end
    drain(m)
    local seen = {}
    local log = transport_harness.api_requests(srv, "PATCH")
    assert.equal(4, #log)
    for _, e in ipairs(log) do
      assert.is_nil(seen[e.conn], "an unguarded write on a reused connection")
      seen[e.conn] = true
    end
  end)
end)

describe("t:multi and SIGTERM under an armed proc.watch (a child cozy-migrate)", function()
  local srv, dir
  transport_harness.fresh_server(function(s)
    srv = s
    dir = cli.tmpdir()
  end)
  after_each(function() os.execute("rm -rf " .. cli.quote(dir)) end)

  it("stops the transfers in flight and the requests waiting: all Interrupted", function()
    srv:faults { { method = "GET", path = "team-a/configmaps/cm-0[0-3]$", times = -1, delay_ms = 30000 } }
    local p = cli.start({ "lua", CHILD, "multi", dir .. "/out", srv.kubeconfig, dir .. "/marker" })
    finally(function() p:cleanup() end)
    assert(cli.poll(15, function()
      local log = transport_harness.api_requests(srv, "GET")
      return #log == 2 and pending(log[1]) and pending(log[2])
    end), "the two requests in flight did not reach the server")
    p:kill("TERM")
    local res = p:wait(15)
    assert.equal(0, res.code, res.stderr)
    local out = json.decode((assert(cli.slurp(dir .. "/out"), "no outcome: " .. res.stderr)))
    -- the watch's hook may cut the child's own loop once; nothing is handed out twice
    assert.is_true(#out.results >= 3, "results: " .. #out.results)
    local sent = 0
    for _, r in ipairs(out.results) do
      local last = r.attempts[#r.attempts]
      assert.same({ 0, "Interrupted", 15 }, { r.status, last.reason, last.signal })
      if last.sent then sent = sent + 1 end
    end
    assert.is_true(sent <= 2)
    assert.equal(0, out.pending)
    local log = transport_harness.api_requests(srv, "GET")
    assert.equal(2, #log)   -- the other two were never sent
    assert.is_true(pending(log[1]) and pending(log[2]), "the server answered before the child stopped")
  end)
end)
