-- cozy.text: bytes from outside (API answers, a legacy script's output,
-- curl's messages, a migration's strings, the kubeconfig, the user's
-- arguments) made safe to print. This is the output edge: every log line,
-- every line of status/check/list/plan/stamp and the termination message
-- goes through text.line (text.lines), every -o json document through
-- text.json, so no path can print an invalid UTF-8 sequence (which JSON
-- cannot encode), a credential, or a raw control character (a newline that
-- forges a line of its own, an ESC that rewrites the terminal).
local json = require "cozy.json"
local plain_lines = require("cozy.sys").plain_lines

local text = {}

-- s with every byte that does not start a valid UTF-8 sequence replaced by
-- U+FFFD. Linear in #s: valid runs are copied whole.
function text.utf8(s)
  if utf8.len(s) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local ok, bad = utf8.len(s, i)
    if ok then
      out[#out + 1] = s:sub(i)
      break
    end
    out[#out + 1] = s:sub(i, bad - 1)
    out[#out + 1] = "\u{FFFD}"
    i = bad + 1
  end
  return table.concat(out)
end

-- s with every URL's user-info blanked: from "://" to the LAST '@' that a
-- host follows (a letter, digit or '[') before the line ends or the next
-- "://" begins. A password is any bytes, raw or percent-encoded: a raw '/',
-- space, quote or '@' in it ("http://u:pa/s s@proxy:3128", which a proxy
-- variable or a kubeconfig's proxy-url may hold and curl quotes) cannot be
-- told from the URL's own path or the text after it, so everything up to
-- that '@' goes (a '@' later on the line, "https://host/path@v1", blanks
-- the host too: more hidden, never a password shown). Linear in #s: each
-- search below starts where the last one stopped.
local function blank_userinfo(s)
  local out, copied = {}, 1
  local next_at, next_eol = 0, 0
  local scheme = s:find("://", 1, true)
  while scheme do
    local from = scheme + 3
    local following = s:find("://", from, true)
    if next_eol ~= nil and next_eol < from then next_eol = s:find("[\r\n]", from) end
    local stop = math.min(following or #s + 1, next_eol or #s + 1)
    local last
    while true do
      if next_at ~= nil and next_at < from then next_at = s:find("@", from, true) end
      if next_at == nil or next_at >= stop then break end
      if s:find("^[%w%[]", next_at + 1) then last = next_at end
      from = next_at + 1
    end
    if last then
      out[#out + 1] = s:sub(copied, scheme + 2)
      out[#out + 1] = "***"
      copied = last
    end
    scheme = following
  end
  if copied == 1 then return s end
  out[#out + 1] = s:sub(copied)
  return table.concat(out)
end

-- s with credentials blanked: the user-info of a URL (a proxy's
-- "http://user:password@host", which curl quotes in its messages; see
-- blank_userinfo) and the token of an Authorization header or a
-- "Bearer ..." text. Every pattern starts with a literal, so a match is
-- tried in constant time at each position: linear in #s, whatever the text
-- (a pattern led by a repeated class would rescan a long run of letters at
-- every position).
function text.redact(s)
  if s:find("://", 1, true) then s = blank_userinfo(s) end
  if s:find("earer", 1, true) then s = s:gsub("([Bb]earer%s+)[%w%-._~+/]+=*", "%1***") end
  if s:find("uthorization", 1, true) then s = s:gsub("([Aa]uthorization:%s*)[^\r\n]+", "%1***") end
  return s
end

-- Any value as printable text: valid UTF-8, credentials blanked.
function text.safe(s)
  if type(s) ~= "string" then s = tostring(s) end
  return text.redact(text.utf8(s))
end

-- The escape of each control character (C0 and DEL) in a line.
local escapes = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function escape(c) return escapes[c] or ("\\x%02x"):format(c:byte()) end

-- The C1 controls (U+0080-U+009F, UTF-8 C2 80-C2 9F): a terminal may act
-- on them as on ESC sequences (U+009B is CSI), so they are escaped too.
local function escape_c1(c) return ("\\u%04x"):format(c:byte(2)) end

-- Any value as one printable line: text.safe, then every control character
-- (newline, CR, ESC, the rest of C0, DEL, and C1) written as an escape (\n,
-- \r, \t, \xHH, \u00HH). A backslash is left as it is, so applying it twice
-- changes nothing: a line passed on through several outputs is escaped once.
function text.line(s)
  s = text.safe(s)
  if s:find("%c") then s = s:gsub("%c", escape) end
  if s:find("\194[\128-\159]") then s = s:gsub("\194[\128-\159]", escape_c1) end
  return s
end

-- text.lines, a line at a time.
local function lines_each(list)
  local out = {}
  for i, l in ipairs(list) do out[i] = text.line(l) end
  out[#out + 1] = ""
  return table.concat(out, "\n")
end

-- Lines laid out by the engine (a report: status, check) as one text:
-- each line through text.line, each ended by a newline. What a value from
-- outside holds can never start a line of its own.
function text.lines(list)
  -- (text.line takes any value: shown by tostring; it escapes a control
  -- character, a line break included: looked for line by line, in C)
  local n = plain_lines(list)
  if n == nil then return lines_each(list) end
  if n == 0 then return "" end
  -- most reports (a plan's diff of every object) have nothing to change:
  -- one look at them joined, as nothing text.line acts on can span a line
  -- break, and the only breaks are those joining them. (The C1 pattern,
  -- tried at every byte, only where its lead byte is: the plan prints
  -- megabytes of reports.)
  local all = table.concat(list, "\n", 1, n)
  if utf8.len(all) and not (all:find("\194", 1, true) and all:find("\194[\128-\159]"))
      and not all:find("://", 1, true) and not all:find("earer", 1, true)
      and not all:find("uthorization", 1, true) then
    return all .. "\n"
  end
  return lines_each(list)
end

-- A copy of v that JSON can encode and a terminal can show: every string
-- (keys too) through text.safe, the JSON markers kept; at `max_depth`
-- (default: none) a deeper table is shown as its text.
function text.printable(v, max_depth, depth)
  local t = type(v)
  if t == "string" then return text.safe(v) end
  if t ~= "table" then return v end
  depth = depth or 0
  if max_depth and depth >= max_depth then return text.safe(tostring(v)) end
  local c = {}
  for k, x in next, v do
    c[type(k) == "string" and text.safe(k) or k] = text.printable(x, max_depth, depth + 1)
  end
  local mt = getmetatable(v)
  return setmetatable(c, (mt == json.array_mt or mt == json.object_mt) and mt or nil)
end

-- v as a JSON document for output (-o json, plan events): its strings made
-- printable first, so a string from outside cut inside a UTF-8 sequence is
-- shown with U+FFFD rather than failing the command.
function text.json(v)
  -- v encodes, so its strings are valid UTF-8, and holds nothing
  -- text.redact acts on (each of its triggers is bytes JSON never escapes):
  -- the copy would be v again
  local ok, s = pcall(json.encode, v)
  if ok and not s:find("://", 1, true) and not s:find("earer", 1, true)
    and not s:find("uthorization", 1, true) then
    return s
  end
  return json.encode(text.printable(v))
end

-- s through text.safe, then cut to at most `limit` bytes (with `ellipsis`
-- after a cut): blanking before cutting, so that a cut inside a URL's
-- user-info or a token (before the '@' or the end that marks it) leaves
-- none of it.
function text.safe_prefix(s, limit, ellipsis)
  s = text.safe(s)
  if #s <= limit then return s end
  ellipsis = ellipsis or ""
  return text.prefix(s, limit - #ellipsis) .. ellipsis
end

-- At most `limit` bytes of s, cut before a UTF-8 sequence rather than
-- inside one (a cut sequence would make the line unprintable as JSON).
function text.prefix(s, limit)
  if #s <= limit then return s end
  local cut = limit
  -- step back over continuation bytes (10xxxxxx) to the sequence's start
  while cut > 0 and s:byte(cut + 1) and s:byte(cut + 1) & 0xC0 == 0x80 do cut = cut - 1 end
  return s:sub(1, cut)
end

return text
