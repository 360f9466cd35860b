-- cozy.json: the lossless JSON contract (docs/engine-api.md), and the errors.
local json = require "cozy.json"
local cjson = require "cjson"
local dkjson = require "dkjson"
local klist = dofile("spec/fixtures/json/klist.lua")

-- Strict structural comparison: unlike assert.same, 1 and 1.0 differ, and an
-- array differs from an object (by json.array_mt / json.object_mt). `b` may
-- come from dkjson, whose arrays and objects say so in __jsontype.
local function kind(t)
  local mt = getmetatable(t)
  if mt == json.array_mt or (mt and mt.__jsontype == "array") then return "array" end
  if mt == json.object_mt or (mt and mt.__jsontype == "object") then return "object" end
  return "plain"
end

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
    if a ~= b then return ("%s: %q vs %q"):format(path, tostring(a), tostring(b)) end
    return nil
  end
  if kind(a) ~= kind(b) then return ("%s: %s vs %s"):format(path, kind(a), kind(b)) end
  for k, v in pairs(a) do
    local d = diff(v, b[k], path .. "." .. tostring(k))
    if d then return d end
  end
  for k in pairs(b) do
    if a[k] == nil then return ("%s.%s: missing on the left"):format(path, tostring(k)) end
  end
  return nil
end

local function assert_same_json(a, b)
  local d = diff(a, b)
  assert(d == nil, d)
end

local function roundtrip(s) return json.encode(json.decode(s)) end

