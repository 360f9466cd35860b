-- json.holds(v, key, value, max_depth): whether some table in v has
-- t[key] == value, or v nests deeper than max_depth (there the caller
-- cannot know). The plan's diff copies an object for redaction only when
-- it holds a Secret (cozy.kube.changes), so a miss here would print one.
local json = require "cozy.json"

local function nested(levels, leaf)
  local v = leaf
  for _ = 1, levels do v = { x = v } end
  return v
end

describe("json.holds", function()
  it("finds the pair at the root, in an object, in an array and under a list's items", function()
    assert.is_true(json.holds({ kind = "Secret" }, "kind", "Secret", 64))
    assert.is_true(json.holds(json.decode('{"spec":{"template":{"kind":"Secret"}}}'), "kind", "Secret", 64))
    assert.is_true(json.holds(json.decode('{"items":[{"kind":"ConfigMap"},{"kind":"Secret"}]}'), "kind", "Secret",
      64))
    assert.is_true(json.holds({ 1, 2, { 3, { kind = "Secret" } } }, "kind", "Secret", 64))
  end)

  it("misses what is not the pair: another value, the value under another key, a key only, a non-table", function()
    local vm = json.decode('{"kind":"VirtualMachine","metadata":{"name":"Secret","labels":{"kind":"secret"}},'
      .. '"spec":{"volumes":[{"secret":{"secretName":"Secret"}}]},"data":{"Secret":"kind"}}')
    assert.is_false(json.holds(vm, "kind", "Secret", 64))
    assert.is_false(json.holds("Secret", "kind", "Secret", 64))
    assert.is_false(json.holds(json.null, "kind", "Secret", 64))
    assert.is_false(json.holds({}, "kind", "Secret", 64))
  end)

  it("compares raw: 1 and 1.0 are one number, a metatable's __index is not read", function()
    assert.is_true(json.holds({ { n = 1.0 } }, "n", 1, 64))
    local hidden = setmetatable({}, { __index = { kind = "Secret" } })
    assert.is_false(json.holds({ a = hidden }, "kind", "Secret", 64))
  end)

  it("says true for a table deeper than max_depth, false for one at it", function()
    -- the root is at depth 0: nested(64) has a table at depth 64, nested(65) one at 65
    assert.is_false(json.holds(nested(64, {}), "kind", "Secret", 64))
    assert.is_true(json.holds(nested(65, {}), "kind", "Secret", 64))
    assert.is_false(json.holds(nested(65, "leaf"), "kind", "Secret", 64))
    assert.is_true(json.holds({}, "kind", "Secret", -1))
    -- past json.max_depth it stops there (a cycle ends too)
    local cycle = {}
    cycle.self = cycle
    assert.is_true(json.holds(cycle, "kind", "Secret", 1e9))
  end)

  it("refuses a call without its arguments", function()
    local ok, err = pcall(json.holds, {})
    assert.is_false(ok)
    assert.matches("bad argument #2 to 'cozy.json.holds' %(value expected%)", err)
    ok, err = pcall(json.holds, {}, "kind", "Secret")
    assert.is_false(ok)
    assert.matches("bad argument #4 to 'cozy.json.holds' %(number expected, got no value%)", err)
  end)
end)
