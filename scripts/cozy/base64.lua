-- cozy.base64: RFC 4648 base64 (the standard alphabet, `=` padding), as a
-- Secret's `data` holds its values. For migrations (in the sandbox) and the
-- engine alike. Decoding is strict: a character outside the alphabet (white
-- space too), a misplaced `=`, non-zero bits before the padding or a length
-- that is not a multiple of four raises, naming the byte where it went
-- wrong, rather than decode to something else. The API server encodes
-- canonically, so what a migration reads from a Secret always decodes. Pure
-- Lua: under the step's watch like the migration's own code, linear in the
-- input.
local validate = require "cozy.validate"

---@class cozy.base64
local base64 = {}

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local value_of = {}
for i = 1, #ALPHABET do value_of[ALPHABET:byte(i)] = i - 1 end

local function check_string(fn, s)
  validate.arg(3, "cozy.base64." .. fn, "its argument", s, "string", { show = "got" })
end

-- The alphabet's character for the 6-bit group of v at bit offset `shift`.
local function char_at(v, shift)
  local i = (v >> shift & 63) + 1
  return ALPHABET:sub(i, i)
end

--- s (any bytes) as base64 text.
---@param s string
---@return string
function base64.encode(s)
  check_string("encode", s)
  local out, n = {}, #s
  for i = 1, n - 2, 3 do
    local a, b, c = s:byte(i, i + 2)
    local v = a << 16 | b << 8 | c
    out[#out + 1] = char_at(v, 18) .. char_at(v, 12) .. char_at(v, 6) .. char_at(v, 0)
  end
  local rest = n % 3
  if rest > 0 then
    local a, b = s:byte(n - rest + 1, n)
    local v = a << 16 | (b or 0) << 8
    local tail = rest == 2 and (char_at(v, 6) .. "=") or "=="
    out[#out + 1] = char_at(v, 18) .. char_at(v, 12) .. tail
  end
  return table.concat(out)
end

local function invalid(at, why)
  error(("cozy.base64.decode: invalid base64 at byte %d: %s"):format(at, why), 3)
end

--- The bytes base64 text s stands for; raises on anything that is not
--- canonical base64 (no white space, no URL-safe alphabet).
---@param s string
---@return string
function base64.decode(s)
  check_string("decode", s)
  local n = #s
  if n % 4 ~= 0 then invalid(n, ("its length %d is not a multiple of 4"):format(n)) end
  local out = {}
  for i = 1, n, 4 do
    local v, pad = 0, 0
    for j = i, i + 3 do
      local c = s:byte(j)
      local d = value_of[c]
      if c == 61 and j >= n - 1 and (j == n or s:byte(n) == 61) then -- '=' only at the end
        pad, d = pad + 1, 0
      elseif d == nil or pad > 0 then
        invalid(j, c == 61 and "'=' before the end"
          or ("%q is not in the base64 alphabet"):format(string.char(c)))
      end
      v = v << 6 | d
    end
    local bytes = string.char(v >> 16, v >> 8 & 255, v & 255)
    out[#out + 1] = pad == 0 and bytes or bytes:sub(1, 3 - pad)
    if pad > 0 and (v & (pad == 1 and 0xFF or 0xFFFF)) ~= 0 then
      invalid(i + 3 - pad, "the bits before the padding are not zero")
    end
  end
  return table.concat(out)
end

return base64
