-- cozy.match (docs/engine-api.md, "Matching names"): globs as the shell's
-- `case` matches them and regular expressions as `grep -E` does, each
-- checked against that very tool on the same names, so "as the shell" is
-- measured and not assumed; the errors a bad pattern raises; and that no
-- pattern takes time exponential in the name.
local files = require("spec.helpers").files
local match = require "cozy.match"
local sandbox = require "cozy.sandbox"

local NAMES = {
  "", "a", "b", "ab", "abc", "tenant-a", "tenant-b", "tenant-ab", "tenantxa", "kube-system", "cozy-system",
  "data-vmstorage-shortterm-0", "data-vmstorage-longterm-12", "data-vmstorage-x-1", "vmstorage-shortterm-0",
  "a.b", "axb", "x.io", "x-io", "*", "?", "]", "[a]", "a-b_c.d", "UPPER", "mixed-Case9", "1234", "12-3",
  "aaaa", "aaab", "ab-xx", "ab-xxx", "ab-xxxx",
}

local GLOBS = {
  "*", "a", "a*", "*b", "a?c", "?", "tenant-*", "tenant-?", "[ab]", "[!ab]", "[a-c]*", "*[0-9]", "*.io", "a.b",
  "\\*", "\\?", "[]]", "*-*-*", "data-vmstorage-*-[0-9]*", "[^a]*", "*a*b*", "[A-Z]*", "",
}

local REGEXES = {
  "^tenant-(a|b)$", "tenant", "^$", "^a.b$", "^a\\.b$", "^data-vmstorage-(shortterm|longterm)-[0-9]+$",
  "^(a|aa)*b$", "^a+$", "^a{2,3}b$", "^a{2}", "x{2,}$", "^[^-]+-[^-]+$", "\\.io$", "(ab|cd)c?",
  "^(?:ab)*c?$", "a|b|c", "^[A-Z]+$", "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "^\\w+$", "\\d+-\\d",
  "^[\\d-]+$", "^.?$", "^(tenant|kube|cozy)-", "b$",
}

-- Which NAMES match, as a string of 0s and 1s, from a shell command that
-- prints the 1-based numbers of the matching names, one per line.
local function bits_from(cmd)
  local out = files.capture(cmd)
  local hit = {}
  for n in out:gmatch("%d+") do hit[tonumber(n)] = true end
  local bits = {}
  for i = 1, #NAMES do bits[i] = hit[i] and "1" or "0" end
  return table.concat(bits)
end

local function bits_of(fn)
  local bits = {}
  for i, name in ipairs(NAMES) do bits[i] = fn(name) and "1" or "0" end
  return table.concat(bits)
end

local q = files.quote

