-- cozy.json: json.decode(text, projection) builds only what the projection
-- names, and is otherwise the same decoder (docs/engine-api.md, "cozy.json").
local json = require "cozy.json"
local klist = dofile("spec/fixtures/json/klist.lua")
local random_values = dofile("spec/fixtures/json/random_values.lua")

-- Strict comparison: 1 and 1.0 differ, an array differs from an object, and
-- every table must carry json.array_mt or json.object_mt.
local function diff(a, b, path)
  path = path or "$"
  if type(a) ~= type(b) then return ("%s: %s vs %s"):format(path, type(a), type(b)) end
  if type(a) == "number" then
    if math.type(a) ~= math.type(b) or a ~= b then
      return ("%s: %s %s vs %s %s"):format(path, math.type(a), a, math.type(b), b)
    end
    return nil
  end
  if type(a) ~= "table" then
    return a ~= b and ("%s: %q vs %q"):format(path, tostring(a), tostring(b)) or nil
  end
  local ma, mb = getmetatable(a), getmetatable(b)
  if ma ~= mb or (ma ~= json.array_mt and ma ~= json.object_mt) then
    return ("%s: markers %s vs %s"):format(path, tostring(ma and ma.__name), tostring(mb and mb.__name))
  end
  for k, v in pairs(a) do
    local d = diff(v, b[k], path .. "." .. tostring(k))
    if d then return d end
  end
  for k in pairs(b) do
    if a[k] == nil then return ("%s.%s: missing on the left"):format(path, tostring(k)) end
  end
  return nil
end

local function assert_same(a, b)
  local d = diff(a, b)
  assert(d == nil, d)
end

-- The reference: decode everything, then prune by the same rules.
local function prune(v, proj)
  if proj == true or type(v) ~= "table" then return v end
  if getmetatable(v) == json.array_mt then
    local each = proj["*"]
    if not each then error("no * for an array") end
    local out = json.array()
    for i = 1, #v do out[i] = prune(v[i], each) end
    return out
  end
  local out = json.object()
  for k, e in pairs(v) do
    local sub = proj[k]
    if sub == nil then sub = proj["*"] end
    if sub then out[k] = prune(e, sub) end -- false: left out
  end
  return out
end

