-- cozy.match: matching names, for migrations (docs/engine-api.md, "Matching
-- names"). Lua patterns have no alternation, and a `.` meant literally in a
-- shell regex matched any character and labelled another cluster's PVC
-- (issue 28), so names are matched by:
--
--   * a glob, the shell's: `*`, `?`, `[...]` (`[!...]` or `[^...]`), `\`
--     quoting the next character; whole-name, as `case` and kubectl do;
--   * a list of globs, any of which may match: the alternation a glob lacks
--     (`{ "tenant-*", "kube-*" }`);
--   * a regular expression, POSIX ERE's everyday subset (grep -E), for what a
--     glob cannot say: `.`, `[...]`, `\d \w \s` (and `\D \W \S`), `*`, `+`,
--     `?`, `{m}`, `{m,}`, `{m,n}`, `(...)`, `(?:...)`, `|`, `^`, `$`; it
--     searches, as grep -E does (anchor with `^...$`). No back-references,
--     no lookaround: an unknown construct is an error, never a literal.
--
-- Both run in time linear in the name for a given pattern (a glob by the
-- one-star backtrack, a regex as a Thompson NFA, Pike's simulation), so no
-- pattern can make a match take exponential time, and both are pure Lua
-- under the step's watch. Patterns are compiled once and kept (bounded).
local validate = require "cozy.validate"

---@class cozy.match
local match = {}

local MAX_PROGRAM = 10000 -- instructions a regex may compile to ({m,n} expands)

-- A pattern's defect, raised from deep in its compiler and caught by
-- `compiled`, which raises it again as the caller's error.
local Bad = {}
local function bad(kind, pattern, why)
  error(setmetatable({ text = ("cozy.match: invalid %s %q: %s"):format(kind, pattern, why) },
    Bad), 0)
end

-- A set of bytes as a 256-entry table: set[b] is true for a member.
local function set_of(ranges, negate)
  local set = {}
  for b = 0, 255 do set[b] = negate end
  for _, r in ipairs(ranges) do
    for b = r[1], r[2] do set[b] = not negate end
  end
  return set
end

local ANY = set_of({}, true)

-- The byte classes of `\d \w \s` as ranges.
local CLASS = {
  d = { { 48, 57 } },
  w = { { 48, 57 }, { 65, 90 }, { 97, 122 }, { 95, 95 } },
  s = { { 9, 13 }, { 32, 32 } },
}

---------------------------------------------------------------------------
-- Globs

-- The tokens of a glob: a set of bytes for one character, or "*".
local function compile_glob(pattern)
  local toks, i, n = {}, 1, #pattern
  while i <= n do
    local c = pattern:sub(i, i)
    if c == "*" then
      if toks[#toks] ~= "*" then toks[#toks + 1] = "*" end
      i = i + 1
    elseif c == "?" then
      toks[#toks + 1], i = ANY, i + 1
    elseif c == "[" then
      local j, negate, ranges = i + 1, false, {}
      local first = pattern:sub(j, j)
      if first == "!" or first == "^" then negate, j = true, j + 1 end
      local start = j
      while true do
        if j > n then bad("glob", pattern, "a '[' is not closed by ']'") end
        local d = pattern:sub(j, j)
        if d == "]" and j > start then break end
        if d == "\\" then
          j = j + 1
          if j > n then bad("glob", pattern, "it ends with a lone '\\'") end
          d = pattern:sub(j, j)
        end
        local lo = d:byte()
        if pattern:sub(j + 1, j + 1) == "-" and j + 2 <= n and pattern:sub(j + 2, j + 2) ~= "]" then
          local hi = pattern:byte(j + 2)
          if hi < lo then
            bad("glob", pattern, ("the range %s-%s is reversed"):format(d, string.char(hi)))
          end
          ranges[#ranges + 1], j = { lo, hi }, j + 3
        else
          ranges[#ranges + 1], j = { lo, lo }, j + 1
        end
      end
      toks[#toks + 1], i = set_of(ranges, negate), j + 1
    else
      if c == "\\" then
        i = i + 1
        if i > n then bad("glob", pattern, "it ends with a lone '\\'") end
        c = pattern:sub(i, i)
      end
      toks[#toks + 1], i = set_of({ { c:byte(), c:byte() } }, false), i + 1
    end
  end
  return toks
end

-- Whole-name match; on a mismatch after a star, the star takes one more
-- character and the rest is tried again: O(#name * #glob).
local function glob_match(toks, s)
  local ti, si, n = 1, 1, #s
  local star_ti, star_si
  while si <= n do
    local t = toks[ti]
    if t == "*" then
      star_ti, star_si, ti = ti, si, ti + 1
    elseif t ~= nil and t[s:byte(si)] then
      ti, si = ti + 1, si + 1
    elseif star_ti then
      star_si = star_si + 1
      ti, si = star_ti + 1, star_si
    else
      return false
    end
  end
  while toks[ti] == "*" do ti = ti + 1 end
  return toks[ti] == nil
end

---------------------------------------------------------------------------
-- Regular expressions: parsed to a tree, compiled to a program of
-- { op = "byte", set = } / "split" (x, y) / "jmp" (x) / "bol" / "eol" / "match".

-- One function of 130-odd lines, on purpose: its rules (alternation,
-- concatenation, repetition, atoms, bracket sets) are closures over one
-- cursor (pos) into `re`, as a recursive-descent parser's rules are; apart,
-- each would take and return the cursor and re-check the end of input.
local function parse_regex(re)
  local pos, n = 1, #re
  local function peek() return re:sub(pos, pos) end
  local function fail(why) bad("regex", re, why) end

  local parse_alt

  local function escape_ranges(c)
    local class = CLASS[c:lower()]
    if class then return class, c ~= c:lower(), true end
    if c:match("%w") then fail(("'\\%s' is not supported"):format(c)) end
    return { { c:byte(), c:byte() } }, false
  end

  local function parse_class()
    -- at the byte after '['
    local negate, ranges = false, {}
    if peek() == "^" then negate, pos = true, pos + 1 end
    local start = pos
    while true do
      if pos > n then fail("a '[' is not closed by ']'") end
      local c = peek()
      if c == "]" and pos > start then pos = pos + 1; break end
      if c == "[" and re:find("^[:=.]", pos + 1) then
        fail("POSIX classes ([:alpha:]) are not supported: use \\w, \\d or a range")
      end
      local lo
      if c == "\\" then
        pos = pos + 1
        if pos > n then fail("it ends with a lone '\\'") end
        local r, neg, is_class = escape_ranges(peek())
        pos = pos + 1
        if is_class then
          -- a class escape inside [...]: its members join the set
          local s = set_of(r, neg)
          for b = 0, 255 do if s[b] then ranges[#ranges + 1] = { b, b } end end
          goto continue
        end
        lo = r[1][1]
      else
        lo, pos = c:byte(), pos + 1
      end
      if peek() == "-" and pos + 1 <= n and re:sub(pos + 1, pos + 1) ~= "]" then
        local hi = re:byte(pos + 1)
        if hi == 92 then fail("a range cannot end in an escape") end
        if hi < lo then
          fail(("the range %s-%s is reversed"):format(string.char(lo), string.char(hi)))
        end
        ranges[#ranges + 1], pos = { lo, hi }, pos + 2
      else
        ranges[#ranges + 1] = { lo, lo }
      end
      ::continue::
    end
    return { t = "byte", set = set_of(ranges, negate) }
  end

  local function parse_atom()
    local c = peek()
    if c == "(" then
      pos = pos + 1
      if re:sub(pos, pos + 1) == "?:" then
        pos = pos + 2
      elseif peek() == "?" then
        fail("'(?' is supported only as '(?:'")
      end
      local node = parse_alt()
      if peek() ~= ")" then fail("a '(' is not closed by ')'") end
      pos = pos + 1
      return node
    elseif c == "[" then
      pos = pos + 1
      return parse_class()
    elseif c == "." then
      pos = pos + 1
      return { t = "byte", set = ANY }
    elseif c == "^" then
      pos = pos + 1
      return { t = "bol" }
    elseif c == "$" then
      pos = pos + 1
      return { t = "eol" }
    elseif c == "\\" then
      pos = pos + 1
      if pos > n then fail("it ends with a lone '\\'") end
      local r, neg = escape_ranges(peek())
      pos = pos + 1
      return { t = "byte", set = set_of(r, neg) }
    elseif c == "*" or c == "+" or c == "?" or c == "{" then
      fail(("'%s' at byte %d repeats nothing"):format(c, pos))
    elseif c == ")" then
      fail(("an unmatched ')' at byte %d"):format(pos))
    end
    pos = pos + 1
    return { t = "byte", set = set_of({ { c:byte(), c:byte() } }, false) }
  end

  local function parse_repeat()
    local node = parse_atom()
    while true do
      local c = peek()
      if c == "*" then
        node, pos = { t = "rep", node = node, min = 0 }, pos + 1
      elseif c == "+" then
        node, pos = { t = "rep", node = node, min = 1 }, pos + 1
      elseif c == "?" then
        node, pos = { t = "rep", node = node, min = 0, max = 1 }, pos + 1
      elseif c == "{" then
        local m, comma, x, stop = re:match("^{(%d+)(,?)(%d*)}()", pos)
        if not m then fail(("a '{' at byte %d is not {m}, {m,} or {m,n}"):format(pos)) end
        m = tonumber(m)
        local max = comma == "" and m or (x ~= "" and tonumber(x) or nil)
        if max and max < m then fail(("{%d,%d} is reversed"):format(m, max)) end
        if m > 1000 or (max or 0) > 1000 then fail("a count above 1000") end
        node, pos = { t = "rep", node = node, min = m, max = max }, stop
      else
        return node
      end
    end
  end

  local function parse_concat()
    local list = {}
    while pos <= n and peek() ~= "|" and peek() ~= ")" do list[#list + 1] = parse_repeat() end
    return { t = "cat", list = list }
  end

  function parse_alt()
    local list = { parse_concat() }
    while peek() == "|" do
      pos = pos + 1
      list[#list + 1] = parse_concat()
    end
    if #list == 1 then return list[1] end
    return { t = "alt", list = list }
  end

  local tree = parse_alt()
  if pos <= n then fail(("an unmatched ')' at byte %d"):format(pos)) end
  return tree
end

local function compile_regex(re)
  local tree = parse_regex(re)
  local prog = {}
  local function emit(ins)
    if #prog >= MAX_PROGRAM then bad("regex", re, "it is too large (its counted repetitions)") end
    prog[#prog + 1] = ins
    return ins
  end
  local gen
  local function rep(node)
    local min, max = node.min, node.max
    for _ = 1, min do gen(node.node) end
    if max == nil then
      -- L: split body, out; body; jmp L
      local l = #prog + 1
      local split = emit { op = "split", x = l + 1 }
      gen(node.node)
      emit { op = "jmp", x = l }
      split.y = #prog + 1
    else
      -- (body (body ...)?)? nested, max - min deep
      local splits = {}
      for _ = min + 1, max do
        splits[#splits + 1] = emit { op = "split", x = #prog + 2 }
        gen(node.node)
      end
      for _, s in ipairs(splits) do s.y = #prog + 1 end
    end
  end
  function gen(node)
    local t = node.t
    if t == "byte" then
      emit { op = "byte", set = node.set }
    elseif t == "bol" or t == "eol" then
      emit { op = t }
    elseif t == "cat" then
      for _, sub in ipairs(node.list) do gen(sub) end
    elseif t == "alt" then
      local jumps = {}
      for i, sub in ipairs(node.list) do
        if i < #node.list then
          local split = emit { op = "split", x = #prog + 2 }
          gen(sub)
          jumps[#jumps + 1] = emit { op = "jmp" }
          split.y = #prog + 1
        else
          gen(sub)
        end
      end
      for _, j in ipairs(jumps) do j.x = #prog + 1 end
    else
      rep(node)
    end
  end
  gen(tree)
  emit { op = "match" }
  return prog
end

-- Pike's simulation: every thread advances one byte at a time, at most one
-- thread per instruction, a new one started at each byte (a search).
local function regex_search(prog, s)
  local n = #s
  local mark, stamp = {}, 0
  local stack = {}
  local function add(list, pc, at)
    local top = 1
    stack[1] = pc
    while top > 0 do
      local p = stack[top]
      top = top - 1
      if mark[p] ~= stamp then
        mark[p] = stamp
        local ins = prog[p]
        local op = ins.op
        if op == "jmp" then
          top = top + 1; stack[top] = ins.x
        elseif op == "split" then
          top = top + 1; stack[top] = ins.y
          top = top + 1; stack[top] = ins.x
        elseif op == "bol" then
          if at == 1 then top = top + 1; stack[top] = p + 1 end
        elseif op == "eol" then
          if at == n + 1 then top = top + 1; stack[top] = p + 1 end
        else
          list[#list + 1] = p
        end
      end
    end
  end
  stamp = stamp + 1
  local clist = {}
  add(clist, 1, 1)
  for at = 1, n + 1 do
    for _, p in ipairs(clist) do
      if prog[p].op == "match" then return true end
    end
    if at > n then break end
    local b = s:byte(at)
    stamp = stamp + 1
    local nlist = {}
    for _, p in ipairs(clist) do
      local ins = prog[p]
      if ins.op == "byte" and ins.set[b] then add(nlist, p + 1, at + 1) end
    end
    add(nlist, 1, at + 1)
    clist = nlist
  end
  return false
end

---------------------------------------------------------------------------

-- Compiled patterns by kind and text, bounded: a migration matches a fleet
-- against a few patterns, but may build a pattern per object.
local cache, cached = { glob = {}, regex = {} }, 0
local function compiled(kind, pattern, compile)
  validate.arg(3, "cozy.match", "a " .. kind, pattern, "string", { show = "not" })
  local c = cache[kind][pattern]
  if c == nil then
    local ok, res = pcall(compile, pattern)
    if not ok then
      if getmetatable(res) == Bad then error(res.text, 3) end
      error(res, 0) -- not the pattern's: a stop of the step's watch, say
    end
    c = res
    if cached >= 256 then cache, cached = { glob = {}, regex = {} }, 0 end
    cache[kind][pattern], cached = c, cached + 1
  end
  return c
end

local function subject(s)
  validate.arg(3, "cozy.match", "the name", s, "string", { show = "not" })
  return s
end

--- Does the whole of name match the glob?
---@param pattern string a glob, as the shell's `case` reads it
---@param name string
---@return boolean
function match.glob(pattern, name)
  local toks = compiled("glob", pattern, compile_glob)
  return glob_match(toks, subject(name))
end

--- Does name match any of the globs (an array; a single string is one glob)?
---@param patterns string|string[] globs
---@param name string
---@return boolean
function match.any(patterns, name)
  if type(patterns) == "string" then patterns = { patterns } end
  validate.arg(2, "cozy.match: any(globs, name)", "globs", patterns, "table",
    { says = "an array of strings", show = "not" })
  subject(name)
  for _, p in ipairs(patterns) do
    if glob_match(compiled("glob", p, compile_glob), name) then return true end
  end
  return false
end

--- Does the regular expression match somewhere in name (grep -E)?
---@param re string an extended regular expression (a linear-time subset of grep -E's)
---@param name string
---@return boolean
function match.regex(re, name)
  local prog = compiled("regex", re, compile_regex)
  return regex_search(prog, subject(name))
end

--- Raises unless pattern is a valid glob (or regex, kind = "regex"): to
--- check a migration's patterns once, up front, before anything is read.
---@param pattern string
---@param kind? "glob"|"regex" default "glob"
---@return string pattern
function match.check(pattern, kind)
  if kind == "regex" then
    compiled("regex", pattern, compile_regex)
  else
    compiled("glob", pattern, compile_glob)
  end
  return pattern
end

return match
