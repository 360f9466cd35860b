-- cozy.validate: the one argument validator (docs/engine-api.md, "Argument
-- checks"): name/value/expected tuples, optional arguments, the message's
-- words, and the error positioned at the line that called the checked
-- function, never at the engine's.
local validate = require "cozy.validate"

-- What fn raised, and the text before ": " of its position (nil for none).
local function raised(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  assert.equal("string", type(err))
  return err
end

local THIS_FILE = debug.getinfo(1, "S").short_src

describe("cozy.validate.arg", function()
  it("accepts a value of the type, a list of types, a pseudo-type, a value of a list, or a predicate", function()
    assert.equal("x", validate.arg(2, "f(x)", "x", "x", "string"))
    assert.equal(3, validate.arg(2, "f(x)", "x", 3, { "string", "number" }))
    assert.equal(3, validate.arg(2, "f(x)", "x", 3, "integer"))
    assert.equal("a", validate.arg(2, "f(x)", "x", "a", "non-empty string"))
    assert.equal("skip", validate.arg(2, "f(x)", "x", "skip", { one_of = { "skip", "fail" } }))
    assert.equal(4, validate.arg(2, "f(x)", "x", 4, function(v) return v % 2 == 0 end, { says = "even" }))
  end)

  it("accepts nil only for an optional argument", function()
    assert.is_nil(validate.arg(2, "f(opts)", "opts", nil, "table", true))
    assert.is_nil(validate.arg(2, "f(opts)", "opts", nil, "table", { optional = true }))
    assert.matches("f%(opts%): opts must be a table$", raised(validate.arg, 1, "f(opts)", "opts", nil, "table"))
  end)

  it("words the message from the type names, the values of a one_of, or `says`, with the value shown if asked", function()
    local function message(...)
      return (raised(validate.arg, 1, ...):gsub("^.-:%d+: ", ""))
    end
    assert.equal("f(opts): opts must be a table", message("f(opts)", "opts", 5, "table"))
    assert.equal("x must be an integer", message(nil, "x", 1.5, "integer"))
    assert.equal("f: k must be a number, a string or a boolean, got a table",
      message("f", "k", {}, { "number", "string", "boolean" }, { show = "got" }))
    assert.equal('f: severity must be "info", "warn" or "block", got "fatal"',
      message("f", "severity", "fatal", { one_of = { "info", "warn", "block" } }, { show = "got" }))
    assert.equal("obj.walk(v, fn): fn must be a function(value, path), not a nil",
      message("obj.walk(v, fn)", "fn", nil, "function", { says = "a function(value, path)", show = "not" }))
    assert.equal("f: x must be a non-empty string", message("f", "x", "", "non-empty string"))
    -- a long string is shown cut, quoted
    assert.equal(('f: x must be a number, not "%s"...'):format(("y"):rep(60)),
      message("f", "x", ("y"):rep(500), "number", { show = "not" }))
  end)

  it("never runs the value's code to report it", function()
    local hostile = setmetatable({}, { __tostring = function() error("ran") end, __name = "x" })
    assert.equal("f: x must be a string, got a table",
      (raised(validate.arg, 1, "f", "x", hostile, "string", { show = "got" }):gsub("^.-:%d+: ", "")))
  end)

  it("positions the error at the line that called the checked function (level 2), not the checker's", function()
    local function checked(opts)
      validate.arg(2, "checked(opts)", "opts", opts, "table", true)
      return opts
    end
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() local _ = checked(5) end)
    assert.is_false(ok)
    assert.equal(("%s:%d: checked(opts): opts must be a table"):format(THIS_FILE, line), err)
    -- level 3: a helper of the checked function names its caller's caller
    local function helper(v) validate.arg(3, "outer(v)", "v", v, "string") end
    local function outer(v) helper(v) return v end
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() local _ = outer(1) end)
    assert.is_false(ok)
    assert.equal(("%s:%d: outer(v): v must be a string"):format(THIS_FILE, line), err)
  end)
end)

