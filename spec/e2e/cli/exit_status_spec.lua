-- The binary's exit status is what cozy.cli.main returns (core/main.c): an
-- integer 0-255 passed through, nil as 0, anything else one clear error
-- line and exit 1, never a panic.
local cli = require("spec.helpers").cli

local q = cli.quote

-- A copy of scripts/ whose cozy/cli.lua is `source`, for COZY_MIGRATE_SCRIPTS.
local function scripts_with_cli(source)
  local dir = cli.tmpdir()
  assert(os.execute("cp -r scripts " .. q(dir .. "/scripts")))
  local f = assert(io.open(dir .. "/scripts/cozy/cli.lua", "wb"))
  f:write(source)
  f:close()
  return dir
end

describe("core/main.c: the exit status of cozy.cli.main", function()
  local dirs = {}
  teardown(function()
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. q(d)) end
  end)

  local function run_with(result)
    local dir = scripts_with_cli("return { main = function() return " .. result .. " end }\n")
    dirs[#dirs + 1] = dir
    return cli.run({ "--version" }, { COZY_MIGRATE_SCRIPTS = dir .. "/scripts" })
  end

  it("is an error (exit 1, one clear line), not a panic, when it is a string", function()
    local res = run_with('"oops"')
    assert.equal(1, res.code) -- was 134: luaL_optinteger raised outside any protected call
    assert.matches("cozy.cli.main returned string oops, not an exit status %(0%-255%)", res.stderr)
    assert.not_matches("PANIC", res.stderr)
  end)

  it("is an error when it is not an integer or out of range", function()
    for _, v in ipairs { "2.5", "256", "-1", "{}" } do
      local res = run_with(v)
      assert.equal(1, res.code, v)
      assert.matches("not an exit status", res.stderr, 1, v)
    end
  end)

  it("is passed through when it is an integer 0-255, and nil means 0", function()
    assert.equal(3, run_with("3").code)
    assert.equal(0, run_with("nil").code)
    assert.equal(2, run_with("2.0").code) -- an integral float is an integer
  end)
end)
