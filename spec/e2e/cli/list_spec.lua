-- `list`: no cluster needed.
local cli = require("spec.helpers").cli
local json = require "cozy.json"

local fixtures = "spec/fixtures/runner/"

describe("cozy-migrate list", function()
  it("lists number, name, kind, sha256 and description", function()
    local r = cli.run({ "list", "--no-builtin", "--migrations", fixtures .. "legacy" })
    assert.equal(0, r.code, r.stderr)
    local lines = cli.lines(r.stdout)
    assert.equal(3, #lines)
    assert.matches("^1%s+1%-first%s+lua%s+%x+%s+first step: creates runner%-test$", lines[1])
    assert.matches("^2%s+2%-stamps%s+legacy%s+%x+%s+legacy script$", lines[2])
  end)

  it("lists as JSON", function()
    local r = cli.run({ "list", "--no-builtin", "--migrations", fixtures .. "two", "--output", "json" })
    assert.equal(0, r.code, r.stderr)
    local doc = json.decode(r.stdout)
    assert.equal(2, #doc.migrations)
    assert.same({ 2, "2-second", "lua" }, { doc.migrations[2].number, doc.migrations[2].name, doc.migrations[2].kind })
    assert.equal(64, #doc.migrations[1].sha256)
  end)

  for _, case in ipairs({
    { "dup", "duplicate migration number 1" },
    { "syntax", "2%-broken.lua:4:" },
    { "shape", "2%-no%-run.lua: run must be a function" },
  }) do
    it("refuses an invalid set (" .. case[1] .. ") with exit 2", function()
      local r = cli.run({ "list", "--no-builtin", "--migrations", fixtures .. case[1] })
      assert.equal(2, r.code)
      assert.matches(case[2], r.stderr)
    end)
  end

  it("logs JSON lines with --log-format json", function()
    local r = cli.run({ "list", "--no-builtin", "--migrations", fixtures .. "dup", "--log-format", "json" })
    assert.equal(2, r.code)
    local line = json.decode(cli.lines(r.stderr)[1])
    assert.equal("error", line.level)
    assert.matches("duplicate", line.msg)
  end)
end)
