-- cozy.base64 against coreutils' base64 on every length up to 300 (every
-- padding case, every byte value), and its refusals.
local base64 = require "cozy.base64"
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

describe("cozy.base64", function()
  it("encodes as coreutils' base64 does and decodes back, for every length and byte", function()
    local dir = cli.tmpdir()
    finally(function() files.rm_rf(dir) end)
    local seed = 20261206
    math.randomseed(seed)
    local inputs = { "", "\0", "\255\255", ("\0"):rep(7) }
    for n = 1, 300 do
      local t = {}
      for i = 1, n do t[i] = string.char((i * 7 + n) % 256 == 0 and 0 or math.random(0, 255)) end
      inputs[#inputs + 1] = table.concat(t)
    end
    -- one shell for every input: coreutils' encoding of each, one per line
    for i, s in ipairs(inputs) do files.write(("%s/%03d"):format(dir, i), s) end
    local out = cli.shell(("for f in %s/[0-9]*; do base64 -w0 \"$f\"; echo; done"):format(cli.quote(dir)))
    local refs = {}
    for line in (out.stdout):gmatch("([^\n]*)\n") do refs[#refs + 1] = line end
    assert.equal(#inputs, #refs, out.stderr)
    for i, s in ipairs(inputs) do
      assert.equal(refs[i], base64.encode(s), ("input %d (seed %d)"):format(i, seed))
      assert.equal(s, base64.decode(refs[i]), ("input %d (seed %d)"):format(i, seed))
    end
  end)

  it("refuses what is not canonical base64, naming the byte", function()
    for text, why in pairs {
      ["abc"] = "at byte 3: its length 3 is not a multiple of 4",
      ["ab=c"] = "at byte 3: '=' before the end",
      ["Zg=a"] = "at byte 3: '=' before the end",
      ["Zh=="] = "at byte 2: the bits before the padding are not zero",
      ["Zm9v\n"] = "at byte 5: its length 5 is not a multiple of 4",
      ["Zm-_"] = 'at byte 3: "-" is not in the base64 alphabet',
      ["Zm 9"] = 'at byte 3: " " is not in the base64 alphabet',
    } do
      local ok, err = pcall(base64.decode, text)
      assert.is_false(ok, text)
      assert.equal("cozy.base64.decode: invalid base64 " .. why, err:gsub("^[^:]*:%d+: ", ""), text)
    end
    assert.has_error(function() base64.encode(nil) end, "cozy.base64.encode: its argument must be a string, got a nil")
    assert.has_error(function() base64.decode({}) end, "cozy.base64.decode: its argument must be a string, got a table")
  end)
end)
