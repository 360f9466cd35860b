-- The stamp cannot be lost or blocked: a ConfigMap deleted where a Lease
-- shows migrations have run is an error for an operator, never a fresh
-- install; what a step reports for the history is checked when it reports
-- it, bounded in count and size, and never stops the stamp.
-- (Issue: a hostile run, class 4.)
local fake = require "spec.support.fake"
local files = require "spec.helpers.files"
local json = require "cozy.json"
local support = require "spec.helpers.cli"

local NOOP = [[return { description = "step %d", run = function(ctx) end }]]

describe("a stamp ConfigMap deleted during a run", function()
  local srv, dir
  setup(function()
    srv = fake.start { fixtures = {} }
    -- 1 -> 4; step 2 deletes the stamp, as an operator or a stray script would
    dir = support.migration_dir {
      ["1-one.lua"] = NOOP:format(1),
      ["2-deletes-the-stamp.lua"] = [[
return { description = "deletes the stamp",
  permissions = { { verb = "delete", group = "", resource = "configmaps" } },
  run = function(ctx) ctx.kube:resource("v1", "configmaps"):delete("cozy-system", "cozystack-version") end }
]],
      ["3-three.lua"] = NOOP:format(3),
    }
  end)
  teardown(function() srv:stop(); files.rm_rf(dir) end)

  it("fails that run naming the ConfigMap, and every rerun refuses to bootstrap over it", function()
    srv:reset(support.fixture(1))
    local r = support.run(support.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("the version ConfigMap cozy-system/cozystack-version was deleted during the run (it was at version 2)",
      r.stderr, 1, true)
    assert.equal("", support.lease_holder(srv))
    for _, command in ipairs({ "run", "plan" }) do
      local again = support.run(support.args(srv, dir, command))
      assert.equal(1, again.code, command .. ": " .. again.stderr)
      assert.matches("the version ConfigMap cozy-system/cozystack-version is missing, but the Lease "
        .. "cozy-system/cozystack-migrations shows that migrations have run here", again.stderr, 1, true)
      assert.is_nil(support.version(srv), command .. " created a stamp")
    end
    local st = support.run(support.args(srv, dir, "status", "--output", "json"))
    assert.equal(0, st.code, st.stderr)
    local status = json.decode(st.stdout)
    assert.matches("^stamp missing", status.state)
    assert.matches("is missing but the Lease cozystack-migrations exists", table.concat(status.warnings, "\n"), 1, true)
  end)

  it("a cluster without a Lease and without a stamp is still a fresh install", function()
    srv:reset(support.fixture(nil))
    local r = support.run(support.args(srv, dir, "run"))
    assert.equal(0, r.code, r.stderr)
    assert.equal(4, support.version(srv))
  end)
end)

describe("what a step reports for the history", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(support.fixture(1)) end)

  local function run_reporting(body)
    local dir = support.migration_dir { ["1-reports.lua"] = ([[
return { description = "reports", run = function(ctx)
%s
end }
]]):format(body) }
    local r = support.run(support.args(srv, dir, "run"))
    files.rm_rf(dir)
    local _, cm = support.version(srv)
    return r, cm and support.history(cm)[1]
  end

  it("a ratio of nothing (0/0) is left out with a warning; the step is stamped", function()
    local r, rec = run_reporting("ctx:outcome{ ratio = 0/0, big = math.huge, copied = 0 }")
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, support.version(srv))
    assert.same({ copied = 0 }, rec.outcome.counts)
    assert.matches("ctx.outcome: ratio is %-?nan, not a finite number: left out of the history", r.stderr)
  end)

  it("a key longer than 63 bytes is refused when it is reported, and nothing of that call is kept", function()
    local r = run_reporting([[ctx:outcome{ kept = 1 }
  local ok, err = pcall(ctx.outcome, ctx, { [("k"):rep(100000)] = 1, other = 2 })
  assert(not ok and err:find("keys must be texts of 1 to 63 bytes without control characters", 1, true), tostring(err))]])
    assert.equal(0, r.code, r.stderr)
    local _, cm = support.version(srv)
    assert.is_true(#cm.data.history < 4096, "the history grew to " .. #cm.data.history .. " bytes")
    assert.same({ kept = 1 }, support.history(cm)[1].outcome.counts)
  end)

  it("an outcome over the record's bound is replaced by a note; the stamp goes on", function()
    local r, rec = run_reporting([[
  local t = {}
  for i = 1, 20 do t[("key_%02d_%s"):format(i, ("x"):rep(50))] = ("v"):rep(300) end
  ctx:outcome(t)
  for i = 1, 12 do ctx.log:warn(("w%d "):format(i) .. ("y"):rep(300)) end]])
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, support.version(srv))
    assert.is_nil(rec.outcome.counts)
    assert.matches("the outcome made the record %d+ bytes, over 4096", rec.outcome.dropped)
  end)
end)
