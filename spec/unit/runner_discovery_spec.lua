-- Discovery and validation of a migration set: pure logic, no server.
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.errors"

local fixtures = "spec/fixtures/runner/"

local function invalid_message(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an invalid migration set")
  assert.is_true(errors.is(err, "invalid"), "not an 'invalid' error: " .. tostring(err))
  return err.message, err
end

describe("runner discovery", function()
  it("classifies file names", function()
    assert.same({ 59, "lua" }, { discovery.classify("59-vmi-hotplug.lua") })
    assert.same({ 7, "legacy" }, { discovery.classify("7") })
    assert.same({ 12, "legacy" }, { discovery.classify("12-fix-things") })
    assert.same({ 8, "lua" }, { discovery.classify("08-leading-zero.lua") })
    assert.is_nil(discovery.classify("README.md"))
    assert.is_nil(discovery.classify(".7-hidden.lua"))
    assert.is_nil(discovery.classify("helper.lua"))
  end)

  it("refuses a migration number that does not fit, instead of skipping the file", function()
    for _, name in ipairs({ "99999999999999999999-x.lua", "1000001-x.lua", "123456789012" }) do
      local ok, err = pcall(discovery.classify, name)
      assert.is_false(ok, name)
      assert.is_true(errors.is(err, "invalid"), tostring(err))
      assert.matches(name .. ": migration number", err.message, 1, true)
    end
    assert.same({ 1000000, "lua" }, { discovery.classify("1000000-x.lua") })
  end)

  it("finds Lua and legacy migrations in order, with sha256 and descriptions", function()
    local set = discovery.discover{ migrations = fixtures .. "legacy", builtin = false }
    assert.same({ 1, 2, 3 }, { set.migrations[1].number, set.migrations[2].number, set.migrations[3].number })
    assert.same({ "lua", "legacy", "legacy" }, { set.migrations[1].kind, set.migrations[2].kind, set.migrations[3].kind })
    assert.equal("first step: creates runner-test", set.migrations[1].description)
    assert.matches("^%x+$", set.migrations[1].sha256)
    assert.equal(64, #set.migrations[1].sha256)
    assert.equal(fixtures .. "legacy/2-stamps", set.migrations[2].path)
    assert.equal(4, discovery.default_target(set))
  end)

  it("refuses a duplicate number, naming both files", function()
    local msg = invalid_message(discovery.discover, { migrations = fixtures .. "dup", builtin = false })
    assert.matches("duplicate migration number 1", msg)
    assert.matches("1%-again.lua", msg)
    assert.matches("1%-first.lua", msg)
  end)

  it("refuses a syntax error with file and line", function()
    local msg, err = invalid_message(discovery.discover, { migrations = fixtures .. "syntax", builtin = false })
    assert.matches("syntax/2%-broken.lua:4:", msg)
    assert.matches("2%-broken.lua$", err.file)
  end)

  it("refuses a file that does not return the contract table", function()
    local msg = invalid_message(discovery.discover, { migrations = fixtures .. "shape", builtin = false })
    assert.matches("2%-no%-run.lua: run must be a function", msg)
  end)

  it("validates the table's shape", function()
    local v = discovery.validate_definition
    local run = function() end
    assert.no_error(function() v({ description = "x", run = run }, "f") end)
    assert.no_error(function() v({ description = "x", run = run, check = run,
      permissions = { { verb = "get", resource = "pods" } } }, "f") end)
    for _, bad in ipairs({
      { 42, "must return a table" },
      { { run = run }, "description" },
      { { description = "", run = run }, "description" },
      { { description = "a\nb", run = run }, "one line" },
      { { description = "x", run = run, check = 1 }, "check must be" },
      { { description = "x", run = run, extra = 1 }, "unexpected field \"extra\"" },
      { { description = "x", run = run, permissions = { { verb = "get" } } }, "permissions%[1%]" },
    }) do
      local msg = invalid_message(v, bad[1], "f.lua")
      assert.matches("^f.lua: ", msg)
      assert.matches(bad[2], msg)
    end
  end)

  it("computes pending steps and refuses a gap inside [current, target)", function()
    local set = discovery.discover{ migrations = fixtures .. "gap", builtin = false }
    assert.equal(1, #discovery.pending(set, 1, 2))
    assert.equal(0, #discovery.pending(set, 3, 3))
    local msg = invalid_message(discovery.pending, set, 1, 4)
    assert.matches("no migration for version 2", msg)
  end)

  it("takes a legacy file whatever its mode, and runs sh scripts and those without #! as POSIX sh", function()
    local legacy = require "cozy.runner.legacy"
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir .. " && printf '#!/bin/sh\\nset -o pipefail\\n' > " .. dir .. "/5-old"
      .. " && printf '#!/usr/bin/env python3\\n' > " .. dir .. "/6-py && printf 'echo hi\\n' > " .. dir .. "/7"
      .. " && cp " .. dir .. "/6-py " .. dir .. "/8-exec && chmod +x " .. dir .. "/8-exec")
    local set = discovery.discover { migrations = dir, builtin = false }
    os.execute("rm -rf " .. dir)
    local m = set.by_number
    assert.is_false(m[5].executable)
    assert.same({ "/bin/bash", "--posix", dir .. "/5-old" }, legacy.command(m[5]))
    assert.same({ "/usr/bin/env", "python3", dir .. "/6-py" }, legacy.command(m[6]))
    assert.same({ "/bin/bash", "--posix", dir .. "/7" }, legacy.command(m[7]))
    assert.same({ dir .. "/8-exec" }, legacy.command(m[8]))
  end)

  it("keeps a legacy entry that is not a file as a defect, refused only inside the pending range", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir .. "/6 && printf '#!/bin/sh\\n' > " .. dir .. "/5")
    local set = discovery.discover { migrations = dir, builtin = false }
    os.execute("rm -rf " .. dir)
    assert.equal(1, #discovery.pending(set, 5, 6))
    assert.same({ dir .. "/6: is not a regular file" }, discovery.defects(set, 5, 6))
    assert.matches(dir .. "/6: is not a regular file", invalid_message(discovery.pending, set, 5, 7), 1, true)
    assert.same({}, discovery.defects(set, 5, 7))
  end)

  it("refuses a missing directory", function()
    local msg = invalid_message(discovery.discover, { migrations = "/nonexistent/dir", builtin = false })
    assert.matches("not a directory", msg)
  end)
end)
