-- cozy.yaml: a value (a decoded JSON document: tables with cozy.json's
-- markers, strings, numbers, booleans, json.null) as YAML, the way kubectl
-- prints it (-o yaml, kubectl diff): sigs.k8s.io/yaml over go-yaml v2. Its
-- choices are go-yaml's, so the same object reads the same in both:
--
--   - block style, two-space indent; a sequence under a key is not indented
--     ("key:\n- a"), an empty one is "[]", an empty mapping "{}";
--   - keys sorted as go-yaml sorts them (runs of digits by value, a
--     letter after any other character: "a-b" < "a9" < "a10" < "aB" < "ab");
--   - a string plain when it reads back as that string; double-quoted when
--     plain would read as something else (true, no, on, ~, null, "", 1.5,
--     0x1F, 1_000, 2024-01-01, 1:20); single-quoted when plain would be
--     misread as YAML syntax (a leading "- ", "#", "*", "&", "!", "%", "@",
--     quotes, ": " or " #" inside, leading or trailing spaces); a
--     multi-line string as a literal block ("|", "|-", "|+"), double-quoted
--     when a block cannot hold it (a space before a line break, a trailing
--     space, a control character); a control character, a tab, a
--     character outside the Basic Multilingual Plane escaped in double
--     quotes, as go-yaml escapes them;
--   - a line longer than 80 columns folded at a space, as go-yaml folds
--     plain and quoted strings (a literal block is never folded);
--   - integers in decimal (an integral float too), other floats as Go's
--     strconv 'g' shortest form.
--
-- Differences from go-yaml, for inputs a cluster's object does not hold:
-- bytes that are not UTF-8 are shown as U+FFFD (go-yaml would switch to
-- !!binary), a string with a line break other than "\n" (CR, NEL, U+2028,
-- U+2029) is double-quoted (go-yaml may single-quote it).
local json = require "cozy.json"
local text = require "cozy.text"
local emitter = require "cozy.yaml_emitter"

local yaml = {}

local WIDTH, INDENT = 80, 2

-- Key order -----------------------------------------------------------------