describe("cozy.match", function()
  local dir, names_file
  setup(function()
    dir = files.tmpdir("match-spec")
    names_file = dir .. "/names"
    files.write(names_file, table.concat(NAMES, "\n") .. "\n")
  end)
  teardown(function() files.rm_rf(dir) end)

  it("matches globs as bash's case does", function()
    for _, glob in ipairs(GLOBS) do
      -- the glob unquoted after `case`: bash reads it as a pattern
      local script = ("i=0; while IFS= read -r n; do i=$((i+1)); case \"$n\" in %s) echo $i;; esac; done < %s")
        :format(glob == "" and "''" or glob:gsub("([%s;&|<>()])", "\\%1"), q(names_file))
      local want = bits_from("bash -c " .. q(script))
      assert.equal(want, bits_of(function(n) return match.glob(glob, n) end), "glob " .. glob)
    end
  end)

  it("matches regular expressions as grep -E does", function()
    for _, re in ipairs(REGEXES) do
      -- grep -E has no \d, \w nor (?:...): those are checked below
      if not re:find("\\[dw]") and not re:find("(?:", 1, true) then
        local want = bits_from(("grep -nE %s %s | cut -d: -f1"):format(q(re), q(names_file)))
        assert.equal(want, bits_of(function(n) return match.regex(re, n) end), "regex " .. re)
      end
    end
  end)

  it("agrees with grep -E on generated patterns (a seeded random differential)", function()
    -- patterns from a grammar both read the same way: literals, '.', a
    -- class, groups, alternation, the four quantifiers, anchors
    local seed = 28
    local function rand(n) -- a small LCG: the same patterns on every machine
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n + 1
    end
    local gen
    local function atom(depth)
      local r = rand(depth > 2 and 4 or 6)
      if r == 1 then return ({ "a", "b", "c" })[rand(3)] end
      if r == 2 then return "." end
      if r == 3 then return ({ "[ab]", "[^a]", "[a-c]" })[rand(3)] end
      if r == 4 then return ({ "a", "b" })[rand(2)] end
      if r == 5 then return "(" .. gen(depth + 1) .. ")" end
      return "(" .. gen(depth + 1) .. "|" .. gen(depth + 1) .. ")"
    end
    function gen(depth)
      local parts = {}
      for i = 1, rand(3) do
        parts[i] = atom(depth) .. ({ "", "", "*", "+", "?", "{1,2}" })[rand(6)]
      end
      return table.concat(parts)
    end
    local names = {}
    for i = 1, 40 do
      local n = {}
      for j = 1, (i - 1) % 6 do n[j] = ({ "a", "b", "c" })[rand(3)] end
      names[i] = table.concat(n)
    end
    local file = dir .. "/generated"
    files.write(file, table.concat(names, "\n") .. "\n")
    local outcomes = {}
    for _ = 1, 100 do
      local re = gen(0)
      if rand(3) == 1 then re = "^" .. re end
      if rand(3) == 1 then re = re .. "$" end
      local hit = {}
      for n in files.capture(("grep -nE %s %s | cut -d: -f1"):format(q(re), q(file))):gmatch("%d+") do
        hit[tonumber(n)] = true
      end
      for i, name in ipairs(names) do
        local got = match.regex(re, name)
        assert.equal(hit[i] == true, got, ("regex %s on %q"):format(re, name))
        outcomes[got] = (outcomes[got] or 0) + 1
      end
    end
    -- both answers occur often: the patterns say something
    assert.is_true(outcomes[true] > 500 and outcomes[false] > 500, ("%d/%d"):format(outcomes[true], outcomes[false]))
  end)

  it("reads \\d and \\w as [0-9] and [A-Za-z0-9_], and (?:...) as (...), which grep -E has not", function()
    assert.is_true(match.regex("^(?:ab)*c?$", "abab"))
    assert.is_false(match.regex("^(?:ab)*c?$", "aba"))
    assert.is_true(match.regex("^\\w+$", "ab_1"))
    assert.is_false(match.regex("^\\w+$", "ab-1"))
    assert.is_true(match.regex("^[\\d-]+$", "12-3"))
    assert.is_false(match.regex("\\D", "123"))
    assert.is_true(match.regex("^\\S+\\s\\S+$", "a b"))
  end)

  it("takes a list of globs for the alternation a glob lacks", function()
    assert.is_true(match.any({ "tenant-*", "kube-*" }, "kube-system"))
    assert.is_false(match.any({ "tenant-*", "kube-*" }, "cozy-system"))
    assert.is_true(match.any("tenant-*", "tenant-a"))
    assert.is_false(match.any({}, "a"))
  end)

  it("refuses a bad pattern with its defect named, never reading it as a literal", function()
    local cases = {
      { "glob", "[ab", "a '[' is not closed by ']'" },
      { "glob", "a\\", "it ends with a lone '\\'" },
      { "glob", "[z-a]", "the range z-a is reversed" },
      { "regex", "(a", "a '(' is not closed by ')'" },
      { "regex", "a)", "an unmatched ')' at byte 2" },
      { "regex", "*a", "'*' at byte 1 repeats nothing" },
      { "regex", "(?=a)", "'(?' is supported only as '(?:'" },
      { "regex", "(a)\\1", "'\\1' is not supported" },
      { "regex", "a{3,1}", "{3,1} is reversed" },
      { "regex", "a{2000}", "a count above 1000" },
      { "regex", "^[[:alpha:]]", "POSIX classes ([:alpha:]) are not supported: use \\w, \\d or a range" },
      { "regex", "a{x}", "a '{' at byte 2 is not {m}, {m,} or {m,n}" },
      { "regex", ("(a|b){1000}"):rep(3), "it is too large (its counted repetitions)" },
    }
    for _, c in ipairs(cases) do
      local kind, pattern, why = c[1], c[2], c[3]
      local fn = kind == "glob" and match.glob or match.regex
      assert.has_error(function() fn(pattern, "a") end,
        ("cozy.match: invalid %s %q: %s"):format(kind, pattern, why))
      assert.has_error(function() match.check(pattern, kind) end,
        ("cozy.match: invalid %s %q: %s"):format(kind, pattern, why))
    end
    assert.has_error(function() match.glob(nil, "a") end, "cozy.match: a glob must be a string, not a nil")
    assert.has_error(function() match.regex("a", 3) end, "cozy.match: the name must be a string, not a number")
  end)

  it("matches in time linear in the name, whatever the pattern", function()
    -- exponential for a backtracking matcher: 2^60 ways to split the a's
    local long = ("a"):rep(60) .. "c"
    local steps = 0
    local hook = function() steps = steps + 1 end
    debug.sethook(hook, "", 1000)
    local found = match.regex("^(a|aa)*b$", long)
    debug.sethook()
    assert.is_false(found)
    -- a few thousand VM instructions per byte, not 2^60: counted, not timed
    assert.is_true(steps < 1000, ("%d thousand instructions"):format(steps))
    steps = 0
    debug.sethook(hook, "", 1000)
    found = match.glob(("*a"):rep(20) .. "b", ("a"):rep(200))
    debug.sethook()
    assert.is_false(found)
    assert.is_true(steps < 1000, ("%d thousand instructions"):format(steps))
  end)

  it("is what a migration's require gives in the sandbox", function()
    local env = sandbox.env()
    local m = env.require("cozy.match")
    assert.is_true(m.glob("tenant-*", "tenant-a"))
    assert.is_true(m.regex("^tenant-(a|b)$", "tenant-b"))
    m.glob = nil -- its own copy
    assert.is_function(match.glob)
  end)
end)