-- Asserts that f(...) raises exactly a cozy.json error naming `offset`.
local function assert_error_at(offset, pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  assert.is_string(err)
  local at = err:match("^cozy%.json: .- at byte (%d+)$")
  assert(at, "no byte offset in: " .. err)
  assert.equal(offset, tonumber(at), err)
  if pattern then assert.matches(pattern, err) end
end

describe("cozy.json", function()
  describe("empty arrays and objects", function()
    it("keeps [] and {} apart, at the top and nested", function()
      for _, s in ipairs({ "[]", "{}", "[[],{}]", '{"a":[],"b":{}}', '{"a":[[],[{}],{"b":[]}]}', "[[[]]]", '[{"x":{}}]' }) do
        assert.equal(s, roundtrip(s))
      end
      assert.equal("[[],{},9007199254740993]", roundtrip("[[],{},9007199254740993]"))
    end)

    it("marks decoded arrays and objects with the shared metatables", function()
      local v = json.decode('{"a":[],"o":{}}')
      assert.equal(json.object_mt, getmetatable(v))
      assert.equal(json.array_mt, getmetatable(v.a))
      assert.equal(json.object_mt, getmetatable(v.o))
    end)

    it("keeps a decoded array an array when a migration empties it", function()
      local v = json.decode('{"finalizers":["a","b"]}')
      table.remove(v.finalizers)
      table.remove(v.finalizers)
      assert.equal('{"finalizers":[]}', json.encode(v))
    end)

    it("encodes a plain empty table as {}, and a marked one as []", function()
      assert.equal("{}", json.encode({}))
      local t = {}
      assert.equal(t, json.array(t))
      assert.equal("[]", json.encode(t))
      assert.equal("[]", json.encode(json.array()))
      assert.equal("{}", json.encode(json.object()))
      assert.equal('{"volumes":[]}', json.encode({ volumes = json.array({}) }))
    end)

    it("encodes plain sequences as arrays and string-keyed tables as objects", function()
      assert.equal('[1,"two",[3]]', json.encode({ 1, "two", { 3 } }))
      assert.equal('{"a":{"b":[true,false]}}', json.encode({ a = { b = { true, false } } }))
      assert.equal('{"1":"x"}', json.encode(json.object({ ["1"] = "x" })))
    end)

    it("re-marks with json.array and json.object, but refuses a foreign metatable", function()
      local v = json.decode("{}")
      assert.equal("[]", json.encode(json.array(v)))
      assert.equal("{}", json.encode(json.object(v)))
      assert.has_error(function() json.array(setmetatable({}, {})) end,
        "bad argument #1 to 'array' (table already has a metatable)")
      assert.has_error(function() json.array("x") end, "bad argument #1 to 'array' (table expected, got string)")
    end)
  end)

  describe("numbers", function()
    it("decodes int64 integers as exact Lua integers and encodes them exactly", function()
      for _, case in ipairs({
        { "9223372036854775807", math.maxinteger },
        { "-9223372036854775808", math.mininteger },
        { "9007199254740993", 9007199254740993 },
        { "-9007199254740993", -9007199254740993 },
        { "12345678901234567", 12345678901234567 },
        { "0", 0 }, { "-1", -1 }, { "42", 42 },
      }) do
        local v = json.decode(case[1])
        assert.equal("integer", math.type(v), case[1])
        assert.equal(case[2], v)
        assert.equal(case[1], json.encode(v))
      end
      assert.are_not.equal(9007199254740992, json.decode("9007199254740993"))
      assert.equal('{"generation":9007199254740993}', json.encode({ generation = 9007199254740993 }))
    end)

    it("decodes integers beyond int64 as floats", function()
      local v = json.decode("9223372036854775808")
      assert.equal("float", math.type(v))
      assert.equal(2.0 ^ 63, v)
      assert.equal("float", math.type(json.decode("-9223372036854775809")))
      assert.equal(1e20, json.decode("100000000000000000000"))
    end)

    it("decodes fractions and exponents as floats", function()
      for _, s in ipairs({ "1.0", "1e2", "1E2", "-0.5", "2.5e-8", "1e+2", "0.0" }) do
        assert.equal("float", math.type(json.decode(s)), s)
      end
      assert.equal(100.0, json.decode("1e2"))
    end)

    it("encodes floats with the shortest text that reads back exactly", function()
      assert.equal("0.1", json.encode(0.1))
      assert.equal("0.1", roundtrip("0.1"))
      assert.equal("1e+300", json.encode(1e300))
      assert.equal(1e300, json.decode(roundtrip("1e300")))
      assert.equal("0.30000000000000004", json.encode(0.1 + 0.2))
      assert.equal("12345678901234568.0", json.encode(12345678901234567.0))
      assert.equal("2.5e-08", json.encode(2.5e-8))
      for _, x in ipairs({ 1 / 3, 2 / 3, 5e-324, 1.7976931348623157e308, 123456789.123, -2.5e-8,
                           1e21, 1e22, 0.1 + 0.2, math.pi, -1e-300, 4.35, 2 ^ 53 + 2.0 }) do
        local back = json.decode(json.encode(x))
        assert.equal("float", math.type(back))
        assert.equal(x, back, json.encode(x))
      end
    end)

    it("keeps integral floats floats (2.0 does not come back as 2)", function()
      assert.equal("2.0", json.encode(2.0))
      assert.equal("-0.0", json.encode(-0.0))
      assert.equal("9007199254740992.0", json.encode(2.0 ^ 53))
      assert.equal("1.0", roundtrip("1.0"))
      assert.equal("[1,1.0]", roundtrip("[1,1.0]"))
    end)
  end)

  describe("strings", function()
    it("decodes \\u escapes and surrogate pairs to UTF-8", function()
      assert.equal("\xC3\xA9", json.decode('"\\u00e9"'))
      assert.equal("é", json.decode('"\\u00E9"'))
      assert.equal("\xF0\x9F\x98\x80", json.decode('"\\ud83d\\ude00"'))
      assert.equal("a😀b", json.decode('"a\\uD83D\\uDE00b"'))
      assert.equal("\0x", json.decode('"\\u0000x"'))
      assert.equal('"\\/\b\f\n\r\t', json.decode('"\\"\\\\\\/\\b\\f\\n\\r\\t"'))
    end)

    it("keeps raw UTF-8 as it is, both ways", function()
      local s = "Développement — тест — 日本語 😀"
      assert.equal(s, json.decode('"' .. s .. '"'))
      assert.equal('"' .. s .. '"', json.encode(s))
    end)

    it("escapes what JSON requires, and not '/'", function()
      assert.equal('"kubevirt.io/v1"', json.encode("kubevirt.io/v1"))
      assert.equal('"a/b\\n\\"c\\"\\\\\\u0001\\t"', json.encode('a/b\n"c"\\\1\t'))
      assert.equal('"\\u0000"', json.encode("\0"))
      local all = {}
      for c = 0, 127 do all[#all + 1] = string.char(c) end
      all = table.concat(all) .. "/\\/é"
      assert.equal(all, json.decode(json.encode(all)))
    end)

    it("encodes keys like strings", function()
      assert.equal('{"a\\nb":1,"app.kubernetes.io/name":"x"}', json.encode({ ["a\nb"] = 1, ["app.kubernetes.io/name"] = "x" }))
    end)
  end)

  describe("null", function()
    it("survives inside arrays, keeping their length", function()
      local v = json.decode("[1,null,3]")
      assert.equal(3, #v)
      assert.equal(json.null, v[2])
      assert.equal("[1,null,3]", json.encode(v))
      assert.equal("[null,null]", roundtrip("[null,null]"))
      assert.equal("[null]", json.encode({ json.null }))
    end)

    it("survives inside objects", function()
      local v = json.decode('{"a":null,"b":{"c":null}}')
      assert.equal(json.null, v.a)
      assert.equal(json.null, v.b.c)
      assert.equal('{"a":null,"b":{"c":null}}', json.encode(v))
    end)

    it("is cjson's null, so values can be shared with raw cjson", function()
      assert.equal(cjson.null, json.null)
      assert.equal(json.null, json.decode("null"))
      assert.equal("null", json.encode(json.null))
    end)
  end)

  describe("the rest of JSON", function()
    it("decodes scalars at the top level and tolerates JSON whitespace", function()
      assert.is_true(json.decode(" true "))
      assert.is_false(json.decode("\tfalse\n"))
      assert.equal("x", json.decode('"x"'))
      assert.same({ 1, 2 }, json.decode(" \t\r\n[ 1 ,\n2 ]\r\n"))
    end)

    it("keeps the last of repeated keys", function()
      assert.equal(2, json.decode('{"a":1,"a":2}').a)
    end)

    it("sorts object keys bytewise, at every level", function()
      assert.equal('{"a":2,"b":1,"c":{"y":2,"z":1}}', json.encode({ b = 1, a = 2, c = { z = 1, y = 2 } }))
      assert.equal('{"B":1,"_":3,"a":2,"ab":5,"é":4}', json.encode({ a = 2, B = 1, ["é"] = 4, _ = 3, ab = 5 }))
      local many, keys = {}, {}
      for i = 1, 200 do many["k" .. (i * 7919 % 1000)] = i end
      for k in pairs(many) do keys[#keys + 1] = k end
      table.sort(keys)
      local parts = {}
      for i, k in ipairs(keys) do parts[i] = ('"%s":%d'):format(k, many[k]) end
      assert.equal("{" .. table.concat(parts, ",") .. "}", json.encode(many))
    end)
  end)

  describe("a realistic 1 MB Kubernetes List", function()
    local text, count = klist.generate(1024 * 1024)

    it("decodes like an independent decoder (dkjson), types included", function()
      assert.is_true(#text > 1000000)
      local ours = json.decode(text)
      local theirs = dkjson.decode(text, 1, json.null)
      assert_same_json(ours, theirs)
      assert.equal(count, #ours.items)
    end)

    it("round-trips decode -> encode -> decode to a deep-equal value, and encodes stably", function()
      local v1 = json.decode(text)
      local e1 = json.encode(v1)
      local v2 = json.decode(e1)
      assert_same_json(v1, v2)
      local e2 = json.encode(v2)
      assert.equal(e1, e2)
      assert.equal(e1, json.encode(json.decode(e2)))
    end)

    it("keeps what cjson would lose", function()
      local v = json.decode(text)
      local vm, vmi = v.items[1], v.items[2]
      assert.equal("VirtualMachine", vm.kind)
      assert.equal(9007199254740994, vm.status.observedGeneration)
      assert.equal("integer", math.type(vm.status.observedGeneration))
      assert.equal(math.maxinteger - 1, vm.status.desiredGeneration)
      assert.equal(json.array_mt, getmetatable(vm.spec.template.spec.tolerations))
      assert.equal(0, #vm.spec.template.spec.tolerations)
      assert.equal(json.null, vm.spec.template.spec.evictionStrategy)
      assert.same({ math.mininteger, math.maxinteger, 9007199254740993, 2.0 ^ 64, json.null, 0, -0.5 }, vmi.status.sizes)
      assert.equal(7, #vmi.status.sizes)
      assert.equal("🚀 launch été", vm.metadata.annotations["cozystack.io/emoji"])
      local e = json.encode(vm)
      assert.matches('"tolerations":%[%]', e)
      assert.matches('"nodeSelector":{}', e)
      assert.matches('"observedGeneration":9007199254740994', e)
      assert.matches('"evictionStrategy":null', e)
    end)
  end)

  describe("random values", function()
    -- seeded, so a failure reproduces
    local values = dofile("spec/fixtures/json/random_values.lua").new(4242)

    it("encode then decode gives the value back, and dkjson reads the same", function()
      for _ = 1, 2000 do
        local v = values.value()
        local text = json.encode(v)
        local back = json.decode(text)
        assert_same_json(v, back)
        assert_same_json(back, dkjson.decode(text, 1, json.null))
        assert.equal(text, json.encode(back))
      end
    end)
  end)

  describe("decode errors name the byte offset", function()
    for _, case in ipairs({
      { "", 1, "end of input" },
      { "   ", 4, "end of input" },
      { "[1,2", 5, "end of input, expected ',' or ']'" },
      { '{"a" 1}', 6, "expected ':'" },
      { '{"a":1,}', 8, "expected a string" },
      { '{"a":1 "b":2}', 8, "expected ',' or '}'" },
      { "{a:1}", 2, "expected a string" },
      { "[1,]", 4, "expected a JSON value" },
      { "01", 2, "leading zero" },
      { "[-]", 3, "expected a digit" },
      { "[1.]", 4, "after '.'" },
      { "[1e]", 4, "exponent" },
      { "[.5]", 2, "expected a JSON value" },
      { "+1", 1, "expected a JSON value" },
      { "[NaN]", 2, "expected a JSON value" },
      { "tru", 1, "expected a JSON value" },
      { "nulL", 1, "expected a JSON value" },
      { "[1] x", 5, "expected the end of input" },
      { "[1]\0", 4, "byte 0x00" },
      { "{} {}", 4, "expected the end of input" },
      { '"abc', 1, "unterminated string" },
      { '["ok","abc\\', 7, "unterminated string" },
      { '"a\tb"', 3, "control character" },
      { '"a\nb"', 3, "control character" },
      { '"\\x"', 2, "invalid escape" },
      { '["\\u12G4"]', 3, "four hex digits" },
      { '"\\u12"', 2, "four hex digits" },
      { '"\\ud800"', 2, "high surrogate" },
      { '"ab\\ud800\\u0041"', 4, "high surrogate" },
      { '"\\udc00"', 2, "lone low surrogate" },
      { "[1e400]", 2, "out of range" },
      { "[\xC3\xA9]", 2, "byte 0xC3" },
    }) do
      it(("rejects %q at byte %d"):format(case[1], case[2]), function()
        assert_error_at(case[2], case[3], json.decode, case[1])
      end)
    end

    -- each bad sequence sits at byte 12, inside {"name":"ab...
    for _, case in ipairs({
      { "\xC0\xAF", "overlong 2-byte '/'" },
      { "\xE0\x80\xAF", "overlong 3-byte '/'" },
      { "\xF0\x80\x80\xAF", "overlong 4-byte '/'" },
      { "\x80", "lone continuation byte" },
      { "\xBF", "lone continuation byte" },
      { "\xE2\x82", "truncated 3-byte sequence" },
      { "\xF0\x9F\x98", "truncated 4-byte sequence" },
      { "\xC3", "truncated 2-byte sequence" },
      { "\xED\xA0\x80", "UTF-16 surrogate encoded in UTF-8" },
      { "\xF4\x90\x80\x80", "code point above U+10FFFF" },
      { "\xFE", "byte never in UTF-8" },
      { "\xFF", "byte never in UTF-8" },
    }) do
      it("rejects invalid UTF-8: " .. case[2], function()
        assert_error_at(12, "invalid UTF%-8", json.decode, '{"name":"ab' .. case[1] .. 'cd"}')
      end)
    end

    it("rejects a sequence truncated by the end of input", function()
      assert_error_at(4, "invalid UTF%-8", json.decode, '"ab\xE2\x82')
    end)

    it("accepts every UTF-8 boundary code point", function()
      for _, s in ipairs({ "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
                           "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF" }) do
        assert.equal(s, json.decode('"' .. s .. '"'))
      end
    end)

    it("limits nesting to json.max_depth (1000), arrays and objects alike", function()
      assert.equal(1000, json.max_depth)
      local ok = ("["):rep(1000) .. ("]"):rep(1000)
      assert.equal(ok, roundtrip(ok))
      assert_error_at(1001, "nesting deeper than 1000", json.decode, ("["):rep(1001) .. ("]"):rep(1001))
      assert_error_at(5001, "nesting deeper than 1000", json.decode, ('{"a":'):rep(1001) .. "1" .. ("}"):rep(1001))
      -- a deep document that is also truncated fails on depth first, cleanly
      assert_error_at(3001, "nesting", json.decode, ("[{\"k\":"):rep(100000))
    end)

    it("raises a cozy.json error, never crashes, on every prefix and on corrupted bytes", function()
      local doc = '{"a":[1,-2.5e3,{"b":null,"c":"\\u00e9\\ud83d\\ude00x\\n"},[]],"d":{},"e":true,"f":"é"}'
      assert.is_table(json.decode(doc))
      for i = 0, #doc - 1 do -- no proper prefix of an object is JSON
        local ok, err = pcall(json.decode, doc:sub(1, i))
        assert.is_false(ok)
        local at = tonumber(err:match("^cozy%.json: .- at byte (%d+)$"))
        assert(at and at >= 1 and at <= i + 1, err)
      end
      local x = 12345
      for _ = 1, 3000 do
        x = (x * 1103515245 + 12345) % 2147483648
        local pos = x % #doc + 1
        local bad = doc:sub(1, pos - 1) .. string.char(x // 7 % 256) .. doc:sub(pos + 1)
        local ok, err = pcall(json.decode, bad)
        if not ok then
          local at = tonumber(err:match("^cozy%.json: .- at byte (%d+)$"))
          assert(at and at >= 1 and at <= #bad + 1, err)
        end
      end
    end)

    it("checks its argument like any Lua function", function()
      assert.has_error(function() json.decode({}) end, "bad argument #1 to 'decode' (string expected, got table)")
    end)
  end)

  describe("encode errors", function()
    local function assert_encode_error(pattern, v)
      local ok, err = pcall(json.encode, v)
      assert.is_false(ok, "expected an error")
      assert.matches("^cozy%.json: cannot encode " .. pattern, err)
    end

    it("refuses values JSON cannot hold", function()
      assert_encode_error("a function value at %(root%)", print)
      assert_encode_error("a function value at spec%.run", { spec = { run = print } })
      assert_encode_error("a thread value at %[2%]", { 1, coroutine.create(print) })
      assert_encode_error("a userdata value at f", { f = io.stdout })
      assert_encode_error("a nil value %(json%.null is JSON's null%) at %(root%)", nil)
      assert_encode_error("NaN at x", { x = 0 / 0 })
      assert_encode_error("an infinite number at x", { x = math.huge })
      assert_encode_error("an infinite number at x", { x = -math.huge })
    end)

    it("refuses tables that are neither an array nor an object", function()
      assert_encode_error('a table with mixed keys %(1%.%. and key "x"%)', { 1, 2, x = 3 })
      assert_encode_error('a table with mixed keys %(', { x = 3, y = 4, [1] = 1 }) -- which key comes first is the hash's choice
      assert_encode_error("a sparse array %(3 elements, highest index 4", { 1, 2, nil, 4 })
      assert_encode_error("a table with mixed keys %(1%.%. and key 0%)", { [0] = "a", "b" })
      assert_encode_error("a table with mixed keys %(1%.%. and key 1%.5", { [1] = 1, [1.5] = 2 })
      assert_encode_error("a table with mixed keys %(strings and a boolean key%)", { a = 1, [true] = 2 })
      assert_encode_error('an array %(json%.array_mt%) with key "x" at items%[1%]', { items = { json.array({ 1, x = 2 }) } })
      assert_encode_error("an object %(json%.object_mt%) with key 1", json.object({ "a" }))
      local decoded = json.decode('{"spec":{"volumes":[{"name":"a"}]}}')
      decoded.spec.volumes[3] = { name = "c" }
      assert_encode_error("a sparse array %(2 elements, highest index 3; json%.null fills a hole%) at spec%.volumes", decoded)
    end)

    it("refuses cycles and nesting deeper than 1000", function()
      local t = {}
      t.self = t
      assert_encode_error("a table nested deeper than 1000 levels %(a cycle%?%) at %.%.%..*self%.self", t)
      local a = {}
      a[1] = { a }
      assert_encode_error("a table nested deeper than 1000", a)
      local deep = {}
      for _ = 1, 999 do deep = { deep } end -- 1000 levels
      assert.equal(("["):rep(999) .. "{}" .. ("]"):rep(999), json.encode(deep))
      assert_encode_error("a table nested deeper than 1000", { deep })
    end)

    it("refuses strings that are not UTF-8, naming the byte", function()
      assert_encode_error("a string with invalid UTF%-8 %(byte 3 of it%) at name", { name = "ab\xC0\xAFcd" })
      assert_encode_error("a string with invalid UTF%-8 %(byte 1 of it%) at %[1%]", { "\xED\xA0\x80" })
      assert_encode_error("a string with invalid UTF%-8 %(byte 2 of it%) at %(root%)", "a\xE2\x82")
      assert_encode_error('a string with invalid UTF%-8 %(byte 1 of it%) at %["\\xFF"%]$', { ["\xFF"] = 1 })
      assert_encode_error('a function value at %["a%.b"%]%["\\x22é\\x0A"%]$', { ["a.b"] = { ['"é\n'] = print } })
    end)

    it("leaves nothing behind after an error (the next encode is clean)", function()
      assert.has_error(function() json.encode({ a = { b = { c = print } } }) end,
        "cozy.json: cannot encode a function value at a.b.c")
      assert.equal('{"a":{"b":{"c":1}}}', json.encode({ a = { b = { c = 1 } } }))
    end)
  end)

  describe("raw lua-cjson 2.1.0 (why this layer exists)", function()
    -- If these start failing, Debian's cjson changed: revisit vendor/README.md.
    it("still has the three defects cozy.json closes", function()
      assert.equal("{}", cjson.encode(cjson.decode("[]")))
      assert.equal("float", math.type(cjson.decode("1")))
      assert.equal("1.2345678901235e+16", cjson.encode(12345678901234567))
    end)
  end)
end)
