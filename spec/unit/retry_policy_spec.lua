-- The engine's named retry policies and its one backoff formula
-- (core/retry_policy.c, docs/transport.md "Retry policies"): the values of
-- each policy as documented, C's formula and its Lua callers agreeing for
-- the same draws, the refusals of a bad policy, and no retry table or
-- backoff built anywhere else in the runtime.
local transport = require "cozy.transport"
local update = require "cozy.kube.update"
local kube = require "cozy.kube"

local FIELDS = { "max_attempts", "max_time", "base_delay", "factor", "max_delay", "jitter", "refused_time" }

-- The "Retry policies" table of docs/transport.md: name -> { field = value }.
local function documented()
  local f = assert(io.open("docs/transport.md"))
  local doc = f:read("a")
  f:close()
  local section = assert(doc:match("\n### Retry policies\n(.-)\n## "), "docs/transport.md: no Retry policies section")
  local rows, order = {}, {}
  for line in section:gmatch("[^\n]+") do
    local cells = {}
    for cell in line:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = cell end
    if #cells >= 8 and cells[1] ~= "policy" and not cells[1]:match("^%-") then
      local row = {}
      for i, k in ipairs(FIELDS) do
        row[k] = cells[i + 1] == "inf" and math.huge or assert(tonumber(cells[i + 1]), line)
      end
      rows[cells[1]] = row
      order[#order + 1] = cells[1]
    end
  end
  return rows, order
end

-- The closed form, written again here: min(base * factor^(n-1), max) * (1 - jitter/2 + jitter*u).
local function expected(p, n, u)
  return math.min(p.base_delay * p.factor ^ (n - 1), p.max_delay) * (1 - p.jitter / 2 + p.jitter * u)
end

local function kubeconfig()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write([[
apiVersion: v1
kind: Config
clusters: [{ name: c, cluster: { server: "https://127.0.0.1:9" } }]
users: [{ name: u, user: { token: t } }]
contexts: [{ name: x, context: { cluster: c, user: u, namespace: ns } }]
current-context: x
]])
  f:close()
  return path
end

describe("retry policies", function()
  it("are the ones docs/transport.md lists, with its values", function()
    local rows, order = documented()
    assert.same({ "request", "conflict", "renewal", "probe", "events", "release", "record" }, order)
    for _, name in ipairs(order) do
      local p = transport.retry_policy(name)
      assert.equal(name, p.name)
      for _, k in ipairs(FIELDS) do assert.equal(rows[name][k], p[k], name .. "." .. k) end
    end
    -- and the engine knows no other: an unknown name's error lists them all
    local ok, err = pcall(transport.retry_policy, "nope")
    assert.is_false(ok)
    assert.equal("unknown retry policy 'nope' (one of: " .. table.concat(order, ", ") .. ")", err)
  end)

  it("the request policy is the transport's defaults (docs/transport.md, Retries)", function()
    assert.same({ name = "request", max_attempts = 10, max_time = 120, base_delay = 0.25, factor = 2, max_delay = 30,
      jitter = 1, refused_time = 5 }, transport.retry_policy("request"))
    assert.same({ name = "conflict", max_attempts = 8, max_time = math.huge, base_delay = 0.01, factor = 3,
      max_delay = 2, jitter = 0.5, refused_time = 0 }, transport.retry_policy("conflict"))
  end)

  it("are fresh tables, overridden only where asked", function()
    local a = transport.retry_policy("renewal", { max_time = 20, max_delay = 10 })
    a.max_attempts = 99
    local b = transport.retry_policy("renewal")
    assert.equal(3, b.max_attempts)
    assert.equal(10, b.max_time)
    assert.equal(20, a.max_time)
    assert.equal(0.1, a.base_delay)
  end)

  it("refuse an unknown field or a bad value with a clear error", function()
    local cases = {
      { { attempts = 3 }, "retry policy 'request': unknown field 'attempts' (max_attempts, max_time, base_delay, "
        .. "factor, max_delay, jitter, refused_time)" },
      { { max_attempts = 0 }, "retry policy 'request': max_attempts must be between 1 and 2147483647" },
      { { base_delay = -1 }, "retry policy 'request': base_delay must be >= 0" },
      { { factor = 0.5 }, "retry policy 'request': factor must be >= 1" },
      { { jitter = 3 }, "retry policy 'request': jitter must be <= 2" },
      { { max_time = "5" }, "retry policy 'request': max_time must be a number" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(transport.retry_policy, "request", c[1])
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
  end)
end)

describe("transport.backoff", function()
  it("is the one formula: min(base * factor^(n-1), max) * (1 - jitter/2 + jitter*u)", function()
    for _, name in ipairs { "request", "conflict", "renewal", "record" } do
      local p = transport.retry_policy(name)
      for n = 1, 12 do
        for _, u in ipairs { 0, 0.25, 0.5, 0.999 } do
          assert.near(expected(p, n, u), transport.backoff(name, n, u), 1e-12, name .. " n=" .. n)
          assert.near(expected(p, n, u), transport.backoff(p, n, u), 1e-12)
        end
      end
    end
    -- the transport's: 0.25 s doubling, jitter [0.5, 1.5), capped at 30 s before jitter
    assert.equal(0.125, transport.backoff("request", 1, 0))
    assert.equal(1.0, transport.backoff("request", 3, 0.5))
    assert.equal(15, transport.backoff("request", 1000, 0))
    -- a base of 0 waits 0 however far n goes (never NaN)
    assert.equal(0, transport.backoff({ base_delay = 0 }, 5000, 0.5))
  end)

  it("draws u from math.random when none is given", function()
    math.randomseed(42)
    local u1, u2 = math.random(), math.random()
    math.randomseed(42)
    assert.equal(transport.backoff("conflict", 1, u1), transport.backoff("conflict", 1))
    assert.equal(transport.backoff("conflict", 2, u2), transport.backoff("conflict", 2))
  end)

  it("refuses n < 1 and u outside [0, 1)", function()
    assert.has_error(function() transport.backoff("request", 0, 0) end,
      "transport.backoff: the retry's number must be >= 1")
    assert.has_error(function() transport.backoff("request", 1, 1) end,
      "transport.backoff: u must be in [0, 1)")
    assert.has_error(function() transport.backoff("nope", 1, 0) end, "unknown retry policy 'nope' (one of: "
      .. "request, conflict, renewal, probe, events, release, record)")
  end)
end)

describe("Lua callers of the formula", function()
  it("the update engine's waits (and the lock's wait) equal transport.backoff for the same draws", function()
    for _, policy in ipairs { transport.retry_policy("conflict"), { base_delay = 0.001, factor = 2,
      max_delay = 0.01, jitter = 0.5 } } do
      math.randomseed(7)
      local draws = {}
      for i = 1, 10 do draws[i] = math.random() end
      math.randomseed(7)
      local wait = update.backoff(policy)
      for n = 1, 10 do assert.equal(transport.backoff(policy, n, draws[n]), wait()) end
    end
  end)

  it("a client's update policy is the conflict policy, its overrides applied", function()
    local path = kubeconfig()
    local c = kube.connect { kubeconfig = path, update = { max_attempts = 3 } }
    local d = kube.connect { kubeconfig = path }
    os.remove(path)
    local want = transport.retry_policy("conflict", { max_attempts = 3 })
    assert.same(want, c.update_policy)
    assert.same(transport.retry_policy("conflict"), d.update_policy)
    c:close()
    d:close()
  end)
end)

describe("transport.new{ retry = }", function()
  it("takes a policy's name, a table based on a name, or nothing (request)", function()
    local path = kubeconfig()
    local by_name = transport.new { kubeconfig = path, retry = "probe" }
    local by_table = transport.new { kubeconfig = path, retry = { name = "events", max_time = 1 } }
    local plain = transport.new { kubeconfig = path }
    os.remove(path)
    assert.same({ "probe", 2, 10 }, { by_name:info().retry_policy, by_name:info().max_attempts,
      by_name:info().max_time })
    assert.same({ "events", 2, 1 }, { by_table:info().retry_policy, by_table:info().max_attempts,
      by_table:info().max_time })
    assert.same({ "request", 10, 120 }, { plain:info().retry_policy, plain:info().max_attempts,
      plain:info().max_time })
    by_name:close()
    by_table:close()
    plain:close()
  end)

  it("refuses an unknown policy name, field or type with a clear error", function()
    local path = kubeconfig()
    local cases = {
      { "nope", "unknown retry policy 'nope' (one of: request, conflict, renewal, probe, events, release, record)" },
      { { name = "nope" }, "unknown retry policy 'nope' (one of: request, conflict, renewal, probe, events, "
        .. "release, record)" },
      { { attempts = 2 }, "retry policy 'request': unknown field 'attempts' (max_attempts, max_time, base_delay, "
        .. "factor, max_delay, jitter, refused_time)" },
      { 5, "option 'retry' must be a retry policy's name or a table" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(transport.new, { kubeconfig = path, retry = c[1] })
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
    os.remove(path)
  end)
end)

describe("the runtime", function()
  -- the class: a retry table or a backoff written ad hoc drifts from the
  -- documented policies; every one is a named policy (core/retry_policy.c)
  it("builds no retry table and computes no backoff outside core/retry_policy.c", function()
    local p = assert(io.popen("{ find scripts -name '*.lua'; find core -name '*.c' ! -name retry_policy.c; } | sort"))
    local offenders = {}
    for file in p:lines() do
      local f = assert(io.open(file))
      local n = 0
      for line in f:lines() do
        n = n + 1
        local code = file:match("%.c$") and line:gsub("/%*.*$", "") or line:gsub("%-%-.*$", "")
        local literal = false
        for _, k in ipairs(FIELDS) do literal = literal or code:match(k .. "%s*=%s*%d") ~= nil end
        if literal or code:match("retry%s*=%s*{") or code:match("%.factor") or code:match("%.jitter") then
          offenders[#offenders + 1] = file .. ":" .. n .. ": " .. line
        end
      end
      f:close()
    end
    p:close()
    assert.same({}, offenders)
  end)

  it("has a retry judge that decides and leaves reading credentials to the drivers", function()
    local f = assert(io.open("core/transport_retry.c"))
    local judge = f:read("a")
    f:close()
    for _, call in ipairs { "cozy_http_reload_token", "cozy_exec_run", "cozy_exec_expired", "cred_error" } do
      assert.is_nil(judge:find(call, 1, true), "core/transport_retry.c calls " .. call)
    end
  end)
end)
