-- cozy.yaml's emitter in C (cozy.yaml_emitter, behind yaml.lines and
-- yaml.encode) against the Lua one it replaces on the plan's path
-- (yaml.lines_lua, kept as the definition): the same lines, byte for byte,
-- on every object of migration 59's benchmark fleet and on random documents
-- made of the strings, keys and numbers YAML is particular about; the same
-- error where the Lua one raises.
local files = require("spec.helpers").files
local json = require "cozy.json"
local patch = require "cozy.kube.patch"
local yaml = require "cozy.yaml"

-- Random rounds: the plain build runs them all (equality is its job); under
-- AddressSanitizer (hack/test.sh sets ASAN_OPTIONS) a tenth, enough to walk
-- every path of the C with the sanitizer watching, at a tenth of its time.
local ROUNDS = os.getenv("ASAN_OPTIONS") and 2000 or 20000

-- The first line where lines a and b differ ("line N: NAME_A %q, NAME_B %q"), or nil.
local function line_apart(a, b, name_a, name_b)
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then
      return ("line %d: %s %q, %s %q"):format(i, name_a, tostring(a[i]), name_b, tostring(b[i]))
    end
  end
  return nil
end

-- The first line where the two emitters differ, or nil.
local function first_difference(v)
  local ok_c, c = pcall(yaml.lines, v)
  local ok_lua, l = pcall(yaml.lines_lua, v)
  if ok_c ~= ok_lua then
    return ("C %s, Lua %s: %s / %s"):format(ok_c and "ok" or "raised", ok_lua and "ok" or "raised",
      tostring(ok_c and "" or c), tostring(ok_lua and "" or l))
  end
  if not ok_c then
    if c ~= l then return ("errors differ: %q / %q"):format(c, l) end
    return nil
  end
  local apart = line_apart(c, l, "C", "Lua")
  if apart then return apart end
  if yaml.encode(v) ~= table.concat(l, "\n") .. "\n" then
    return "encode differs from the Lua lines"
  end
  return nil
end

