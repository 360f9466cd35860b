-- cozy.text: bytes from outside (API answers, a legacy script's output,
-- curl's messages, a migration's strings) made safe to print. Every log
-- line goes through text.safe, so no path can print an invalid UTF-8
-- sequence (which a JSON log cannot encode) or a credential.
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

-- s with credentials blanked: the user-info of a URL (a proxy's
-- "http://user:password@host", which curl quotes in its messages) and the
-- token of an Authorization header or a "Bearer ..." text.
-- Every pattern starts with a literal, so a match is tried in constant time
-- at each position: linear in #s, whatever the text (a pattern led by a
-- repeated class would rescan a long run of letters at every position).
function text.redact(s)
  if s:find("://", 1, true) then s = s:gsub("://[^/@%s'\"]+@", "://***@") end
  if s:find("earer", 1, true) then s = s:gsub("([Bb]earer%s+)[%w%-._~+/]+=*", "%1***") end
  if s:find("uthorization", 1, true) then s = s:gsub("([Aa]uthorization:%s*)[^\r\n]+", "%1***") end
  return s
end

-- Any value as printable text: valid UTF-8, credentials blanked.
function text.safe(s)
  if type(s) ~= "string" then s = tostring(s) end
  return text.redact(text.utf8(s))
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
