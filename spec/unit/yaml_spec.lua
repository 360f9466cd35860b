-- cozy.yaml: objects as kubectl prints them (-o yaml, kubectl diff), so a
-- plan's diff reads as kubectl's would. The same tricky objects go through
-- the real kubectl (`kubectl patch --local -o yaml`: go-yaml v2 under
-- sigs.k8s.io/yaml, no server needed) and through cozy.yaml; the two
-- outputs must be byte for byte the same.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local yaml = require "cozy.yaml"

local LONG = ("word "):rep(30)

-- strings YAML would misread, and strings it would not, as ConfigMap data
local TRICKY = {
  t = "true", f = "False", y = "y", Y = "Y", yes = "yes", no = "NO", on = "on", off = "Off", null = "null",
  tilde = "~", empty = "", int = "123", neg = "-12", hex = "0x1F", oct = "0o17", oct0 = "017", under = "1_000",
  float = "1.5", exp = "1e3", dotf = ".5", nan = ".nan", inf = "-.inf", date = "2024-01-01",
  ts = "2024-01-01T10:20:30Z", tsn = "2024-1-2T3:04:05.5+02:00", b60 = "1:20", b60b = "190:20:30.15",
  dash = "- item", dashonly = "-", dashword = "-word", colon = "a: b", colonend = "a:", colonmid = "a:b",
  hash = "# c", hashmid = "a #b", hashnospace = "a#b", star = "*", amp = "&x", bang = "!x", pct = "%x",
  at = "@x", back = "`x", quote = "'x'", dquote = "\"x\"", lead = " lead", trail = "trail ", q = "?", qx = "? x",
  br = "[a]", brace = "{a}", comma = "a, b", pipe = "|", gt = ">", dashes = "---", dots = "...",
  multi = "line1\nline2\n", multinoend = "a\nb", multi2 = "a\n\n", multilead = " a\nb\n", nl = "\n",
  spacebreak = "a \nb", tab = "a\tb", esc = "a\27b", unicode = "héllo wörld", emoji = "smile 😀",
  long = LONG, longq = "#" .. LONG, longd = "true " .. LONG, longnospace = ("x"):rep(100),
  colonlong = ("a: b "):rep(20), quoteinside = "it's", bs = "a\\b", lonelyq = "'", json = "{\"a\":1}",
  nbsp = "a\194\160b", trailingnl_space = "a\n b\n", bom = "\239\187\191x", dotword = ".hidden", plus = "+",
  plusword = "+1", exp2 = "1e+3", version = "1.2.3", ip = "10.0.0.1", semver = "v1.2", zero = "0",
  zeros = "00", minuszero = "-0", tslower = "2024-01-01t10:20:30Z", tsspace = "2024-01-01 10:20:30",
  notdate = "2024-13-01", nottime = "2024-01-01T25:00:00Z",
}

local function configmap()
  return json.object {
    apiVersion = "v1", kind = "ConfigMap",
    metadata = json.object { name = "tricky", namespace = "ns",
      -- go-yaml's key order: digit runs by value, a letter after any other character
      labels = json.object { ["app.kubernetes.io/name"] = "x", app = "y", ["a-b"] = "1", a9 = "2", a10 = "3",
        aB = "4", ab = "5", a_b = "6", A = "7", ["a.b"] = "8", a01 = "9", a1 = "10", a0 = "11" },
      annotations = json.object { ["true"] = "k", [""] = "empty key", ["a: b"] = "colon key",
        ["multi\nkey"] = "m", ["123"] = "numkey", [("k"):rep(130)] = "long key" } },
    data = json.object(TRICKY),
  }
end

local function pod()
  return json.object { apiVersion = "v1", kind = "Pod", metadata = json.object { name = "p" }, spec = json.object {
    containers = json.array { json.object { name = "c", image = "i", args = json.array { "--a", "true", "", LONG },
      ports = json.array { json.object { containerPort = 80 } }, resources = json.object {} } },
    tolerations = json.array {}, nodeSelector = json.object {},
    nested = json.array { json.array { "a", "b" }, json.array {}, json.object {}, json.array { json.object {
      k = "v", l = json.array { 1 } } } },
    floats = json.array { 1.5, 1e21, 1e6, 123456.0, 0.0001, 0.00001, 3.0, -2.25, 1e-7, 12345678.9, -0.5 },
    bools = json.array { true, false, json.null }, ints = json.array { 0, -1, 9007199254740993 } } }
end

-- kubectl's YAML of obj, printed locally
local function kubectl_yaml(obj)
  local dir = files.tmpdir("cozy-yaml")
  local path = dir .. "/obj.json"
  files.write(path, json.encode(obj))
  local out = files.capture(("%s patch --local -f %s -p '{}' --type merge -o yaml 2>&1")
    :format(files.quote(fake.kubectl_path), files.quote(path)))
  files.rm_rf(dir)
  assert(out:find("^apiVersion: "), "the real kubectl is needed (COZY_SUPPORT_BIN or KUBECTL): " .. out)
  return out
end

