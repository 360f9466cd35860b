-- cozy.diff: a unified diff as `diff -u` writes one. Each case runs GNU
-- diff on the same two texts and wants the same lines.
local diff = require "cozy.diff"
local files = require("spec.helpers").files

local function lines_of(n, f)
  local out = {}
  for i = 1, n do out[i] = f(i) end
  return out
end

local function gnu(a, b)
  local dir = files.tmpdir("cozy-diff")
  files.write(dir .. "/a", #a > 0 and (table.concat(a, "\n") .. "\n") or "")
  files.write(dir .. "/b", #b > 0 and (table.concat(b, "\n") .. "\n") or "")
  local out = files.capture(("diff -u --label from --label to %s/a %s/b"):format(dir, dir))
  files.rm_rf(dir)
  return files.lines(out)
end

local base = lines_of(30, function(i) return "line " .. i end)

local function with(changes)
  local out = {}
  for i, l in ipairs(base) do
    local c = changes[i]
    if c == nil then out[#out + 1] = l
    elseif c ~= false then for _, x in ipairs(c) do out[#out + 1] = x end end
  end
  return out
end

local CASES = {
  { "one line changed in the middle", base, with { [15] = { "line 15 changed" } } },
  { "a line added at the start", base, with { [1] = { "new", "line 1" } } },
  { "a line removed at the end", base, with { [30] = false } },
  { "two changes far apart: two hunks", base, with { [3] = { "x" }, [25] = { "y" } } },
  { "two changes 6 lines apart: one hunk", base, with { [10] = { "x" }, [17] = { "y" } } },
  { "two changes 7 lines apart: two hunks", base, with { [10] = { "x" }, [18] = { "y" } } },
  { "a block replaced by more lines", base, with { [12] = { "a", "b", "c" }, [13] = false, [14] = { "d" } } },
  { "created: from nothing", {}, lines_of(5, function(i) return "new " .. i end) },
  { "deleted: to nothing", lines_of(5, function(i) return "old " .. i end), {} },
  { "interleaved", { "a", "b", "c", "d", "e" }, { "a", "x", "c", "y", "e", "f" } },
}

describe("cozy.diff", function()
  for _, case in ipairs(CASES) do
    it("writes what diff -u writes: " .. case[1], function()
      assert.same(gnu(case[2], case[3]), diff.unified(case[2], case[3], "from", "to"))
    end)
  end

  it("gives nothing for equal texts", function()
    assert.same({}, diff.unified(base, base, "from", "to"))
  end)

  it("shows a change too large for the shortest script as all removed and all added, in linear time", function()
    local a = lines_of(3000, function(i) return "a" .. i end)
    local b = lines_of(3000, function(i) return "b" .. i end)
    local out = diff.unified(a, b, "from", "to")
    assert.equal("@@ -1,3000 +1,3000 @@", out[3])
    assert.equal(6003, #out)
    assert.equal("-a1", out[4])
    assert.equal("+b1", out[3004])
  end)
end)