describe("cozy.yaml_emitter on migration 59's fleet", function()
  it("writes every VM and VMI of a 2,000-VM fleet as the Lua emitter does, whole and as a plan shows them", function()
    local list = json.decode(files.fleet_json(2000))
    assert.is_true(#list.items > 4000) -- the VMs, their VMIs and more
    local differ = {}
    for _, o in ipairs(list.items) do
      local d = first_difference(o)
      if d == nil then
        -- as the plan's diff shows it: without what the server sets
        for _, k in ipairs { "managedFields", "resourceVersion", "uid", "creationTimestamp", "generation" } do
          o.metadata[k] = nil
        end
        d = first_difference(o)
      end
      if d ~= nil and #differ < 5 then differ[#differ + 1] = o.metadata.name .. ": " .. d end
    end
    assert.same({}, differ)
  end)
end)

-- Random documents --------------------------------------------------------

-- pieces YAML reads as something else, or must quote, escape or fold
local PIECES = { "true", "False", "y", "NO", "on", "Off", "null", "~", "", "<<", ".nan", "-.Inf", "123", "-12",
  "+7", "0x1F", "0o17", "017", "08", "1_000", "0b101", "-0b1", "1.5", "1e3", "1e+3", ".5", "-.5e-2", "1.", "2024-01-01",
  "2024-1-2", "2024-01-01T10:20:30Z", "2024-1-2t3:04:05.5+02:00", "2024-01-01 10:20:30", "2024-13-01",
  "2024-01-01T25:00:00Z", "2024-01-01T10:20:30.123-05:00", "1:20", "190:20:30.15", "1_0:5_9", "1:60", "-1:2:3",
  "- ", "-", "--", "---", "...", "? ", "?", ":", ": ", "a: b", "a:", "#", " #", "a#b", "*", "&", "!", "%", "@", "`",
  "'", "\"", "\\", "[", "]", "{", "}", ",", "|", ">", " ", "  ", "\n", "\n\n", " \n", "\n ", "\t", "\r", "\27",
  "\0", "\127", "é", "wörld", "😀", "\194\160", "\194\133", "\226\128\168", "\239\187\191", "\255", "Gi", "10Gi",
  "x", "X", "word", "kubevirt.io/v1", "a_b", "a.b", "a-b", "a/b", "0", "00", "-0", "1.2.3", "v1.2", "10.0.0.1",
  "e", "E", "T", "Z", "_", ".", "+", "0b", "0x", "0o", ("word "):rep(12), ("x"):rep(90), ("a b"):rep(30),
  ("'s "):rep(30), ("\\ "):rep(40), ("  "):rep(45) }

-- A random string of 0 - `count` pieces.
local function random_string(count)
  local parts = {}
  for i = 1, math.random(0, count) do parts[i] = PIECES[math.random(#PIECES)] end
  return table.concat(parts)
end

local FLOATS = { 1.5, -0.0, 0.0, 3.0, -2.0, 1e300, -1e-300, 2 ^ 63, -(2 ^ 63), 2 ^ 62, 1 / 0, -1 / 0, 0 / 0, 0.1,
  123456789.125, 1e21, 5e-324 }

local random_value

local function random_table(depth)
  local kind = math.random(6)
  local t = {}
  local n = math.random(0, 5)
  if kind <= 2 then
    for i = 1, n do t[i] = random_value(depth + 1) end
    return kind == 1 and json.array(t) or t
  elseif kind <= 4 then
    for _ = 1, n do
      local k = math.random(4) == 1 and random_string(6) or PIECES[math.random(#PIECES)] .. random_string(2)
      if utf8.len(k) then t[k] = random_value(depth + 1) end
    end
    return kind == 3 and json.object(t) or t
  elseif kind == 5 then
    -- keys that are not strings, in a table nobody marked: a mapping of numbers
    for _ = 1, n do t[math.random(2, 40)] = random_value(depth + 1) end
    return t
  end
  return math.random(2) == 1 and json.array() or json.object()
end

function random_value(depth)
  local r = math.random(10)
  if depth < 5 and r <= 4 then return random_table(depth) end
  if r == 5 then return math.random(-1000, 1000) end
  if r == 6 then return FLOATS[math.random(#FLOATS)] end
  if r == 7 then return ({ true, false, json.null })[math.random(3)] end
  return random_string(8)
end

describe("cozy.yaml_emitter on random documents", function()
  it("writes 20,000 (under ASan 2,000) random documents of YAML's troublesome strings, keys and numbers as the Lua emitter does", function()
    math.randomseed(36)
    local differ = {}
    for i = 1, ROUNDS do
      local doc = random_table(0)
      local d = first_difference(doc)
      if d ~= nil and #differ < 5 then
        local ok, text = pcall(json.encode, doc) -- (not with an infinity or a NaN in it)
        differ[#differ + 1] = ("document %d: %s\n%s"):format(i, d, ok and text or "")
      end
    end
    assert.same({}, differ)
  end)

  it("folds long plain, single- and double-quoted strings at the same spaces, at every column they start at", function()
    local differ = {}
    for key_len = 1, 40 do
      for _, s in ipairs { ("word "):rep(30) .. "end", ("it's "):rep(30), "- " .. ("a  b "):rep(30),
        "1:" .. ("2 "):rep(50), ("\\ "):rep(45) .. "x", "true " .. ("x "):rep(50), "a " .. ("y"):rep(90) .. " z" } do
        local doc = json.object { [("k"):rep(key_len)] = s, list = json.array { s, json.array { s } } }
        local d = first_difference(doc)
        if d ~= nil and #differ < 5 then differ[#differ + 1] = d end
      end
    end
    assert.same({}, differ)
  end)

  it("orders keys with runs of digits as the Lua emitter's table.sort does, up to and past 100 keys", function()
    math.randomseed(3636)
    local parts = { "a", "b", "A", "-", ".", "_", "/", "0", "00", "1", "01", "007", "9", "10", "99", "100",
      "18446744073709551616", "x0", "0x", " ", "~", ":" }
    local differ = {}
    for i = 1, 600 do
      local t = json.object()
      for _ = 1, math.random(2, i % 3 == 0 and 130 or 40) do
        local k = {}
        for j = 1, math.random(1, 4) do k[j] = parts[math.random(#parts)] end
        t[table.concat(k)] = i
      end
      local d = first_difference(t)
      if d ~= nil and #differ < 5 then differ[#differ + 1] = d end
    end
    assert.same({}, differ)
  end)

  it("raises the Lua emitter's error on a table nested too deep and on a cycle", function()
    local deep = json.object()
    local at = deep
    for _ = 1, json.max_depth + 1 do
      at.x = json.object { y = 1 }
      at = at.x
    end
    local cycle = json.object { a = 1 }
    cycle.self = json.array { cycle }
    for _, doc in ipairs { deep, cycle } do
      local ok, err = pcall(yaml.lines, doc)
      assert.is_false(ok)
      assert.equal("cozy.yaml: a table nested deeper than " .. json.max_depth .. " levels", err)
      assert.is_nil(first_difference(doc))
    end
  end)
end)

-- The memo (yaml.memo): a table met again at the same indentation is not
-- emitted again, its lines taken from where it was first written. ------

-- lines without a memo, then with one shared by both documents, must agree
local function memo_difference(first, second)
  local memo = yaml.memo()
  for n, doc in ipairs { first, second } do
    local with, without = yaml.lines(doc, memo), yaml.lines_lua(doc)
    local apart = line_apart(with, without, "memo", "Lua")
    if apart then return ("document %d, %s"):format(n, apart) end
  end
  return nil
end

describe("cozy.yaml_emitter's memo", function()
  it("writes a plan's before, which shares the after's tables, as without it, for a 400-VM fleet", function()
    local list = json.decode(files.fleet_json(400))
    local differ, vms = {}, 0
    for _, o in ipairs(list.items) do
      if o.kind == "VirtualMachine" then
        vms = vms + 1
        for _, k in ipairs { "managedFields", "resourceVersion", "uid", "creationTimestamp", "generation" } do
          o.metadata[k] = nil
        end
        -- the before as the plan makes it: the after patched back, its
        -- untouched subtrees the after's own tables
        local after = json.copy(o)
        table.insert(after.spec.template.spec.volumes, json.object { name = "copied", dataVolume = { name = "x" } })
        local ops = json.diff(after, o)
        local before = patch.json_patch(after, ops, true)
        assert.equal(after.spec.template.spec.domain, before.spec.template.spec.domain)
        local d = memo_difference(after, before)
        if d ~= nil and #differ < 5 then differ[#differ + 1] = o.metadata.name .. ": " .. d end
      end
    end
    assert.is_true(vms >= 400)
    assert.same({}, differ)
  end)

  it("writes random documents whose subtrees recur at other indentations and in sequences as without it", function()
    math.randomseed(5959)
    local differ = {}
    for i = 1, ROUNDS // 10 do
      local t = random_table(1)
      if next(t) ~= nil then
        local literal = json.object { text = "line one\nline two\n", t = t }
        local first = json.object { a = t, b = json.object { c = t, d = json.object { e = literal } },
          l = json.array { t, json.object { x = t }, json.array { literal } } }
        local second = json.array { json.object { a = t }, literal, t, json.object { deeper = first } }
        local d = memo_difference(first, second)
        if d ~= nil and #differ < 5 then differ[#differ + 1] = ("round %d: %s"):format(i, d) end
      end
    end
    assert.same({}, differ)
  end)

  it("takes a table's lines from where it was first written (so it must not change meanwhile)", function()
    -- the contract's edge shows that the lines are taken, not made again
    local shared = json.object { key = "first" }
    local memo = yaml.memo()
    assert.same({ "a:", "  key: first" }, yaml.lines(json.object { a = shared }, memo))
    shared.key = "changed"
    assert.same({ "b:", "  key: first" }, yaml.lines(json.object { b = shared }, memo))
    -- at another indentation it is written anew
    assert.same({ "c:", "  d:", "    key: changed" }, yaml.lines(json.object { c = json.object { d = shared } }, memo))
    assert.same({ "b:", "  key: changed" }, yaml.lines(json.object { b = shared }))
  end)

  it("refuses a memo that is not one", function()
    local ok, err = pcall(yaml.lines, json.object { a = 1 }, {})
    assert.is_false(ok)
    assert.matches("cozy.yaml_emitter.memo expected", err, 1, true)
  end)
end)
