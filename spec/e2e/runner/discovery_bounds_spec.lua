-- Discovery's bounds: a pending range costs what the migration set holds,
-- whatever the target (discovery.span walks the migrations, not the
-- versions; gaps are ranges in `status`). Bad bytes: output/utf8_spec.lua.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

describe("a target far past the last migration", function()
  local srv
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) } } end)
  teardown(function() srv:stop() end)

  for _, target in ipairs({ "3000000", "2147483647" }) do
    it(("status --target %s lists the gap as one range"):format(target), function()
      local dir = cli.migration_dir { ["1-one.lua"] = [[return { description = "one", run = function() end }]] }
      -- in the background, bounded: an old binary walked every version
      local p = cli.start(cli.args(srv, dir, "status", "--target", target, "--output", "json"))
      finally(function() p:cleanup(); files.rm_rf(dir) end)
      local r = p:wait(60)
      assert.equal(0, r.code, r.stderr)
      local st = json.decode(r.stdout)
      assert.equal(2, #st.pending)
      assert.equal(1, st.pending[1].number)
      assert.same({ number = 2, through = tonumber(target) - 1, missing = true }, st.pending[2])
      assert.equal(("%d pending"):format(tonumber(target) - 1), st.state)
      assert.matches(("no migrations for versions 2 to %d: run would refuse (gap)"):format(tonumber(target) - 1),
        st.warnings[1], 1, true)
    end)
  end

  it("run refuses the gap at once, naming its first version", function()
    local dir = cli.migration_dir { ["1-one.lua"] = [[return { description = "one", run = function() end }]] }
    local p = cli.start(cli.args(srv, dir, "run", "--target", "2147483647"))
    finally(function() p:cleanup(); files.rm_rf(dir) end)
    local r = p:wait(60)
    assert.equal(2, r.code, r.stderr)
    assert.matches("no migration for version 2: a gap inside [1, 2147483647)", r.stderr, 1, true)
  end)
end)
