-- What a step reports for the history (ctx.outcome): checked when it
-- reports it, bounded in count and size, and never stopping the stamp.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

describe("what a step reports for the history", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function run_reporting(body)
    local dir = cli.migration_dir { ["1-reports.lua"] = ([[
return { description = "reports", run = function(ctx)
%s
end }
]]):format(body) }
    local r = cli.run(cli.args(srv, dir, "run"))
    files.rm_rf(dir)
    local _, cm = cli.version(srv)
    return r, cm and cli.history(cm)[1]
  end

  it("a ratio of nothing (0/0) is left out with a warning; the step is stamped", function()
    local r, rec = run_reporting("ctx:outcome{ ratio = 0/0, big = math.huge, copied = 0 }")
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
    assert.same({ copied = 0 }, rec.outcome.counts)
    assert.matches("ctx:outcome: ratio is %-?nan, not a finite number: left out of the history", r.stderr)
  end)

  it("a key longer than 63 bytes is refused when it is reported, and nothing of that call is kept", function()
    local r = run_reporting([[ctx:outcome{ kept = 1 }
  local ok, err = pcall(ctx.outcome, ctx, { [("k"):rep(100000)] = 1, other = 2 })
  assert(not ok and err:find("keys must be texts of 1 to 63 bytes without control characters", 1, true), tostring(err))]])
    assert.equal(0, r.code, r.stderr)
    local _, cm = cli.version(srv)
    assert.is_true(#cm.data.history < 4096, "the history grew to " .. #cm.data.history .. " bytes")
    assert.same({ kept = 1 }, cli.history(cm)[1].outcome.counts)
  end)

  it("an outcome over the record's bound is replaced by a note; the stamp goes on", function()
    local r, rec = run_reporting([[
  local t = {}
  for i = 1, 20 do t[("key_%02d_%s"):format(i, ("x"):rep(50))] = ("v"):rep(300) end
  ctx:outcome(t)
  for i = 1, 12 do ctx.log:warn(("w%d "):format(i) .. ("y"):rep(300)) end]])
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
    assert.is_nil(rec.outcome.counts)
    assert.matches("the outcome made the record %d+ bytes, over 4096", rec.outcome.dropped)
  end)
end)