describe("cozy.validate's position past the engine's frames", function()
  it("names the first line outside scripts/cozy/, however many engine wrappers lie between", function()
    local function checked(opts) validate.arg(2, "checked(opts)", "opts", opts, "table") end
    -- two wrappers that are the engine's (by their chunk's name), neither a tail call
    local wrap = assert(load("local f = ...; return function(x) local r = f(x); return r end",
      "@scripts/cozy/wrapper.lua"))
    local twice = wrap(wrap(checked))
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() local _ = twice(5) end)
    assert.is_false(ok)
    assert.equal(("%s:%d: checked(opts): opts must be a table"):format(THIS_FILE, line), err)
  end)

  it("keeps the level given when every frame above is the engine's", function()
    local run = assert(load([[
      local validate = require "cozy.validate"
      local function checked(v) validate.arg(2, "f(v)", "v", v, "string") end
      local function engine() checked(1) end
      local ok, err = pcall(engine)
      return err
    ]], "@scripts/cozy/inner.lua"))
    -- run as a coroutine's body: the engine chunk is the stack's last frame
    -- (no spec frame above it), so the level given names its line 3
    assert.equal("scripts/cozy/inner.lua:3: f(v): v must be a string", coroutine.wrap(run)())
  end)
end)

describe("cozy.validate.args", function()
  it("checks each tuple in order, a tuple's nil value included, and names the first that fails", function()
    local function f(a, b, c)
      validate.args(2, "f(a, b, c)", { { "a", a, "string" }, { "b", b, "table", true }, { "c", c, "function" } })
    end
    f("x", nil, print)
    assert.matches("f%(a, b, c%): b must be a table$", raised(f, "x", 1, 2))
    assert.matches("f%(a, b, c%): c must be a function$", raised(f, "x", nil, nil))
    assert.matches("f%(a, b, c%): a must be a string$", raised(f, nil, 1, nil))
  end)
end)

describe("cozy.validate.why", function()
  it("returns why a value is not what it must be, or nil, without raising", function()
    assert.is_nil(validate.why("x", "s", "string"))
    assert.is_nil(validate.why("x", nil, "string", true))
    assert.equal("a key must be a string, not a number", validate.why("a key", 3, "string", { show = "not" }))
  end)
end)

-- The engine's own argument errors are the validator's: each names the
-- line of the caller, keeps the wording specs and docs quote, and is what
-- the hand-written checks it replaced said.
describe("the engine's argument checks", function()
  local obj = require "cozy.obj"
  local match = require "cozy.match"
  local recipe = require "cozy.recipe"
  local join = require "cozy.kube.join"
  local budget = require "cozy.kube.budget"

  local cases = {
    { function() local _ = obj.walk({}, 5) end, "obj.walk(v, fn): fn must be a function(value, path)" },
    { function() local _ = obj.set_annotation({}, "a", 1) end, "cozy.obj: an annotation value must be a string, not a number" },
    { function() local _ = obj.set_label(5, "a", "b") end, "cozy.obj: the object must be a table" },
    { function() local _ = match.glob(nil, "a") end, "cozy.match: a glob must be a string, not a nil" },
    { function() local _ = match.any(5, "a") end, "cozy.match: any(globs, name): globs must be an array of strings, not a number" },
    { function() local _ = recipe.permissions("configmaps", {}) end, "cozy.recipe: permissions(resource, verbs): verbs must be a list of verbs" },
    { function() local _ = recipe.delete { "configmaps", name = "", description = "d" } end,
      "cozy.recipe: delete{...}: name must be a non-empty string" },
    { function() local _ = join.new({}, {}, { key = print, left_key = 1 }) end, "join(left, right, opts): opts.left_key must be a function" },
    { function() local _ = budget.new({ attempts = 0 }, false, 1) end,
      "retry.attempts must be an integer of at least 1 (the first attempt included)" },
    { function() local _ = budget.new({ time = -1 }, false, 1) end, "retry.time must be a number of seconds" },
  }
  for i, case in ipairs(cases) do
    it(("case %d: %s"):format(i, case[2]), function()
      local line = debug.getinfo(case[1], "S").linedefined
      local ok, err = pcall(case[1])
      assert.is_false(ok)
      assert.equal(("%s:%d: %s"):format(THIS_FILE, line, case[2]), err)
    end)
  end
end)
