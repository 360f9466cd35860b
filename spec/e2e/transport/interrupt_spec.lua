-- Time and interruption (docs/engine-api.md, cozy.proc watches; docs/transport.md):
-- before_attempt guards every attempt of a request, first and retried; an
-- armed proc.watch ends Lua code and the transport's waits on SIGTERM or
-- at its deadline. Signals go to a child `cozy-migrate lua` process; what
-- "in flight" and "in backoff" mean is read from the fake's request log
-- (an entry is logged, status null, when the request arrives).
local transport_harness = require("spec.helpers").transport
local cli = require("spec.helpers").cli
local json = require "cozy.json"
local proc = require "cozy.proc"
local sandbox = require "cozy.sandbox"
local sys = require "cozy.sys"
local transport = require "cozy.transport"

local SETTINGS = "/api/v1/namespaces/cozy-system/configmaps/settings"
local CHILD = "spec/fixtures/transport/interrupt_child.lua"

local function connect(srv, opts)
  local o = { kubeconfig = srv.kubeconfig, request_timeout = 5,
    retry = { max_attempts = 6, max_time = 60, base_delay = 0.01, max_delay = 60 } }
  for k, v in pairs(opts or {}) do o[k] = v end
  return assert(transport.new(o))
end

local function settings_requests(srv, method)
  return srv:requests { method = method or "GET", path = "configmaps/settings$" }
end

-- Runs fn under a watch and closes it before returning fn's results (or
-- raising its error): once the deadline has passed, any Lua code still under
-- the watch is stopped, the spec's assertions included.
local function watched(opts, fn)
  local w = proc.watch(opts)
  local res = table.pack(pcall(fn, w))
  w:close()
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

-- pcall(fn) under a watch, closed before returning.
local function watched_pcall(opts, fn)
  local w = proc.watch(opts)
  local res = table.pack(pcall(fn, w))
  w:close()
  return table.unpack(res, 1, res.n)
end

local function pending(entry)
  return entry.status == nil or entry.status == json.null
end

local function fault_fired(entry)
  return entry.fault ~= nil and entry.fault ~= json.null
end

