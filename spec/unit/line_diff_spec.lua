-- cozy.diff's unified diff in C (cozy.line_diff, behind diff.unified)
-- against the Lua one it replaces (diff.unified_lua, kept as the
-- definition): the same lines, byte for byte, on random texts of few
-- distinct lines (where Myers' choice among equally short scripts shows),
-- with every context and with the edit limit reached, and on the YAML of
-- migration 59's benchmark fleet as a plan diffs it.
local diff = require "cozy.diff"
local files = require("spec.helpers").files
local json = require "cozy.json"
local yaml = require "cozy.yaml"

-- Random rounds: the plain build runs them all (equality is its job); under
-- AddressSanitizer (hack/test.sh sets ASAN_OPTIONS) a tenth, enough to walk
-- every path of the C with the sanitizer watching, at a tenth of its time.
local ROUNDS = os.getenv("ASAN_OPTIONS") and 2000 or 20000

-- Where the two differ, or nil.
local function first_difference(a, b, context)
  local c = diff.unified(a, b, "live/x", "planned/x", context)
  local l = diff.unified_lua(a, b, "live/x", "planned/x", context)
  for i = 1, math.max(#c, #l) do
    if c[i] ~= l[i] then return ("line %d: C %q, Lua %q"):format(i, tostring(c[i]), tostring(l[i])) end
  end
  return nil
end

local function random_lines(words)
  local lines = {}
  for i = 1, math.random(0, 60) do lines[i] = words[math.random(#words)] end
  return lines
end

describe("cozy.line_diff", function()
  local max_edits
  before_each(function() max_edits = diff.MAX_EDITS end)
  after_each(function() diff.MAX_EDITS = max_edits end)

  it("diffs 20,000 (under ASan 2,000) random texts of few distinct lines as the Lua diff does, with contexts 0 to 5", function()
    math.randomseed(3601)
    local differ = {}
    for i = 1, ROUNDS do
      local words = ({ { "a", "b" }, { "a", "b", "c", "" }, { "x", "y", "z", "a", "b", "c", "d", "e" } })[i % 3 + 1]
      local a = random_lines(words)
      -- b: a edited (most texts a plan diffs), or unrelated
      local b
      if i % 4 == 0 then
        b = random_lines(words)
      else
        b = table.move(a, 1, #a, 1, {})
        for _ = 1, math.random(0, 6) do
          local at = math.random(#b + 1)
          if math.random(2) == 1 and at <= #b then table.remove(b, at) else table.insert(b, at, words[math.random(#words)]) end
        end
      end
      local d = first_difference(a, b, i % 6)
      if d ~= nil and #differ < 5 then
        differ[#differ + 1] = ("text %d: %s\na = %s\nb = %s"):format(i, d, table.concat(a, "|"), table.concat(b, "|"))
      end
    end
    assert.same({}, differ)
  end)

  it("shows all removed and all added past diff.MAX_EDITS, as the Lua diff does", function()
    math.randomseed(3602)
    local differ = {}
    for i = 1, 3000 do
      diff.MAX_EDITS = i % 12
      local d = first_difference(random_lines { "a", "b", "c" }, random_lines { "a", "b", "c" }, 3)
      if d ~= nil and #differ < 5 then differ[#differ + 1] = ("text %d: %s"):format(i, d) end
    end
    assert.same({}, differ)
  end)

  it("leaves to the Lua diff what the plan never passes: lines that are no strings, a context that is no integer", function()
    local a, b = { "a", 1, "c" }, { "a", 2, "c" }
    assert.same(diff.unified_lua(a, b, "x", "y"), diff.unified(a, b, "x", "y"))
    assert.same({ "--- x", "+++ y", "@@ -1,3 +1,3 @@", " a", "-1", "+2", " c" }, diff.unified(a, b, "x", "y"))
    assert.same(diff.unified_lua({ "a" }, { "b" }, "x", "y", 2.0), diff.unified({ "a" }, { "b" }, "x", "y", 2.0))
    assert.same({ "--- 1", "+++ 2.5", "@@ -1 +1 @@", "-a", "+b" }, diff.unified({ "a" }, { "b" }, 1, 2.5))
    assert.same({}, diff.unified({ "a", "b" }, { "a", "b" }, "x", "y"))
  end)

  it("diffs the YAML of migration 59's fleet as the Lua diff does: a VM against the next, and against itself changed", function()
    local list = json.decode(files.fleet_json(400))
    local differ = {}
    local previous
    for _, o in ipairs(list.items) do
      local lines = yaml.lines(o)
      if previous ~= nil then
        local d = first_difference(previous, lines, 3)
        if d ~= nil and #differ < 5 then differ[#differ + 1] = o.metadata.name .. ": " .. d end
      end
      local changed = table.move(lines, 1, #lines, 1, {})
      table.insert(changed, #changed // 2, "  - disk: {}")
      table.insert(changed, #changed // 3, "      name: added")
      changed[#changed] = nil
      local d = first_difference(lines, changed, 3)
      if d ~= nil and #differ < 5 then differ[#differ + 1] = o.metadata.name .. " changed: " .. d end
      previous = lines
    end
    assert.same({}, differ)
  end)
end)
