-- Retry budgets (docs/engine-api.md, "Retry budgets"): a migration bounds the
-- retries of one call ({ retry = { attempts =, time = } }) or of a batch
-- (update_each's, with batch_retries shared by all its requests), within the
-- engine's bounds: never more attempts or time than the client allows, and
-- never without the backoff or a server's Retry-After between attempts. Each
-- case counts the requests the fake logged, never the clock.
local harness = require "spec.helpers"
local files = require("spec.helpers").files
local kube = require "cozy.kube"

local migration, fixture = harness.configmap_probe, harness.configmaps_fixture

-- The engine's bound is 10 attempts (the production default), its backoff
-- shortened so that ten attempts cost about a second.
local ENGINE = { max_attempts = 10, max_time = 60, base_delay = 0.001, max_delay = 1 }

describe("retry budgets", function()
  local h = harness.fake { fixtures = { fixture(4) } }
  local client, captured
  before_each(function()
    captured = harness.capture_log()
    client = kube.connect { kubeconfig = h.srv.kubeconfig, log = captured.log, retry = ENGINE,
      update = harness.CONNECT.update }
  end)
  after_each(function() client:close() end)

  local function migrate(body) return h:migrate(migration(body), { client = client }) end
  local function migrate_error(body) return h:migrate_error(migration(body), { client = client }) end
  local function count(method, path) return #h:requests { method = method, path = path } end

  -- a change of cm-1 whose PATCH keeps answering 500, with `opts` as the call's last argument
  local CHANGE = [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local ok, err = pcall(cms.change, cms, "cozy-system", "cm-1", function(cm) cm.data.done = "yes" end, %s)
    assert(not ok and err.code == 500, tostring(err))
    ctx:outcome { attempts = #err.attempts }
]]

  it("a PATCH that keeps answering 500 costs the engine's 10 attempts without a budget #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = -1, status = 500 } }
    local res = migrate(CHANGE:format("nil"))
    assert.equal(10, count("PATCH", "/configmaps/cm%-1$"))
    assert.equal(10, #h:fired())
    assert.equal(10, res.outcome.counts.attempts)
  end)

  it("with { retry = { attempts = 2 } } costs 2 #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = -1, status = 500 } }
    local res = migrate(CHANGE:format("{ retry = { attempts = 2 } }"))
    assert.equal(2, count("PATCH", "/configmaps/cm%-1$"))
    assert.equal(2, res.outcome.counts.attempts)
    assert.same({ "status", "status" }, h:fired())
  end)

  it("cannot ask for more than the engine's bound #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = -1, status = 500 } }
    migrate(CHANGE:format("{ retry = { attempts = 50, time = 1000 } }"))
    assert.equal(10, count("PATCH", "/configmaps/cm%-1$"))
    assert.equal(10, #h:fired())
  end)

  it("with { retry = { time = 0 } } starts no retry #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = -1, status = 500 } }
    migrate(CHANGE:format("{ retry = { time = 0 } }"))
    assert.equal(1, count("PATCH", "/configmaps/cm%-1$"))
    assert.same({ "status" }, h:fired())
  end)

  it("bounds every request of a call: a get, a list's pages, a raw call #fakeonly", function()
    h:faults { { method = "GET", path = "/configmaps/cm-2$", times = -1, status = 503 },
      { method = "GET", path = "/configmaps\\?limit=", times = -1, status = 503 },
      { method = "GET", path = "/configmaps/cm-3$", times = -1, status = 502 } }
    local res = migrate([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local function code(ok, err) return ok and "succeeded" or err.code end
    ctx:outcome {
      get = code(pcall(cms.get, cms, "cozy-system", "cm-2", { retry = { attempts = 3 } })),
      list = code(pcall(function() return cms:list{ namespace = "cozy-system", retry = { attempts = 2 } }:collect() end)),
      call = code(pcall(ctx.kube.call, ctx.kube, "GET", "/api/v1/namespaces/cozy-system/configmaps/cm-3", { retry = { attempts = 4 } })),
    }
]])
    assert.same({ get = 503, list = 503, call = 502 }, res.outcome.counts)
    assert.equal(9, #h:fired())
    assert.equal(3, count("GET", "/configmaps/cm%-2$"))
    assert.equal(2, count("GET", "/configmaps$"))
    assert.equal(4, count("GET", "/configmaps/cm%-3$"))
  end)

  it("keeps a server's Retry-After between the attempts it allows #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-1$", times = -1, status = { code = 429, retry_after = 1 } } }
    local res = migrate([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local ok, err = pcall(cms.change, cms, "cozy-system", "cm-1", function(cm) cm.data.done = "yes" end, { retry = { attempts = 3 } })
    assert(not ok and err.code == 429, tostring(err))
    ctx:outcome { attempts = #err.attempts, first = err.attempts[1].after_s, second = err.attempts[2].after_s }
]])
    assert.equal(3, count("PATCH", "/configmaps/cm%-1$"))
    assert.equal(3, #h:fired())
    -- the waits the engine took are the server's, not shortened by the budget
    assert.same({ attempts = 3, first = 1, second = 1 }, res.outcome.counts)
  end)

  for _, n in ipairs { 1, 4 } do
    it(("a batch's retries are shared: batch_retries bounds them all together (concurrency %d) #fakeonly"):format(n),
        function()
      h:faults { { method = "PATCH", path = "/configmaps/cm-", times = -1, status = 500 } }
      local res = migrate(([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local picked = {}
    for cm in cms:list{ namespace = "cozy-system" } do
      if cm.metadata.name:find("^cm%%-") then picked[#picked + 1] = cm end
    end
    local counts = cms:update_each(picked, function(cm) cm.data.done = "yes" end,
      { concurrency = %d, on_error = "continue", retry = { attempts = 3, batch_retries = 2 } })
    ctx:outcome { failed = counts.failed }
]]):format(n))
      assert.equal(4, res.outcome.counts.failed)
      -- four first attempts and the two retries the pool held, whatever the order
      assert.equal(6, count("PATCH", "/configmaps/cm%-%d$"))
      assert.equal(6, #h:fired())
    end)
  end

  it("a batch's time: batch_time = 0 starts no retry for any of its requests #fakeonly", function()
    h:faults { { method = "PATCH", path = "/configmaps/cm-", times = -1, status = 500 } }
    migrate([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local picked = {}
    for cm in cms:list{ namespace = "cozy-system" } do
      if cm.metadata.name:find("^cm%-") then picked[#picked + 1] = cm end
    end
    cms:update_each(picked, function(cm) cm.data.done = "yes" end,
      { concurrency = 2, on_error = "continue", retry = { batch_time = 0 } })
]])
    assert.equal(4, count("PATCH", "/configmaps/cm%-%d$"))
    assert.equal(4, #h:fired())
  end)

  it("docs/engine-api.md's example runs as printed #fakeonly", function()
    local doc = assert(files.read("docs/engine-api.md"))
    local at = assert(doc:find("\n### Retry budgets\n", 1, true))
    local example = assert(doc:match("```lua\n(.-)```", at))
    h:faults { { method = "GET", path = "/configmaps/cm-1$", times = -1, status = 500 },
      { method = "PATCH", path = "/configmaps/cm-2$", times = -1, status = 500 } }
    local res = migrate(example)
    assert.equal(2, count("GET", "/configmaps/cm%-1$"))
    assert.equal(3, count("PATCH", "/configmaps/cm%-2$"))
    assert.equal(5, #h:fired())
    -- the version ConfigMap and cm-1, 3 and 4 changed; cm-2 named
    assert.same({ read = false, changed = 4, failed = 1 }, res.outcome.counts)
  end)

  for _, case in ipairs {
    { "{ attempts = 0 }", "retry.attempts must be an integer of at least 1" },
    { "{ attempts = 1.5 }", "retry.attempts must be an integer of at least 1" },
    { "{ time = -1 }", "retry.time must be a number of seconds" },
    { "{ base_delay = 0 }", "retry: base_delay is not a retry budget's (attempts, time); the backoff and Retry-After are the engine's" },
    { "{ batch_retries = 3 }", "retry: batch_retries is not a retry budget's (attempts, time)" },
    { "'fast'", "retry must be a table" },
  } do
    it("refuses a budget it cannot keep: " .. case[1], function()
      local err = migrate_error(([[
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:get("cozy-system", "cm-1", { retry = %s })
]]):format(case[1]))
      assert.equal("migration", err.kind)
      assert.matches(case[2], err.message, 1, true)
      assert.equal(0, count("GET", "/configmaps/cm%-1$"))
    end)
  end
end)