describe("t:request before_attempt", function()
  local srv, t
  transport_harness.fresh_server(function(s)
    srv = s
    t = connect(srv)
  end)
  after_each(function() t:close() end)

  it("is called before every attempt, the first included, with the attempt's deadline", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 2, status = { code = 503, retry_after = 0 } } }
    local calls = {}
    local status, body, attempts = t:request("GET", SETTINGS, { before_attempt = function(info)
      calls[#calls + 1] = { attempt = info.attempt, method = info.method, path = info.path,
        ahead = info.deadline - sys.monotime() }
    end })
    assert.equal(200, status)
    assert.equal("prod", json.decode(body).data.mode)
    assert.equal(3, #attempts)
    assert.equal(3, #calls)
    for i, c in ipairs(calls) do
      assert.same({ i, "GET", SETTINGS }, { c.attempt, c.method, c.path })
      -- now + the request timeout (5 s), read right after the call
      assert.is_true(c.ahead > 4.5 and c.ahead <= 5, "deadline " .. c.ahead .. " s ahead")
    end
    local log = settings_requests(srv)
    assert.equal(3, #log)
    assert.is_true(fault_fired(log[1]) and fault_fired(log[2]))
    assert.is_false(fault_fired(log[3]))
  end)

  it("raising stops the request with that error: no further attempt reaches the server", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = -1, status = { code = 500 } } }
    local refusal = { reason = "LeaseNotHeld" }
    local seen = 0
    local ok, err = pcall(t.request, t, "GET", SETTINGS, { before_attempt = function(info)
      seen = info.attempt
      if info.attempt == 2 then error(refusal) end
    end })
    assert.is_false(ok)
    assert.is_true(rawequal(refusal, err))
    assert.equal(2, seen)
    local log = settings_requests(srv)
    assert.equal(1, #log)
    assert.is_true(fault_fired(log[1]))
    -- the connection is left usable
    srv:clear_faults()
    assert.equal(200, (t:request("GET", SETTINGS, {})))
  end)

  it("guards the retry of a write answered 429: refused, the write never lands", function()
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 1, status = { code = 429, retry_after = 0 } } }
    local ok, err = pcall(t.request, t, "PATCH", SETTINGS, {
      body = '{"data":{"count":"9"}}', content_type = "application/merge-patch+json",
      before_attempt = function(info) if info.attempt > 1 then error("lease expired", 0) end end })
    assert.is_false(ok)
    assert.equal("lease expired", err)
    local log = settings_requests(srv, "PATCH")
    assert.equal(1, #log)
    assert.equal(429, log[1].status)
    assert.equal("1", transport_harness.object(srv, "cozy-system", "settings").data.count)
  end)

  it("a number waits that many seconds, then asks again before sending", function()
    local calls = {}
    local status = t:request("GET", SETTINGS, { before_attempt = function(info)
      calls[#calls + 1] = { attempt = info.attempt, at = sys.monotime(), deadline = info.deadline,
        requests = #settings_requests(srv) }
      if #calls == 1 then return 0.2 end
      return true
    end })
    assert.equal(200, status)
    assert.equal(2, #calls)
    assert.same({ 1, 1 }, { calls[1].attempt, calls[2].attempt })
    assert.same({ 0, 0 }, { calls[1].requests, calls[2].requests })  -- nothing sent while waiting
    assert.is_true(calls[2].at - calls[1].at >= 0.2)
    assert.is_true(calls[2].deadline > calls[1].deadline)        -- asked again with a fresh deadline
    assert.equal(1, #settings_requests(srv))
  end)

  it("is called before the replay after a 401 with a rotated token file too", function()
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
    local calls = {}
    local status = rotated:request("GET", SETTINGS, { before_attempt = function(info)
      calls[#calls + 1] = info.attempt
    end })
    rotated:close()
    assert.equal(200, status)
    assert.same({ 1, 2 }, calls)
    local log = settings_requests(srv)
    assert.same({ 401, 200 }, { log[1].status, log[2].status })
  end)

  it("refuses to send an attempt whose announced deadline the callback itself used up", function()
    local ok, err = pcall(t.request, t, "GET", SETTINGS, { timeout = 0.1, before_attempt = function()
      sys.sleep(0.15)
    end })
    assert.is_false(ok)
    assert.matches("before_attempt used up the attempt's time", err)
    assert.equal(0, #settings_requests(srv))
  end)

  it("refuses a result that is neither nil, true nor seconds", function()
    local ok, err = pcall(t.request, t, "GET", SETTINGS, { before_attempt = function() return "yes" end })
    assert.is_false(ok)
    assert.matches("before_attempt must return nil, true or a number of seconds to wait, not string", err)
    assert.equal(0, #settings_requests(srv))
    ok, err = pcall(t.request, t, "GET", SETTINGS, { before_attempt = 42 })
    assert.is_false(ok)
    assert.matches("option 'before_attempt' must be a function", err)
  end)
end)

describe("t:request under an armed proc.watch", function()
  local srv, t
  transport_harness.fresh_server(function(s)
    srv = s
    t = connect(srv)
  end)
  after_each(function() t:close() end)

  it("cuts an attempt in flight at the deadline (DeadlineExceeded), never retried", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, delay_ms = 20000 } }
    local deadline = sys.monotime() + 0.5
    local announced
    local status, body, attempts = watched({ deadline = deadline }, function()
      return t:request("GET", SETTINGS, { before_attempt = function(info) announced = info.deadline end })
    end)
    assert.equal(deadline, announced)   -- the watch's deadline is sooner than the 5 s timeout
    assert.equal(0, status)
    assert.is_nil(body)
    assert.equal(1, #attempts)
    assert.same({ 0, "DeadlineExceeded", true }, { attempts[1].code, attempts[1].reason, attempts[1].sent })
    local log = settings_requests(srv)
    assert.equal(1, #log)
    assert.is_true(fault_fired(log[1]))
    assert.is_true(pending(log[1]), "the server answered before the request ended")
  end)

  it("ends a Retry-After backoff at the deadline without another attempt", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, status = { code = 503, retry_after = 30 } } }
    local status, _, attempts = watched({ deadline = sys.monotime() + 0.3 }, function()
      return t:request("GET", SETTINGS, {})
    end)
    assert.equal(0, status)
    assert.equal(2, #attempts)
    assert.same({ 503, 30 }, { attempts[1].code, attempts[1].after_s })
    assert.same({ "DeadlineExceeded", false }, { attempts[2].reason, attempts[2].sent })
    assert.equal(1, #settings_requests(srv))
  end)

  it("ends a wait for the rate limiter at the deadline, nothing sent", function()
    local slow = connect(srv, { qps = 0.1, burst = 1 })
    assert.equal(200, (slow:request("GET", SETTINGS, {})))  -- takes the one token
    local status, _, attempts = watched({ deadline = sys.monotime() + 0.3 }, function()
      return slow:request("GET", SETTINGS, {})
    end)
    slow:close()
    assert.equal(0, status)
    assert.same({ "DeadlineExceeded", false }, { attempts[1].reason, attempts[1].sent })
    assert.equal(1, #settings_requests(srv))
  end)

  it("reaches cozy.kube callers as a kube.Error with reason DeadlineExceeded", function()
    local kube = require "cozy.kube"
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, delay_ms = 20000 } }
    local client = transport_harness.connect(srv)
    local ok, err = watched_pcall({ deadline = sys.monotime() + 0.3 }, function()
      return client:resource("v1", "configmaps"):get("cozy-system", "settings")
    end)
    client:close()
    assert.is_false(ok)
    assert.is_true(kube.is_error(err))
    assert.same({ 0, "DeadlineExceeded" }, { err.code, err.reason })
    assert.equal(1, #settings_requests(srv))
  end)

  it("has no effect once closed", function()
    local w = proc.watch { deadline = sys.monotime() + 0.01 }
    w:close()
    assert.is_false(w:armed())
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, delay_ms = 300 } }
    local status, _, attempts = t:request("GET", SETTINGS, {})
    assert.equal(200, status)
    assert.equal(1, #attempts)
    assert.is_true(fault_fired(settings_requests(srv)[1]))
  end)
end)

describe("proc.watch deadlines stop Lua code", function()
  it("raises what on_stop raises, with the reason, the overrun and the position", function()
    local stop = {}
    local ok, err = watched_pcall({ deadline = sys.monotime() + 0.2, on_stop = function(reason, detail, where)
      stop.reason, stop.detail, stop.where = reason, detail, where
      error(stop, 0)
    end }, function() while true do end end)
    assert.is_false(ok)
    assert.is_true(rawequal(stop, err))
    assert.equal("deadline", stop.reason)
    assert.is_true(stop.detail >= 0)
    assert.matches("transport/interrupt_spec.lua:%d+$", stop.where)
  end)

  it("raises \"deadline exceeded\" without on_stop, and keeps raising until closed", function()
    local w = proc.watch { deadline = sys.monotime() + 0.1 }
    local first = table.pack(pcall(function() while true do end end))
    local second = table.pack(pcall(function() while true do end end))
    local pending_stop = proc.pending_stop()
    w:close()
    assert.is_false(first[1])
    assert.matches("transport/interrupt_spec.lua:%d+: deadline exceeded$", first[2])
    assert.is_false(second[1])
    assert.matches("deadline exceeded", second[2])
    assert.equal("deadline", pending_stop)
    assert.is_nil(proc.pending_stop())
    local n = 0
    for _ = 1, 100000 do n = n + 1 end
    assert.equal(100000, n)
  end)

  it("costs the main thread nothing until a stop is due: no hook, then one that removes itself", function()
    local w = proc.watch { deadline = sys.monotime() + 0.2 }
    local before = debug.gethook()
    local co = coroutine.create(function() end)
    local wrapped = coroutine.wrap(function() return debug.gethook() end)
    local co_hook = table.pack(debug.gethook(co))
    local wrapped_hook = table.pack(wrapped())
    local ok, err = pcall(function() while true do end end)
    local after = table.pack(debug.gethook())
    w:close()
    local n = 0
    for _ = 1, 10000 do n = n + 1 end
    assert.is_nil(before)
    -- a coroutine is hooked from its start: a signal cannot tell which thread runs
    assert.same({ "external hook", "", 1000 }, { co_hook[1], co_hook[2], co_hook[3] })
    assert.same({ "external hook", "", 1000 }, { wrapped_hook[1], wrapped_hook[2], wrapped_hook[3] })
    assert.is_false(ok)
    assert.matches("deadline exceeded", err)
    assert.same({ "external hook", "", 1000 }, { after[1], after[2], after[3] })
    assert.equal(10000, n)
    assert.is_nil(debug.gethook(), "the hook did not remove itself once the watch was closed")
    assert.is_nil(debug.gethook(coroutine.create(function() end)), "a coroutine created after close is hooked")
  end)

  it("removes the hook a stop set once nothing says stop, an outer watch still armed", function()
    local outer = proc.watch { deadline = sys.monotime() + 3600 }
    local inner = proc.watch { deadline = sys.monotime() + 0.1 }
    local ok, err = pcall(function() while true do end end)
    local during = debug.gethook()
    inner:close()
    local n = 0
    for _ = 1, 10000 do n = n + 1 end
    local after = debug.gethook()
    outer:close()
    assert.is_false(ok)
    assert.matches("deadline exceeded", err)
    assert.equal("external hook", during)
    assert.equal(10000, n)
    assert.is_nil(after, "the hook stayed after the stop had passed")
  end)

  it("applies a nearer deadline armed in a coroutine to the main thread", function()
    local stop = {}
    local outer = proc.watch { deadline = sys.monotime() + 30, on_stop = function(reason, detail)
      stop.reason, stop.detail = reason, detail
      error("outer", 0)
    end }
    local co = coroutine.create(function()
      -- armed in the coroutine and left open while the main thread runs on
      local _w <close> = proc.watch { deadline = sys.monotime() + 0.2, on_stop = function(reason, detail)
        stop.reason, stop.detail = reason, detail
        error("inner", 0)
      end }
      coroutine.yield()
    end)
    assert(coroutine.resume(co))
    local ok, err = pcall(function() while true do end end)
    coroutine.close(co)
    outer:close()
    assert.is_false(ok)
    assert.equal("inner", err)
    assert.equal("deadline", stop.reason)
    -- stopped at the inner deadline, not at the outer one 29.8 s later
    assert.is_true(stop.detail < 5, "stopped " .. tostring(stop.detail) .. " s after the inner deadline")
  end)

  it("reaches coroutines created under the watch", function()
    local ok, err = watched({ deadline = sys.monotime() + 0.1 }, function()
      local co = coroutine.create(function() while true do end end)
      return coroutine.resume(co)
    end)
    assert.is_false(ok)
    assert.matches("deadline exceeded", err)
  end)

  it("reaches a coroutine created before it with w:attach", function()
    local co = coroutine.create(function() while true do end end)
    local ok, err = watched({ deadline = sys.monotime() + 0.1 }, function(w)
      w:attach(co)
      return coroutine.resume(co)
    end)
    assert.is_false(ok)
    assert.matches("deadline exceeded", err)
  end)

  it("nests: the earliest deadline applies and its watch's on_stop answers", function()
    local ok, err = watched_pcall({ deadline = sys.monotime() + 0.1, on_stop = function() error("outer", 0) end },
      function()
        return watched({ deadline = sys.monotime() + 3600, on_stop = function() error("inner", 0) end },
          function() while true do end end)
      end)
    assert.is_false(ok)
    assert.equal("outer", err)
  end)

  it("bounds a migration's top level loaded in the sandbox, a load() in a custom env included", function()
    local function load_bounded(source, name)
      return watched({ deadline = sys.monotime() + 0.2 }, function() return sandbox.load(source, name) end)
    end
    local m, err = load_bounded("while true do end return {}", "migrations/90-hang.lua")
    assert.is_nil(m)
    assert.matches("^migrations/90%-hang.lua:1: deadline exceeded$", err)
    m, err = load_bounded([[return load("while true do end", "=inner", "t", {})()]], "migrations/91-inner.lua")
    assert.is_nil(m)
    assert.matches("^inner:1: deadline exceeded$", err)
    -- a migration that swallows errors in a loop is stopped all the same
    m, err = load_bounded("while true do pcall(function() while true do end end) end", "migrations/92-swallow.lua")
    assert.is_nil(m)
    assert.matches("deadline exceeded", err)
    -- and a top level that returns in time is loaded
    m = load_bounded("return { description = 'ok' }", "migrations/93-ok.lua")
    assert.same({ description = "ok" }, m)
  end)

  it("ends sys.sleep at the deadline", function()
    local ok, err = watched_pcall({ deadline = sys.monotime() + 0.1 }, function() sys.sleep(30) end)
    assert.is_false(ok)
    assert.matches("deadline exceeded", err)
  end)

  it("checks its options", function()
    assert.has_error(function() proc.watch { deadline = "soon" } end,
      "watch: 'deadline' must be a number (a sys.monotime() value)")
    assert.has_error(function() proc.watch { on_stop = true } end, "watch: 'on_stop' must be a function")
  end)
end)

describe("SIGTERM under an armed proc.watch (a child cozy-migrate)", function()
  local srv, dir
  transport_harness.fresh_server(function(s)
    srv = s
    dir = cli.tmpdir()
  end)
  after_each(function() os.execute("rm -rf " .. cli.quote(dir)) end)

  local function child(mode)
    local p = cli.start({ "lua", CHILD, mode, dir .. "/out", srv.kubeconfig, dir .. "/marker" })
    finally(function() p:cleanup() end)
    return p
  end

  local function outcome(p)
    local res = p:wait(15)
    assert.equal(0, res.code, res.stderr)
    return json.decode((assert(cli.slurp(dir .. "/out"), "no outcome: " .. res.stderr)))
  end

  local function until_true(what, fn)
    assert(cli.poll(15, fn), what)
  end

  it("ends a slow request in flight (Interrupted), before the server answers", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, delay_ms = 30000 } }
    local p = child("request")
    until_true("the request did not reach the server", function()
      local log = settings_requests(srv)
      return log[1] and fault_fired(log[1]) and pending(log[1])
    end)
    p:kill("TERM")
    local out = outcome(p)
    assert.equal(0, out.status)
    assert.equal(1, #out.attempts)
    assert.same({ "Interrupted", 15, true }, { out.attempts[1].reason, out.attempts[1].signal, out.attempts[1].sent })
    local log = settings_requests(srv)
    assert.equal(1, #log)
    assert.is_true(pending(log[1]), "the server answered before the child stopped")
  end)

  it("ends a Retry-After backoff: the retry never reaches the server", function()
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, status = { code = 503, retry_after = 60 } } }
    local p = child("request")
    until_true("the 503 was not answered", function()
      local log = settings_requests(srv)
      return log[1] and log[1].status == 503
    end)
    p:kill("TERM")
    local out = outcome(p)
    assert.equal(0, out.status)
    assert.equal(2, #out.attempts)
    assert.same({ 503, 60 }, { out.attempts[1].code, out.attempts[1].after_s })
    assert.same({ "Interrupted", false }, { out.attempts[2].reason, out.attempts[2].sent })
    assert.equal(1, #settings_requests(srv))
  end)

  for _, case in ipairs {
    { mode = "loop", what = "a busy loop" },
    { mode = "loop-coroutine", what = "a busy loop in a coroutine created under the watch" },
    -- signalled while it waits with no watch armed; the stop is due when it arms one
    { mode = "loop-after-signal", marker = "waiting", what = "a busy loop armed after the signal was caught" },
  } do
    it("stops " .. case.what .. ": on_stop(\"signal\", 15, where)", function()
      local p = child(case.mode)
      until_true("the child did not start " .. (case.marker or "looping"), function()
        return cli.slurp(dir .. "/marker") == (case.marker or "looping")
      end)
      p:kill("TERM")
      local out = outcome(p)
      assert.same({ "signal", 15 }, { out.reason, out.detail })
      assert.matches("interrupt_child.lua:%d+$", out.where)
    end)
  end

  it("stops a busy loop under a watch without on_stop with a plain message", function()
    local p = child("loop-default")
    until_true("the child did not start looping", function()
      return cli.slurp(dir .. "/marker") == "looping"
    end)
    p:kill("INT")
    local out = outcome(p)
    assert.matches("interrupt_child.lua:%d+: interrupted by signal 2$", out.message)
  end)
end)