-- A random projection shaped by v: some keys kept whole, some descended
-- into, some left out (by absence or by false), sometimes a "*" for the
-- rest, sometimes keys v lacks.
local function random_projection(v, rand, depth)
  if type(v) ~= "table" or rand(4) == 1 or depth > 4 then return true end
  local proj = {}
  if getmetatable(v) == json.array_mt then
    proj["*"] = v[1] ~= nil and random_projection(v[rand(#v)], rand, depth + 1) or true
    return proj
  end
  for k, e in pairs(v) do
    local c = rand(3)
    if c == 1 then proj[k] = true
    elseif c == 2 then proj[k] = random_projection(e, rand, depth + 1)
    elseif rand(2) == 1 then proj[k] = false end
  end
  if rand(4) == 1 then proj["*"] = random_projection(v, rand, depth + 1) end
  if rand(3) == 1 then proj["not-in-the-document"] = true end
  return proj
end

-- The error message of f(...), or nil when it returns.
local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  return not ok and err or nil
end

describe("json.decode with a projection", function()
  describe("equals decode then prune", function()
    it("on seeded random documents with random projections", function()
      local values = random_values.new(4242)
      local built, refused = 0, 0
      for _ = 1, 3000 do
        local v = values.value()
        local text = json.encode(v)
        local full = json.decode(text)
        local proj = random_projection(full, values.rand, 0)
        if type(proj) ~= "table" then proj = { [values.string()] = true } end
        local ok, want = pcall(prune, full, proj)
        local got_ok, got = pcall(json.decode, text, proj)
        if ok then
          assert(got_ok, got)
          assert_same(want, got)
          built = built + 1
        else -- a table projection met an array of a different shape
          assert.is_false(got_ok)
          assert.matches('^cozy%.json: projection has no "%*" entry for this array at byte %d+$', got)
          refused = refused + 1
        end
      end
      -- the comparison ran on most documents, not just on the refusals
      assert.is_true(built > 2500, "built " .. built)
      assert.is_true(refused > 0, "no refusal exercised")
    end)

    it("on a realistic Kubernetes List, with the projection a migration asks for", function()
      local text, count = klist.generate(512 * 1024)
      local proj = { kind = true, apiVersion = true, metadata = true,
        items = { ["*"] = { kind = true, metadata = { name = true, namespace = true, resourceVersion = true },
          spec = { template = { spec = { volumes = true, domain = { devices = { disks = true } } } } },
          status = { volumeStatus = true, phase = true } } } }
      local got = json.decode(text, proj)
      assert_same(prune(json.decode(text), proj), got)
      assert.equal(count, #got.items)
      assert.is_nil(got.items[1].metadata.annotations)
      assert.is_nil(got.items[1].apiVersion)
      assert.is_string(got.items[1].metadata.name)
    end)

    it("leaves out a key whose projection is false, even where \"*\" keeps the rest", function()
      local list = klist.generate(64 * 1024)
      local text = json.encode(json.decode(list).items[1])
      local got = json.decode(text, { ["*"] = true, metadata = { ["*"] = true, managedFields = false } })
      local full = json.decode(text)
      assert.is_table(full.metadata.managedFields)
      assert.is_nil(got.metadata.managedFields)
      full.metadata.managedFields = nil
      assert_same(full, got)
      -- false in an array's place is no "*": refused, not an empty array
      assert.equal('cozy.json: projection has no "*" entry for this array at byte 1',
        error_of(json.decode, "[1]", { ["*"] = false }))
    end)

    it("builds the whole value for `true` and for no projection at all", function()
      local text = klist.generate(64 * 1024)
      local full = json.decode(text)
      assert_same(full, json.decode(text, true))
      assert_same(full, json.decode(text, nil))
      assert_same(full, json.decode(text, { ["*"] = true }))
    end)

    it("keeps scalars a table projection meets, and ignores keys the document lacks", function()
      assert_same(json.decode('{"a":"x","b":null,"c":5}'),
        json.decode('{"a":"x","b":null,"c":5,"d":{}}', { a = { y = true }, b = { y = true }, c = { ["*"] = true }, z = true }))
      assert.equal(7, json.decode("7", { a = true }))
      assert.equal("s", json.decode('"s"', { a = true }))
    end)

    it("keeps the last of repeated keys, as without a projection", function()
      assert_same(json.decode('{"a":2}'), json.decode('{"a":1,"b":0,"a":2}', { a = true }))
      assert_same(json.decode('{"a":{"x":2}}'), json.decode('{"a":{"x":1},"a":{"x":2,"y":3}}', { a = { x = true } }))
    end)

    it("matches escaped keys by their decoded text", function()
      assert_same(json.decode('{"é/x":1}'), json.decode('{"\\u00e9\\/x":1,"other":2}', { ["é/x"] = true }))
    end)

    it("leaves the projection as it was", function()
      local proj = { items = { ["*"] = { metadata = true } } }
      json.decode('{"items":[{"metadata":{"name":"a"},"spec":{}}]}', proj)
      assert.same({ items = { ["*"] = { metadata = true } } }, proj)
    end)
  end)

  describe("markers", function()
    it("marks every built array and object, empty, kept whole or projected", function()
      local v = json.decode('{"a":[],"o":{},"p":{"x":[],"y":{},"z":1},"l":[{"k":[]},{"k":{}}],"s":{"t":[1]}}',
        { a = true, o = true, p = { x = true, y = true }, l = { ["*"] = { k = true } }, s = { t = { ["*"] = true } } })
      assert.equal(json.object_mt, getmetatable(v))
      assert.equal(json.array_mt, getmetatable(v.a))
      assert.equal(json.object_mt, getmetatable(v.o))
      assert.equal(json.object_mt, getmetatable(v.p))
      assert.equal(json.array_mt, getmetatable(v.p.x))
      assert.equal(json.object_mt, getmetatable(v.p.y))
      assert.is_nil(v.p.z)
      assert.equal(json.array_mt, getmetatable(v.l))
      assert.equal(json.array_mt, getmetatable(v.l[1].k))
      assert.equal(json.object_mt, getmetatable(v.l[2].k))
      assert.equal(json.array_mt, getmetatable(v.s.t))
      assert.equal('{"a":[],"l":[{"k":[]},{"k":{}}],"o":{},"p":{"x":[],"y":{}},"s":{"t":[1]}}', json.encode(v))
    end)

    it("keeps an array an array when every element's projection leaves it empty", function()
      local v = json.decode('{"l":[{"a":1},{"b":2}]}', { l = { ["*"] = { c = true } } })
      assert.equal(2, #v.l)
      assert.equal('{"l":[{},{}]}', json.encode(v))
    end)
  end)

  describe("numbers in kept parts", function()
    it("keeps int64 exact and floats floats", function()
      local text = klist.generate(64 * 1024)
      local v = json.decode(text, { items = { ["*"] = { status = true, spec = { template = { spec = { evictionStrategy = true } } } } } })
      local vm, vmi = v.items[1], v.items[2]
      assert.equal(9007199254740994, vm.status.observedGeneration)
      assert.equal("integer", math.type(vm.status.observedGeneration))
      assert.equal(math.maxinteger - 1, vm.status.desiredGeneration)
      assert.equal(json.null, vm.spec.template.spec.evictionStrategy)
      assert.same({ math.mininteger, math.maxinteger, 9007199254740993, 2.0 ^ 64, json.null, 0, -0.5 }, vmi.status.sizes)
      assert.equal("float", math.type(vmi.status.sizes[4]))
      assert.equal("integer", math.type(vmi.status.sizes[3]))
    end)
  end)

  describe("errors", function()
    local skip_all = { ["not-there"] = true }

    -- each malformed value sits in a part the projection skips; the error and
    -- its offset are those of a full decode
    for _, bad in ipairs({ "[1,]", "01", "[-]", "[1.]", "[1e]", "+1", "tru", "nulL", '"abc', '"a\tb"',
      '"\\x"', '"\\u12G4"', '"\\ud800"', '"\\udc00"', "[1e400]", '"ab\xC0\xAFcd"', '"\xED\xA0\x80"',
      '{"a" 1}', '{"a":1,}', "{a:1}", '{"k":[{"x":"\xFF"}]}',
      -- brackets that do not match, missing and doubled separators, inside the skipped subtree
      "[1}", '{"a":1]', "[{]", '{"a":[}', "[1 2]", '{"a":1 "b":2}', '{"a"}', '{"a":}', "{,}", "[,]", "[1,,2]",
      '{"a":1,,"b":2}', '[[],{}]]', '{"a":{"b":{}}}}', '[{"a":[{"b":[]}]},{]',
      -- numbers at the edges of a double's range: skipping calls strtod only
      -- when digits + exponent pass 308
      "1e309", "-1e400", ("9"):rep(309), "-" .. ("9"):rep(309) .. ".5", "1.8e308", "99e307", "-0.99e310",
      "0.5e99999999999999999999", "1E+99999999999999999999999" }) do
      it(("rejects %q inside a skipped value like a full decode"):format(bad), function()
        local text = '{"keep":1,"skip":{"deeper":' .. bad .. '}}'
        local want = error_of(json.decode, text)
        assert.is_string(want)
        assert.matches("^cozy%.json: .- at byte %d+$", want)
        assert.equal(want, error_of(json.decode, text, { keep = true }))
        assert.equal(want, error_of(json.decode, text, skip_all))
      end)
    end

    it("raises the same error as a full decode on every prefix and on corrupted bytes", function()
      local doc = '{"a":[1,-2.5e3,{"b":null,"c":"\\u00e9\\ud83d\\ude00x\\n"},[]],"d":{},"e":true,"f":"é","g":{"h":[{"i":0}]}}'
      local projections = { skip_all, { a = { ["*"] = true } }, { g = { h = { ["*"] = { i = true } } } },
        { f = true, e = true }, { a = true, d = { x = true } } }
      local x, raised = 12345, 0
      local function check(text)
        local want = error_of(json.decode, text)
        for _, proj in ipairs(projections) do
          local got = error_of(json.decode, text, proj)
          -- the one difference: a corrupted byte can turn an object the
          -- projection descends into into an array, which it refuses first
          if not (got and got:match('projection has no "%*" entry')) then
            assert.equal(want, got)
          end
        end
        if want then raised = raised + 1 end
      end
      for i = 0, #doc - 1 do check(doc:sub(1, i)) end
      for _ = 1, 3000 do
        x = (x * 1103515245 + 12345) % 2147483648
        local pos = x % #doc + 1
        check(doc:sub(1, pos - 1) .. string.char(x // 7 % 256) .. doc:sub(pos + 1))
      end
      assert.is_true(raised > #doc, "raised " .. raised)
    end)

    it("limits nesting inside skipped parts to json.max_depth", function()
      local deep = ("["):rep(1001) .. ("]"):rep(1001)
      local text = '{"skip":' .. deep .. "}"
      local want = error_of(json.decode, text)
      assert.matches("nesting deeper than 1000 at byte 1008$", want)
      assert.equal(want, error_of(json.decode, text, skip_all))
    end)

    it("limits nesting of objects and arrays mixed, starting deep in the document", function()
      local function nested(n) return ('[{"a":'):rep(n) .. "1" .. ("}]"):rep(n) end
      -- 2 levels above the skipped value: 499 pairs reach 1000, 500 pairs 1002
      for _, n in ipairs({ 499, 500 }) do
        local text = '{"o":{"skip":' .. nested(n) .. ',"k":1}}'
        local want = error_of(json.decode, text)
        assert.equal(want, error_of(json.decode, text, { o = { k = true } }))
        assert.equal(want, error_of(json.decode, text, skip_all))
        if n == 499 then
          assert.is_nil(want)
          assert_same(json.decode('{"o":{"k":1}}'), json.decode(text, { o = { k = true } }))
        else
          -- at the '[' of the 500th pair: the 1001st level
          assert.equal("cozy.json: nesting deeper than 1000 at byte " .. #'{"o":{"skip":' + 499 * 6 + 1, want)
        end
      end
    end)

    it("accepts JSON whitespace everywhere inside a skipped value", function()
      local text = ' { "k" : 1 ,\t"skip" :\r\n[ 1 , { "a" : [ ] , "b" : { } } , "s" , true ,\nnull ] , "z" : 2 } '
      assert_same(json.decode('{"k":1,"z":2}'), json.decode(text, { k = true, z = true }))
    end)

    it("skips the numbers a full decode accepts, at the edges of a double's range", function()
      for _, n in ipairs({ "1e308", ("9"):rep(308), ("9"):rep(308) .. ".9", "1" .. ("0"):rep(308),
        "1" .. ("0"):rep(308) .. ".5", "1.7976931348623157e308", "-1.7976931348623157e308", "1e-400",
        "0." .. ("0"):rep(400) .. "1", "123456789012345678901234567890", "-0", "-0.0e-0", "9223372036854775808",
        "9.9e307", "99e306", "-1e307", "0e400", "0.1e309", "1e-99999999999999999999", "1E+300", "2.5e-08" }) do
        local text = '{"keep":' .. n .. ',"skip":[' .. n .. "]}"
        assert.is_nil(error_of(json.decode, text), n)
        local full = json.decode(text)
        assert_same(json.object({ keep = full.keep }), json.decode(text, { keep = true }))
      end
    end)

    it("refuses an array met by a table projection without \"*\", naming its byte", function()
      assert.equal('cozy.json: projection has no "*" entry for this array at byte 6',
        error_of(json.decode, '{"a":[1,2]}', { a = { x = true } }))
      assert.equal('cozy.json: projection has no "*" entry for this array at byte 6',
        error_of(json.decode, '{"a":[]}', { a = {} }))
      assert.equal('cozy.json: projection has no "*" entry for this array at byte 1',
        error_of(json.decode, "[1]", { x = true }))
    end)

    it("checks the projection before decoding, naming the faulty entry", function()
      local function argerr(proj)
        return error_of(json.decode, '{"a":1}', proj)
      end
      assert.equal("bad argument #2 to 'cozy.json.decode' (projection: items.*.spec is not true, false or a table)",
        argerr({ items = { ["*"] = { spec = "yes" } } }))
      assert.equal("bad argument #2 to 'cozy.json.decode' (projection: a.[number] is a key that is not a string)",
        argerr({ a = { true } }))
      assert.equal("bad argument #2 to 'cozy.json.decode' (projection table or true expected, got string)",
        argerr("metadata"))
      assert.equal("bad argument #2 to 'cozy.json.decode' (projection table or true expected, got boolean)",
        argerr(false))
      local cycle = {}
      cycle.a = cycle
      assert.matches("projection: a%.a%.a.-%.%.%. is nested deeper than 1000%)$", argerr(cycle))
      -- even when the document would not reach the faulty entry
      assert.matches("projection: z is not true, false or a table", error_of(json.decode, "[", { z = 1 }))
    end)
  end)

  -- Strings are scanned eight bytes at a time (a word); a stop byte ('"',
  -- '\\', a control character, a byte >= 0x80) may sit at any offset of a
  -- word, and the last bytes of the input are scanned one at a time. Each
  -- case is checked against what JSON says, not only against a full decode
  -- (both share the scanner).
  describe("strings scanned a word at a time", function()
    local kept_prefix, skipped_prefix = '["', '{"x":1,"skip":["'
    local skip_all = { ["not-there"] = true }
    local function docs(s)
      return kept_prefix .. s .. '"]', skipped_prefix .. s .. '"]}'
    end

    it("finds every byte value at every offset 0..15, kept and skipped", function()
      for k = 0, 15 do
        for b = 0, 255 do
          local s = ("a"):rep(k) .. string.char(b) .. ("a"):rep(20 - k)
          local kept, skipped = docs(s)
          for _, case in ipairs({ { kept, #kept_prefix + 1 + k }, { skipped, #skipped_prefix + 1 + k } }) do
            local text, at = case[1], case[2]
            local want
            if b < 0x20 then want = "control character in string at byte " .. at
            elseif b == 0x22 then want = "unexpected character 'a', expected ',' or ']' at byte " .. at + 1
            elseif b == 0x5C then want = "invalid escape at byte " .. at
            elseif b >= 0x80 then want = "invalid UTF-8 at byte " .. at end
            want = want and "cozy.json: " .. want
            assert.equal(want, error_of(json.decode, text), ("byte 0x%02X at offset %d"):format(b, k))
            if text == skipped then
              assert.equal(want, error_of(json.decode, text, { x = true }))
            elseif not want then
              assert.equal(s, json.decode(text)[1])
            end
          end
        end
      end
    end)

    it("resumes after a valid escape or UTF-8 sequence at every offset 0..15", function()
      for _, case in ipairs({ { "é", "é" }, { "€", "€" }, { "😀", "😀" }, { "\x7F", "\x7F" }, { "\\n", "\n" },
        { '\\"', '"' }, { "\\\\", "\\" }, { "\\/", "/" }, { "\\u00e9", "é" }, { "\\ud83d\\ude00", "😀" } }) do
        for k = 0, 15 do
          for tail = 0, 9 do
            local s = ("b"):rep(k) .. case[1] .. ("c"):rep(tail) .. case[1]
            local kept, skipped = docs(s)
            assert.equal(("b"):rep(k) .. case[2] .. ("c"):rep(tail) .. case[2], json.decode(kept)[1])
            assert_same(json.decode('{"x":1}'), json.decode(skipped, { x = true }))
          end
        end
      end
    end)

    it("rejects bad UTF-8, control characters and bad escapes at every offset 0..15 of a skipped string", function()
      for _, bad in ipairs({ "\xC0\xAF", "\xE0\x80\xAF", "\x80", "\xC3", "\xE2\x82", "\xF0\x9F\x98", "\xED\xA0\x80",
        "\xF4\x90\x80\x80", "\xFE", "\xFF", "\0", "\x1F", "\t", "\n", "\\x", "\\u12G4", "\\u12", "\\ud800",
        "\\ud800\\u0041", "\\udc00", "\\U0041" }) do
        for k = 0, 15 do
          local _, skipped = docs(("z"):rep(k) .. bad .. ("z"):rep(12)) -- z: not a hex digit
          local want = error_of(json.decode, skipped)
          -- each is reported at its first byte (the backslash of an escape)
          assert.matches("^cozy%.json: .- at byte " .. #skipped_prefix + 1 + k .. "$", want)
          assert.equal(want, error_of(json.decode, skipped, { x = true }))
          assert.equal(want, error_of(json.decode, skipped, skip_all))
        end
      end
    end)

    it("stops at the end of the input inside a string, kept or skipped", function()
      local content = ("abcdefgh"):rep(3) .. "é\\n€\\u00e9😀xyz"
      local doc = '{"x":1,"skip":"' .. content .. '","kp":"' .. content .. '"}'
      local opening = { skip = 15, keep = #doc - #content - 2 }
      for cut = 15, #doc - 1 do
        local text = doc:sub(1, cut)
        local want = error_of(json.decode, text)
        assert.is_string(want)
        for _, proj in ipairs({ { x = true }, { x = true, kp = true }, skip_all }) do
          assert.equal(want, error_of(json.decode, text, proj))
        end
        -- cut among the plain bytes a-d (in no key, no escape): the string
        -- is unterminated, named at its quote
        if text:sub(-1):match("[a-d]") then
          local quote = cut < opening.keep and opening.skip or opening.keep
          assert.equal("cozy.json: unterminated string at byte " .. quote, want)
        end
      end
      -- an input shorter than a word: no word is read (a string kept, or skipped in {"a":...})
      for _, text in ipairs({ '"', '"a', '"abcdef', '"abcdef\\', '"\xC3', '{"a":"', '{"a":"b', '{"a":"\\', '{"a":"\xC3' }) do
        local want = error_of(json.decode, text)
        assert.matches("^cozy%.json: .- at byte %d+$", want)
        assert.equal(want, error_of(json.decode, text, skip_all))
      end
      assert.equal("abcdef", json.decode('"abcdef"', skip_all))
    end)
  end)

  describe("projected keys", function()
    it("finds keys among many names, of equal lengths, prefixes of each other and empty", function()
      local proj, parts = { [""] = true, a = true, abc = { x = true }, b = true, ba = true }, {}
      for i = 1, 300 do
        local k = ("k%03d"):format(i)
        if i % 3 == 0 then proj[k] = true end
        parts[#parts + 1] = ('"%s":%d'):format(k, i)
      end
      for _, k in ipairs({ "", "a", "ab", "abc", "abcd", "b", "ba", "bb", "c" }) do
        parts[#parts + 1] = ('"%s":{"x":"%s","y":1}'):format(k, k)
      end
      local text = "{" .. table.concat(parts, ",") .. "}"
      local got = json.decode(text, proj)
      assert_same(prune(json.decode(text), proj), got)
      assert.equal(300, got.k300)
      assert.is_nil(got.k299)
      assert.same({ x = "abc" }, got.abc)
    end)

    it("compiles a table shared by several entries once per place it is reached", function()
      local meta = { name = true }
      local proj = { a = meta, b = { c = meta, ["*"] = meta }, l = { ["*"] = meta } }
      local text = '{"a":{"name":1,"x":2},"b":{"c":{"name":3,"y":4},"d":{"name":5,"z":6}},"l":[{"name":7,"w":8}],"e":9}'
      assert_same(prune(json.decode(text), proj), json.decode(text, proj))
      assert.equal('{"a":{"name":1},"b":{"c":{"name":3},"d":{"name":5}},"l":[{"name":7}]}',
        json.encode(json.decode(text, proj)))
    end)

    it("matches escaped keys by their text, and a document's own \"*\" key like any other", function()
      local text = '{"\\u0061":1,"b\\"c":2,"\\u002a":3,"d":{"k":4,"j":5},"*":{"k":6,"j":7}}'
      assert.equal('{"a":1,"b\\"c":2}', json.encode(json.decode(text, { a = true, ['b"c'] = true })))
      -- the document's "*" (escaped or not, the last wins) is a key the projection does not name
      assert.equal('{"a":1}', json.encode(json.decode(text, { a = true })))
      assert.equal('{"*":{"k":6},"a":1,"b\\"c":2,"d":{"k":4}}', json.encode(json.decode(text, { ["*"] = { k = true } })))
    end)
  end)

  describe("memory", function()
    it("builds a small fraction of the tables for a narrow projection of a big list", function()
      local text, count = klist.generate(2 * 1024 * 1024)
      local function kib_held(proj)
        collectgarbage("collect")
        collectgarbage("collect")
        local before = collectgarbage("count")
        local v = json.decode(text, proj)
        collectgarbage("collect")
        local held = collectgarbage("count") - before
        assert.equal(count, #v.items)
        return held
      end
      local full = kib_held(nil)
      local narrow = kib_held({ items = { ["*"] = { metadata = { name = true, namespace = true, resourceVersion = true } } } })
      assert.is_true(full > 1024, "full decode holds " .. full .. " KiB")
      -- names and versions of every item against the whole of every item
      assert.is_true(narrow / full < 0.1, ("narrow %.0f KiB / full %.0f KiB"):format(narrow, full))
    end)
  end)
end)