local function codepoints(s)
  local out = {}
  for _, c in utf8.codes(s) do out[#out + 1] = c end
  return out
end

local function is_digit(c) return c >= 48 and c <= 57 end
-- unicode.IsLetter, close enough: ASCII letters, and any non-ASCII code point
local function is_letter(c) return (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c >= 0x80 end

-- go-yaml's keyList.Less (sorter.go) on two strings.
local function full_key_less(a, b)
  local ar, br = codepoints(a), codepoints(b)
  for i = 1, math.min(#ar, #br) do
    local x, y = ar[i], br[i]
    if x ~= y then
      local al, bl = is_letter(x), is_letter(y)
      if al and bl then return x < y end
      if al or bl then return bl end
      local an, bn = 0, 0
      if x == 48 or y == 48 then
        for j = i - 1, 1, -1 do
          if not is_digit(ar[j]) then break end
          if ar[j] ~= 48 then
            an, bn = 1, 1
            break
          end
        end
      end
      local ai, bi = i, i
      while ai <= #ar and is_digit(ar[ai]) do
        an = an * 10 + ar[ai] - 48
        ai = ai + 1
      end
      while bi <= #br and is_digit(br[bi]) do
        bn = bn * 10 + br[bi] - 48
        bi = bi + 1
      end
      if an ~= bn then return an < bn end
      if ai ~= bi then return ai < bi end
      return x < y
    end
  end
  return #ar < #br
end

-- The same order, without a table per comparison for the keys an object
-- has (ASCII): where the first differing bytes are no digits, their classes
-- decide (letter above non-letter, else the byte order), as full_key_less
-- decides there; a digit there (a run of them compared by value) or a
-- non-ASCII byte anywhere goes the full way.
local function key_less(a, b)
  if a == b then return false end
  local i = 1
  local x, y = a:byte(1), b:byte(1)
  while x == y and x ~= nil do
    i = i + 1
    x, y = a:byte(i), b:byte(i)
  end
  if x == nil or y == nil then
    -- one is a prefix of the other: the shorter first, in code points as in bytes
    if a:find("[\128-\255]") or b:find("[\128-\255]") then return full_key_less(a, b) end
    return x == nil
  end
  if (x >= 48 and x <= 57) or (y >= 48 and y <= 57) or x >= 0x80 or y >= 0x80
      or a:find("[\128-\255]") or b:find("[\128-\255]") then
    return full_key_less(a, b)
  end
  local al, bl = is_letter(x), is_letter(y)
  if al and bl then return x < y end
  if al or bl then return bl end
  return x < y
end
yaml.key_less = key_less

-- Scalars -------------------------------------------------------------------

local RESERVED = {}
for _, w in ipairs { "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n",
  "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null",
  "NULL", ".nan", ".NaN", ".NAN",
  ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", "<<" } do
  RESERVED[w] = true
end

-- strconv.ParseInt/ParseUint(s, 0, 64) accepts it (underscores already gone)
local function go_integer(s)
  local body = s:gsub("^[+-]", "")
  if body:match("^0[xX]%x+$") or body:match("^0[bB][01]+$") or body:match("^0[oO][0-7]+$")
      or body:match("^0[0-7]*$") or body:match("^[1-9]%d*$") then
    -- out of int64/uint64 range would fail in Go: still not a string when read back by a YAML 1.1
    -- reader
    return true
  end
  return false
end

local function is_float(s)
  return s:match("^[-+]?%.%d+$") or s:match("^[-+]?%.%d+[eE][-+]?%d+$")
    or s:match("^[-+]?%d+%.?%d*$")
    or s:match("^[-+]?%d+%.?%d*[eE][-+]?%d+$")
end

-- one of go-yaml's timestamp forms: YYYY-M-D, then optional time
local function is_timestamp(s)
  local y, rest = s:match("^(%d%d%d%d)%-(.*)$")
  if not y then return false end
  local m, d, tail = rest:match("^(%d%d?)%-(%d%d?)(.*)$")
  if not m then return false end
  m, d = tonumber(m), tonumber(d)
  if m < 1 or m > 12 or d < 1 or d > 31 then return false end
  if tail == "" then return true end
  local sep, time = tail:match("^([Tt ])(.*)$")
  if not sep then return false end
  local hh, mm, ss, zone = time:match("^(%d%d?):(%d%d?):(%d%d?)(.*)$")
  if not hh then return false end
  if tonumber(hh) > 23 or tonumber(mm) > 59 or tonumber(ss) > 59 then return false end
  zone = zone:gsub("^%.%d+", "")
  if sep == " " then return zone == "" end
  return zone == "Z" or zone:match("^[+-]%d%d:%d%d$") ~= nil
end

-- go-yaml's resolve: whether plain s reads back as the string s.
local function plain_is_string(s)
  if RESERVED[s] then return false end
  local c = s:sub(1, 1)
  if c:match("[%d+-]") then
    if is_timestamp(s) then return false end
    local plain = s:gsub("_", "")
    if go_integer(plain) or is_float(plain) then return false end
    if plain:match("^%-?0b[01]+$") then return false end
    -- base 60 (1:20), quoted for old readers
    if s:find(":", 1, true) and s:match("^[-+]?%d[%d_]*:") then
      local ok = true
      local body = s:gsub("^[-+]?%d[%d_]*", "")
      body = body:gsub("%.[%d_]*$", "")
      for part in body:gmatch(":([^:]*)") do
        if not part:match("^[0-5]?%d$") then ok = false end
      end
      if ok and body ~= "" then return false end
    end
  elseif c == "." then
    if is_float(s) then return false end
  end
  return true
end

-- The scalar's analysis (yaml_emitter_analyze_scalar), over bytes as
-- go-yaml's is. Returns block_plain, single, block (allowed) and multiline.
local function is_printable(s, i)
  local b, b1, b2 = s:byte(i), s:byte(i + 1) or 0, s:byte(i + 2) or 0
  return b == 0x0A or (b >= 0x20 and b <= 0x7E) or (b == 0xC2 and b1 >= 0xA0)
    or (b > 0xC2 and b < 0xED)
    or (b == 0xED and b1 < 0xA0) or b == 0xEE
    or (b == 0xEF and not (b1 == 0xBB and b2 == 0xBF)
      and not (b1 == 0xBF and (b2 == 0xBE or b2 == 0xBF)))
end

local function width(b)
  if b < 0x80 then return 1 elseif b >= 0xF0 then return 4 end
  if b >= 0xE0 then return 3 elseif b >= 0xC0 then return 2 end
  return 1
end

local function is_break_at(s, i)
  local b = s:byte(i)
  if b == 0x0A or b == 0x0D then return true end
  if b == 0xC2 and s:byte(i + 1) == 0x85 then return true end
  if b == 0xE2 and s:byte(i + 1) == 0x80 and (s:byte(i + 2) == 0xA8 or s:byte(i + 2) == 0xA9) then
    return true
  end
  return false
end

local function is_blank_at(s, i)
  local b = s:byte(i)
  return b == 0x20 or b == 0x09
end

-- analyze for a string of printable ASCII and line feeds (no tab, no other
-- control character, no byte from 0x7F): every character one byte, printable,
-- the only break "\n"; its flags found by patterns, as the loop below sets them.
local function analyze_ascii(s)
  local first = s:sub(1, 1)
  local block_ind = s:find("^%-%-%-") or s:find("^%.%.%.")
    or first:find("^[#,%[%]{}&%*!|>'\"%%@`]$")
    or s:find("^[%?:%-] ") or s == "?" or s == ":" or s == "-"
    -- ":" before a space or at the end, "#" after a space or a break (not the first character)
    or s:find(".: ") or (#s > 1 and s:sub(-1) == ":") or s:find("[ \n]#")
  local line_breaks = s:find("\n", 1, true) ~= nil
  local leading = first == " " or first == "\n"
  local last = s:sub(-1)
  local trailing_space = last == " "
  local trailing = trailing_space or last == "\n"
  local break_space, space_break = s:find("\n ", 1, true) ~= nil, s:find(" \n", 1, true) ~= nil
  local a = { multiline = line_breaks, block_plain = true, single = true, block = true }
  if leading or trailing then a.block_plain = false end
  if trailing_space then a.block = false end
  if break_space then a.block_plain, a.single = false, false end
  if space_break then a.block_plain, a.single, a.block = false, false, false end
  if line_breaks then a.block_plain = false end
  if block_ind then a.block_plain = false end
  return a
end

local function analyze(s)
  if not s:find("[^\n\32-\126]") then return analyze_ascii(s) end
  local n = #s
  local block_ind, line_breaks, special = false, false, false
  local leading_space, leading_break, trailing_space, trailing_break = false, false, false, false
  local break_space, space_break = false, false
  local prev_space, prev_break = false, false
  if s:match("^%-%-%-") or s:match("^%.%.%.") then block_ind = true end
  local preceded_ws = true
  local i = 1
  while i <= n do
    local w = width(s:byte(i))
    local followed_ws = i + w > n or is_blank_at(s, i + w)
    local c = s:sub(i, i)
    if i == 1 then
      if c:match("^[#,%[%]{}&%*!|>'\"%%@`]$") then
        block_ind = true
      elseif (c == "?" or c == ":") and followed_ws then
        block_ind = true
      elseif c == "-" and followed_ws then
        block_ind = true
      end
    elseif (c == ":" and followed_ws) or (c == "#" and preceded_ws) then
      -- (go-yaml's flow indicators matter only in flow style, never written here)
      block_ind = true
    end
    if not is_printable(s, i) then special = true end
    if c == " " then
      if i == 1 then leading_space = true end
      if i + w > n then trailing_space = true end
      if prev_break then break_space = true end
      prev_space, prev_break = true, false
    elseif is_break_at(s, i) then
      line_breaks = true
      if i == 1 then leading_break = true end
      if i + w > n then trailing_break = true end
      if prev_space then space_break = true end
      prev_space, prev_break = false, true
    else
      prev_space, prev_break = false, false
    end
    preceded_ws = is_blank_at(s, i) or is_break_at(s, i) or s:byte(i) == 0
    i = i + w
  end
  local a = { multiline = line_breaks, block_plain = true, single = true, block = true }
  if leading_space or leading_break or trailing_space or trailing_break then
    a.block_plain = false
  end
  if trailing_space then a.block = false end
  if break_space then a.block_plain, a.single = false, false end
  if space_break or special then a.block_plain, a.single, a.block = false, false, false end
  if line_breaks then a.block_plain = false end
  if block_ind then a.block_plain = false end
  return a
end

-- The style go-yaml gives string s: "plain", "single", "double" or "literal".
local function style_of(s, key)
  if s:find("[\r]") or s:find("\194\133") or s:find("\226\128[\168\169]") then return "double" end
  local style
  if s:find("\n", 1, true) then
    style = "literal"
  elseif plain_is_string(s) then
    style = "plain"
  else
    style = "double"
  end
  local a = analyze(s)
  if key and a.multiline then style = "double" end
  if style == "plain" and (not a.block_plain or (s == "" and key)) then style = "single" end
  if style == "single" and not a.single then style = "double" end
  if style == "literal" and (not a.block or key) then style = "double" end
  return style
end

local ESCAPES = { [0x00] = "0", [0x07] = "a", [0x08] = "b", [0x09] = "t", [0x0A] = "n",
  [0x0B] = "v", [0x0C] = "f", [0x0D] = "r", [0x1B] = "e", [0x22] = '"', [0x5C] = "\\", [0x85] = "N",
  [0xA0] = "_", [0x2028] = "L", [0x2029] = "P" }

-- A writer of one line at a time, folding as go-yaml folds: `col` is the
-- column the scalar starts at, `indent` where a folded line goes on.
local function folder(out, first, col, indent, fold)
  local line, column = { first }, col
  local w = {}
  function w.put(chunk)
    line[#line + 1] = chunk
    column = column + utf8.len(chunk)
  end
  function w.column() return column end
  function w.fold()
    out[#out + 1] = table.concat(line)
    line, column = { (" "):rep(indent) }, indent
  end
  function w.can_fold() return fold and column > WIDTH end
  function w.finish() out[#out + 1] = table.concat(line) end
  return w
end

local function chars(s)
  local list = {}
  local i = 1
  while i <= #s do
    local w = width(s:byte(i))
    list[#list + 1] = s:sub(i, i + w - 1)
    i = i + w
  end
  return list
end

-- Plain and single-quoted strings fold only at a space: the runs between
-- spaces are written whole (a character at a time would write the same).
local function write_plain(w, s)
  local spaces = false
  local i, n = 1, #s
  while i <= n do
    if s:byte(i) == 32 then
      if not spaces and w.can_fold() and s:byte(i + 1) ~= 32 then w.fold() else w.put(" ") end
      spaces = true
      i = i + 1
    else
      local j = (s:find(" ", i, true) or n + 1) - 1
      w.put(s:sub(i, j))
      spaces = false
      i = j + 1
    end
  end
end

local function write_single(w, s)
  local spaces = false
  local i, n = 1, #s
  w.put("'")
  while i <= n do
    if s:byte(i) == 32 then
      if not spaces and w.can_fold() and i > 1 and i < n
        and s:byte(i + 1) ~= 32 then w.fold() else w.put(" ") end
      spaces = true
      i = i + 1
    else
      local j = (s:find(" ", i, true) or n + 1) - 1
      w.put((s:sub(i, j):gsub("'", "''")))
      spaces = false
      i = j + 1
    end
  end
  w.put("'")
end

local function write_double(w, s)
  if not s:find("[^!#-Z%[%]^-~]") then
    -- printable ASCII without a space, '"' or '\\' (a time, a number): nothing to escape, nowhere
    -- to fold
    w.put('"' .. s .. '"')
    return
  end
  local cs = chars(s)
  local bom = s:sub(1, 3) == "\239\187\191"
  local spaces = false
  w.put('"')
  local pos = 1
  for i, c in ipairs(cs) do
    local at = pos
    pos = pos + #c
    if not is_printable(s, at) or bom or is_break_at(s, at) or c == '"' or c == "\\" then
      local v = utf8.codepoint(c)
      local e = ESCAPES[v]
      if e then
        w.put("\\" .. e)
      elseif v <= 0xFF then
        w.put(("\\x%02X"):format(v))
      elseif v <= 0xFFFF then
        w.put(("\\u%04X"):format(v))
      else
        w.put(("\\U%08X"):format(v))
      end
      spaces = false
    elseif c == " " then
      if not spaces and w.can_fold() and i > 1 and i < #cs then
        w.fold()
        if cs[i + 1] == " " then w.put("\\") end
      else
        w.put(c)
      end
      spaces = true
    else
      w.put(c)
      spaces = false
    end
  end
  w.put('"')
end

-- Go's strconv.FormatFloat(f, 'g', -1, 64), as go-yaml writes a float.
local function go_float(f)
  if f ~= f then return ".nan" end
  if f == math.huge then return ".inf" end
  if f == -math.huge then return "-.inf" end
  if f == 0 then return (1 / f < 0) and "-0" or "0" end
  local e
  for p = 0, 16 do
    e = ("%." .. p .. "e"):format(f)
    if tonumber(e) == f then break end
  end
  local sign, mant, exp = e:match("^(%-?)([%d%.]+)e([-+]%d+)$")
  exp = tonumber(exp)
  local digits = mant:gsub("%.", "")
  -- Go's shortest 'g': %e when the exponent is below -4 or at least 6
  local eprec = 6
  if exp < -4 or exp >= eprec then
    local m = digits:sub(1, 1) .. (#digits > 1 and ("." .. digits:sub(2)) or "")
    return ("%s%se%s%02d"):format(sign, m, exp < 0 and "-" or "+", math.abs(exp))
  end
  if exp >= 0 then
    if #digits <= exp + 1 then return sign .. digits .. ("0"):rep(exp + 1 - #digits) end
    return sign .. digits:sub(1, exp + 1) .. "." .. digits:sub(exp + 2)
  end
  return sign .. "0." .. ("0"):rep(-exp - 1) .. digits
end
yaml.go_float = go_float

-- Writes scalar v after `first` (the line so far: indentation, "key: " or
-- "- "), folded lines at `indent`; a literal block's lines at `indent`.
local function scalar(out, first, v, indent, key)
  if v == json.null or v == nil then
    out[#out + 1] = first .. "null"
    return
  end
  local t = type(v)
  if t == "boolean" then
    out[#out + 1] = first .. tostring(v)
    return
  elseif t == "number" then
    -- kubectl's path is JSON then YAML: a float JSON writes without a
    -- fraction or exponent (an integral one below 1e21) reads back as an integer
    local int = math.type(v) == "integer" and v
      or (v == math.floor(v) and math.abs(v) < 2 ^ 63 and math.tointeger(v))
    out[#out + 1] = first .. (int and ("%d"):format(int) or go_float(v))
    return
  end
  local s = tostring(v)
  if not RESERVED[s] and s:find("^%a[%w%._/%-]*$") and #first + #s <= WIDTH then
    -- most strings of an object: a letter, then letters, digits, ".", "_",
    -- "/" or "-": plain (no indicator, no number, no time, no space to fold
    -- at), as style_of and write_plain would find them, at a fraction of the cost
    out[#out + 1] = first .. s
    return
  end
  s = text.utf8(s)
  local style = style_of(s, key)
  if style == "literal" then
    local hint = (s:sub(1, 1) == " " or s:sub(1, 1) == "\n") and tostring(INDENT) or ""
    local chomp
    if s:sub(-1) ~= "\n" then
      chomp = "-"
    elseif #s == 1 or s:sub(-2) == "\n\n" then
      chomp = "+"
    else
      chomp = ""
    end
    out[#out + 1] = first .. "|" .. hint .. chomp
    local body = chomp == "-" and s or s:sub(1, -2)
    for line in (body .. "\n"):gmatch("(.-)\n") do
      out[#out + 1] = line == "" and "" or ((" "):rep(indent) .. line)
    end
    return
  end
  local w = folder(out, first, utf8.len(first), indent, not key)
  if style == "plain" then
    write_plain(w, s)
  elseif style == "single" then
    write_single(w, s)
  else
    write_double(w, s)
  end
  w.finish()
end

-- A key as go-yaml writes it: plain, or quoted (never folded, never a block).
-- Remembered: an object's keys recur in every object of its kind (up to
-- KEYS_KEPT of them, then forgotten all at once).
local KEYS_KEPT = 4096
local key_texts, keys_kept = {}, 0
local function key_text(k)
  local written = key_texts[k]
  if written ~= nil then return written end
  local out = {}
  scalar(out, "", tostring(k), 0, true)
  written = out[1]
  if keys_kept >= KEYS_KEPT then key_texts, keys_kept = {}, 0 end
  key_texts[k], keys_kept = written, keys_kept + 1
  return written
end

-- Collections ---------------------------------------------------------------

local function kind_of(v)
  if type(v) ~= "table" or v == json.null then return "scalar" end
  local mt = getmetatable(v)
  if mt == json.array_mt then return "seq" end
  if mt == json.object_mt then return "map" end
  if next(v) == nil then return "map" end
  if v[1] ~= nil then return "seq" end
  return "map"
end

local emit

-- A key without digits and non-ASCII bytes, rewritten so that byte order
-- is key_less's order: a letter moved above every other byte (0x80 + its
-- byte), the rest kept; nil for any other key.
local letters_up = {}
for c = 65, 122 do
  if c <= 90 or c >= 97 then letters_up[string.char(c)] = string.char(c + 0x80) end
end
local function byte_order_key(k)
  if k:find("[%d\128-\255]") then return nil end
  return (k:gsub("%a", letters_up))
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  -- most objects' keys are letters and punctuation: sorted by their
  -- rewritten bytes in C, rather than by key_less in Lua
  local by, order = {}, {}
  for i = 1, #keys do
    local o = byte_order_key(keys[i])
    if o == nil then
      table.sort(keys, key_less)
      return keys
    end
    by[o], order[i] = keys[i], o
  end
  table.sort(order)
  for i = 1, #order do keys[i] = by[order[i]] end
  return keys
end

local function get(t, k)
  local v = t[k]
  if v == nil then v = t[tonumber(k)] end
  return v
end

-- The memo of the yaml.lines call in progress, or nil: table -> { out,
-- first, last (its lines in out), indent, lead, depth }.
local memo

-- Emits v (a mapping or a sequence) at `indent`; the first line's
-- indentation is replaced by `lead` when given ("- " of the item holding v).
function emit(out, v, indent, lead, depth)
  if depth > json.max_depth then
    error("cozy.yaml: a table nested deeper than " .. json.max_depth .. " levels", 0)
  end
  local m = memo
  if m ~= nil then
    -- the same table emitted before at this indentation and lead: the same
    -- lines (no deeper than then, so never past max_depth where it was not)
    local r = m[v]
    if r ~= nil and r.indent == indent and r.lead == lead and depth <= r.depth then
      local from, n = r.out, #out
      for i = r.first, r.last do
        n = n + 1
        out[n] = from[i]
      end
      return
    end
  end
  local first = #out + 1
  local pad = (" "):rep(indent)
  local first_pad = lead or pad
  local k = kind_of(v)
  if k == "map" then
    for i, key in ipairs(sorted_keys(v)) do
      local val = get(v, key)
      local p
      if key:find("\n", 1, true) or #key > 128 then
        -- not a simple key (go-yaml's check_simple_key): "? key" then ": value"
        scalar(out, (i == 1 and first_pad or pad) .. "? ", key, indent + INDENT)
        p = pad .. ":"
      else
        p = (i == 1 and first_pad or pad) .. key_text(key) .. ":"
      end
      local vk = kind_of(val)
      if vk == "scalar" then
        scalar(out, p .. " ", val, indent + INDENT)
      elseif next(val) == nil then
        out[#out + 1] = p .. (vk == "seq" and " []" or " {}")
      else
        out[#out + 1] = p
        -- a sequence under a key is not indented
        emit(out, val, vk == "seq" and indent or indent + INDENT, nil, depth + 1)
      end
    end
  else
    for i, item in ipairs(v) do
      local p = (i == 1 and first_pad or pad) .. "- "
      local ik = kind_of(item)
      if ik == "scalar" then
        scalar(out, p, item, indent + INDENT)
      elseif next(item) == nil then
        out[#out + 1] = p .. (ik == "seq" and "[]" or "{}")
      else
        emit(out, item, indent + INDENT, p, depth + 1)
      end
    end
  end
  if m ~= nil then
    m[v] = { out = out, first = first, last = #out, indent = indent, lead = lead, depth = depth }
  end
end

-- out, with any entry holding a line break split as encode's text would be
local function split_lines(out)
  for i = 1, #out do
    if out[i]:find("\n", 1, true) then
      local lines = {}
      for line in (table.concat(out, "\n") .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
      return lines
    end
  end
  return out
end

-- v's document as the emitter writes it: an array of lines, and whether
-- one of them may hold a line break. Its mappings and sequences are
-- emitted by cozy.yaml_emitter (C), which calls scalar, key_text and
-- sorted_keys above for all but the common cases; with `lua` set, by emit,
-- the definition the C one is checked against
-- (spec/unit/yaml_emitter_spec.lua).
local function document(v, lua, lines_memo)
  local out = {}
  local k = kind_of(v)
  if k == "scalar" then
    scalar(out, "", v, INDENT)
  elseif next(v) == nil then
    out[1] = k == "seq" and "[]" or "{}"
  elseif lua then
    emit(out, v, 0, nil, 0)
  else
    return out, emitter.emit(out, v, scalar, key_text, sorted_keys, lines_memo)
  end
  return out, true
end

-- v as one YAML document (no "---"), ended by a newline.
function yaml.encode(v)
  return table.concat((document(v)), "\n") .. "\n"
end

-- v's YAML as lines (no newlines at their ends): the emitter's own, without
-- joining and splitting them again (an entry holding a line break, which
-- the emitter does not write, would be split as encode's text would be).
-- lines_memo (optional, from yaml.memo(), kept by the caller between calls):
-- the lines of every mapping and sequence emitted are remembered in it,
-- and a table met again at the same indentation is not emitted again (the
-- plan's two sides of an object share every subtree its writes left
-- alone). The tables must not change while it is in use.
function yaml.lines(v, lines_memo)
  local out, may_break = document(v, false, lines_memo)
  if may_break then return split_lines(out) end
  return out
end

-- A memo for yaml.lines.
yaml.memo = emitter.memo

-- yaml.lines by the Lua emitter alone: the definition of the C one. seen
-- (optional, a table the caller keeps between calls): the lines of every
-- mapping and sequence emitted are remembered in it, and a table met again
-- at the same place is not emitted twice (the plan's two sides of an
-- object share every subtree its writes left alone). The tables must not
-- change between the calls that share it.
function yaml.lines_lua(v, seen)
  local out
  if seen == nil then
    out = document(v, true)
  else
    memo = seen
    local ok, o = pcall(document, v, true)
    memo = nil
    if not ok then error(o, 0) end
    out = o
  end
  return split_lines(out)
end

return yaml
