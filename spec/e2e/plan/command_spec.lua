-- `plan`, `run --dry-run` and `--server-dry-run`: nothing persists.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli

-- objects without the bookkeeping a server adds (the request log shows
-- reads; this shows nothing changed)
-- the writes a plan sent that could persist: a rehearsal sends each with dryRun=All
local function persisting_writes(srv)
  local out = {}
  for _, r in ipairs(cli.writes(srv)) do
    if r.query ~= "dryRun=All" then out[#out + 1] = r.method .. " " .. r.path .. "?" .. tostring(r.query) end
  end
  return out
end

local function state(srv)
  local out = {}
  for _, o in ipairs(srv:objects()) do
    out[#out + 1] = json.encode({ kind = o.kind, ns = o.metadata.namespace, name = o.metadata.name,
      rv = o.metadata.resourceVersion, data = o.data, spec = o.spec })
  end
  table.sort(out)
  return out
end

describe("cozy-migrate plan", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:reset(cli.fixture(1))
    srv:clear_requests()
  end)

  for _, args in ipairs({ { "plan" }, { "run", "--dry-run" } }) do
    it(table.concat(args, " ") .. " writes nothing, sends each write with dryRun=All and prints it", function()
      local before = state(srv)
      local r = cli.run(cli.args(srv, "two", table.unpack(args)))
      assert.equal(0, r.code, r.stderr)
      assert.same({}, persisting_writes(srv))
      assert.same(before, state(srv))
      assert.matches("plan: version 1 %-> 3, 2 step%(s%), rehearsed over the live cluster %(writes sent with "
        .. "dryRun=All%), nothing written", r.stdout)
      assert.matches("POST /api/v1/namespaces/cozy%-system/configmaps", r.stdout)
      assert.matches('"name":"runner%-test"', r.stdout)
      assert.matches("PATCH /api/v1/namespaces/cozy%-system/configmaps/cozystack%-version", r.stdout)
      assert.matches('"path":"/data/version","value":"3"', r.stdout)
      assert.matches("plan: 2 step%(s%), 4 write%(s%)", r.stdout)
    end)
  end

  it("prints JSON lines with --log-format json", function()
    local r = cli.run(cli.args(srv, "two", "plan", "--log-format", "json"))
    assert.equal(0, r.code, r.stderr)
    local kinds, writes = {}, {}
    for _, line in ipairs(cli.lines(r.stdout)) do
      local obj = json.decode(line)
      kinds[#kinds + 1] = obj.type
      if obj.type == "write" then writes[#writes + 1] = obj end
    end
    -- then one "object" each for what the rehearsal would leave: the ConfigMap created, the version stamped
    assert.same({ "plan", "step", "write", "write", "rehearsed", "step", "write", "write", "rehearsed", "object",
      "object", "summary" }, kinds)
    assert.equal("POST", writes[1].method)
    assert.equal("runner-test", writes[1].body.metadata.name)
    assert.equal("PATCH", writes[2].method)
    assert.equal("application/json-patch+json", writes[2].content_type)
    assert.equal(1, writes[1].step)
  end)

  it("--server-dry-run sends the writes with dryRun=All and persists nothing", function()
    local before = state(srv)
    local r = cli.run(cli.args(srv, "two", "plan", "--server-dry-run"))
    assert.equal(0, r.code, r.stderr)
    local writes = cli.writes(srv)
    assert.is_true(#writes >= 3)
    for _, w in ipairs(writes) do
      assert.matches("dryRun=All", w.query, w.method .. " " .. w.path)
    end
    assert.same(before, state(srv))
    assert.matches("PATCH /api/v1/namespaces/cozy%-system/configmaps/cozystack%-version%?dryRun=All", r.stdout)
    -- every write sent is shown once
    local shown = 0
    for _ in r.stdout:gmatch("\n  [A-Z]+ /[^\n]*%?dryRun=All") do shown = shown + 1 end
    assert.equal(#writes, shown)
    assert.matches("writes sent with dryRun=All", r.stdout)
    r = cli.run(cli.args(srv, "two", "run", "--server-dry-run"))
    assert.equal(0, r.code, r.stderr)
    assert.same(before, state(srv))
  end)

  it("plans the bootstrap of a fresh install without writing it", function()
    srv:reset(cli.fixture(nil))
    srv:clear_requests()
    local r = cli.run(cli.args(srv, "two", "plan"))
    assert.equal(0, r.code, r.stderr)
    assert.same({}, persisting_writes(srv))
    assert.matches("would create it at version 3", r.stdout)
    assert.is_nil(cli.version(srv))
  end)

  it("reports a step that would fail, rehearses none after it, and exits 1", function()
    local r = cli.run(cli.args(srv, "fail", "plan"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("step 2 %(2%-fails%) would fail", r.stdout)
    assert.matches("step 3: 3%-never %(lua%): not rehearsed: step 2%-fails would fail", r.stdout)
    assert.same({}, persisting_writes(srv))
  end)
end)