describe("cozy.yaml", function()
  it("prints a ConfigMap of tricky strings and keys byte for byte as kubectl does", function()
    local obj = configmap()
    assert.equal(kubectl_yaml(obj), yaml.encode(obj))
  end)

  it("prints nesting, empty collections, numbers, booleans and null as kubectl does", function()
    local obj = pod()
    assert.equal(kubectl_yaml(obj), yaml.encode(obj))
  end)

  it("quotes what plain YAML would misread, and only that", function()
    local lines = yaml.encode(json.object { data = json.object(TRICKY) })
    for _, want in ipairs { '  t: "true"', '  empty: ""', '  int: "123"', '  date: "2024-01-01"', "  dash: '- item'",
      "  colon: 'a: b'", "  hashmid: 'a #b'", "  lead: ' lead'", "  star: '*'", "  multi: |", "    line1",
      "  multinoend: |-", "  multi2: |+", '  tab: "a\\tb"', '  esc: "a\\eb"', '  emoji: "smile \\U0001F600"',
      "  colonmid: a:b", "  hashnospace: a#b", "  version: 1.2.3", "  unicode: héllo wörld",
      '  spacebreak: "a \\nb"', "  quoteinside: it's", "  lonelyq: ''''" } do
      assert.truthy(lines:find("\n" .. want .. "\n", 1, true), want .. " in:\n" .. lines)
    end
  end)

  it("sorts keys as go-yaml does", function()
    local keys = { "ab", "a10", "a9", "a-b", "aB", "A", "a_b", "a", "b1", "a.b" }
    table.sort(keys, yaml.key_less)
    assert.same({ "A", "a", "a-b", "a.b", "a_b", "a9", "a10", "aB", "ab", "b1" }, keys)
  end)

  it("folds a long string at a space past column 80 and never a literal block", function()
    local out = yaml.lines(json.object { k = LONG, m = LONG .. "x\n" })
    assert.equal("k: 'word word word word word word word word word word word word word word word word", out[1])
    assert.equal("  word word word word word word word word word word word word word word '", out[2])
    assert.equal("m: |", out[3])
    assert.equal("  " .. LONG .. "x", out[4])
  end)

  it("prints plain Lua tables: a non-empty array as a sequence, an empty table as {}", function()
    assert.equal("a:\n- x\nb: {}\nc: 1\n", yaml.encode { a = { "x" }, b = {}, c = 1 })
    assert.equal("[]\n", yaml.encode(json.array {}))
    assert.equal("{}\n", yaml.encode(json.object {}))
  end)

  describe("lines_lua with a memo (the Lua emitter, cozy.yaml_emitter's definition)", function()
    local function side(volumes)
      return json.decode('{"apiVersion":"v1","kind":"VirtualMachine","metadata":{"name":"vm","labels":{"a":"1"}},'
        .. '"spec":{"template":{"spec":{"volumes":' .. volumes .. ',"domain":{"cpu":{"cores":2}}}}},'
        .. '"status":{"conditions":[{"type":"Ready","status":"True"},{"type":"Paused","status":"False"}]}}')
    end

    it("gives each document's own lines, for tables shared between them and not", function()
      local after = side('[{"name":"a","pvc":{"claimName":"a"}},{"name":"b","pvc":{"claimName":"b"}}]')
      local before = side('[{"name":"a","pvc":{"claimName":"a"}}]')
      -- the before shares the after's untouched tables, as a plan's before does
      before.status, before.metadata = after.status, after.metadata
      before.spec.template.spec.volumes[1] = after.spec.template.spec.volumes[1]
      before.spec.template.spec.domain = after.spec.template.spec.domain
      local seen = {}
      assert.same(yaml.lines_lua(after), yaml.lines_lua(after, seen))
      assert.same(yaml.lines_lua(before), yaml.lines_lua(before, seen))
      -- a table met at another indentation or lead is emitted again
      local moved = { wrapped = { after.status }, status = after.status, list = { after.metadata } }
      assert.same(yaml.lines_lua(moved), yaml.lines_lua(moved, seen))
    end)

    it("emits a table it has seen at the same place once: its lines are taken from the first", function()
      local shared = json.decode('{"x":{"z":[1,2]}}')
      local seen = {}
      local first = yaml.lines_lua({ a = shared }, seen)
      shared.x.z[3] = 3 -- against the rule (the tables must not change): shows the lines are reused
      assert.same(first, yaml.lines_lua({ a = shared }, seen))
      assert.same({ "a:", "  x:", "    z:", "    - 1", "    - 2", "    - 3" }, yaml.lines { a = shared })
    end)

    it("reports an error as without one, and forgets the memo after it", function()
      local deep = {}
      local cur = deep
      for _ = 1, json.max_depth + 3 do
        cur.x = {}
        cur = cur.x
      end
      local _, want = pcall(yaml.lines, deep)
      local _, got = pcall(yaml.lines_lua, deep, {})
      assert.matches("nested deeper than", want)
      assert.equal(want, got)
      local seen = {}
      local t = { a = { b = 1 } }
      yaml.lines_lua(t, seen)
      t.a.b = 2
      -- no memo given: nothing remembered from the last call is used
      assert.same({ "a:", "  b: 2" }, yaml.lines_lua(t))
    end)
  end)
end)
