-- The difference a change sends (patch.diff), lean projections, cozy.obj and
-- the plan/run wording: pure functions, checked on values.
local json = require "cozy.json"
local kube = require "cozy.kube"
local obj = require "cozy.obj"
local patch = require "cozy.kube.patch"
local context = require "cozy.runner.context"

local function ops_of(a, b)
  local ops = patch.diff(a, b)
  -- the difference applied to a must give b, whatever it is
  assert.is_true(patch.equal(patch.json_patch(a, ops), b), json.encode(ops))
  return ops
end

describe("patch.diff", function()
  it("is empty for equal values", function()
    assert.same({}, ops_of(json.decode('{"a":[1,{"b":2}]}'), json.decode('{"a":[1,{"b":2}]}')))
  end)

  it("appends to a list with /- adds, never replacing it", function()
    local a = json.decode('{"spec":{"volumes":[{"name":"a"}]}}')
    local b = patch.deepcopy(a)
    b.spec.volumes[2] = { name = "b" }
    b.spec.volumes[3] = { name = "c" }
    assert.same({ { op = "add", path = "/spec/volumes/-", value = { name = "b" } },
                  { op = "add", path = "/spec/volumes/-", value = { name = "c" } } }, ops_of(a, b))
  end)

  it("creates an absent list, and absent parents, with one add", function()
    local a = json.decode('{"spec":{"template":{"spec":{}}}}')
    local b = patch.deepcopy(a)
    obj.append(b, "spec.template.spec.domain.devices.disks", { { name = "d" } })
    assert.same({ { op = "add", path = "/spec/template/spec/domain",
      value = { devices = { disks = { { name = "d" } } } } } }, ops_of(a, b))
    assert.equal('[{"name":"d"}]', json.encode(b.spec.template.spec.domain.devices.disks))
  end)

  it("changes, removes and shortens where the difference is", function()
    local a = json.decode('{"m":{"x":1,"y":2,"a/b":3},"l":[1,2,3,4]}')
    local b = json.decode('{"m":{"x":5,"a/b":3,"z":null},"l":[1,9]}')
    assert.same({
      { op = "replace", path = "/l/1", value = 9 },
      { op = "remove", path = "/l/3" },
      { op = "remove", path = "/l/2" },
      { op = "replace", path = "/m/x", value = 5 },
      { op = "remove", path = "/m/y" },
      { op = "add", path = "/m/z", value = json.null },
    }, ops_of(a, b))
  end)

  it("escapes keys as RFC 6901 pointers", function()
    local a = json.decode('{"metadata":{"labels":{}}}')
    local b = json.decode('{"metadata":{"labels":{"platform.cozystack.io/x~y":"1"}}}')
    assert.same({ { op = "add", path = "/metadata/labels/platform.cozystack.io~1x~0y", value = "1" } }, ops_of(a, b))
  end)

  it("replaces a value whose type changed (null to a list)", function()
    local a = json.decode('{"v":null}')
    local b = patch.deepcopy(a)
    obj.append(b, "v", { 1 })
    assert.same({ { op = "replace", path = "/v", value = json.decode("[1]") } }, ops_of(a, b))
  end)
end)

-- The Lua versions json.copy and json.diff replaced: the oracle.
local reference = dofile("spec/fixtures/json/lua_copy_diff.lua")

-- Seeded random values (spec/fixtures/json/random_values.lua) and edits of
-- them: keys that need escaping, an integer turned into the same float,
-- null, [] and {}, elements appended, dropped and changed, types changed.
local function random_pairs(seed)
  local values = dofile("spec/fixtures/json/random_values.lua").new(seed)
  local rand = values.rand
  local keys = { "a", "b", "name", "x/y", "m~n", "", "~1", "volumes", "Z", "é" }
  local function edit(v)
    if type(v) ~= "table" or rand(4) == 1 then
      local c = rand(4)
      if c == 1 then return values.value() end
      if c == 2 and math.type(v) == "integer" then return v + 0.0 end -- the same JSON number
      if c == 3 then return rand(2) == 1 and json.array {} or json.object {} end
      return v
    end
    if getmetatable(v) == json.array_mt then
      local what = rand(4)
      if what == 1 then v[#v + 1] = values.value()
      elseif what == 2 and #v > 0 then v[#v] = nil
      elseif #v > 0 then local i = rand(#v) v[i] = edit(v[i]) end
    else
      local k = keys[rand(#keys)]
      if rand(4) == 1 then v[k] = nil else v[k] = edit(v[k] == nil and values.value() or v[k]) end
    end
    return v
  end
  return values, edit
end

describe("json.copy and json.diff", function()
  it("give what the Lua versions gave, op for op, on 3,000 random pairs", function()
    local values, edit = random_pairs(59)
    local changed = 0
    for _ = 1, 3000 do
      local a = values.value()
      local b = json.copy(a)
      for _ = 1, 3 do b = edit(b) end
      local want, got = reference.diff(a, b), json.diff(a, b)
      assert.same(want, got)
      assert.equal(json.array_mt, getmetatable(got))
      if #got > 0 then changed = changed + 1 end
      -- applied to a, the ops give b
      assert.is_true(patch.equal(patch.json_patch(a, got), b), json.encode(got))
    end
    assert.is_true(changed > 1500, "too few pairs differ: " .. changed) -- the edits do change things
  end)

  it("copies deep: equal, sharing no table, marks kept", function()
    local values = random_pairs(7)
    local function disjoint(x, y)
      if type(x) ~= "table" then return true end
      if x == y or getmetatable(x) ~= getmetatable(y) then return false end
      for k, v in pairs(x) do if not disjoint(v, y[k]) then return false end end
      return true
    end
    for _ = 1, 500 do
      local v = values.value()
      local c = json.copy(v)
      assert.same(reference.deepcopy(v), c)
      assert.is_true(disjoint(v, c))
      assert.equal(json.encode(v), json.encode(c))
    end
    -- a metatable other than the markers is behaviour, not data: left behind
    local closed = 0
    local odd = setmetatable({ a = json.array { 1 } }, { __gc = function() closed = closed + 1 end })
    local plain = json.copy(odd)
    assert.is_nil(getmetatable(plain))
    assert.equal(json.array_mt, getmetatable(plain.a))
    assert.equal(json.encode(odd), json.encode(plain))
    plain = nil -- luacheck: ignore
    collectgarbage()
    assert.equal(0, closed)
    local s = {}
    assert.equal("x", json.copy("x"))
    assert.equal(json.null, json.copy(json.null))
    assert.is_false(rawequal(json.copy(s), s))
  end)

  it("copies the values of the ops: b may change after", function()
    local a = json.decode('{"v":[]}')
    local b = json.decode('{"v":[{"name":"x"}]}')
    local ops = json.diff(a, b)
    b.v[1].name = "changed"
    assert.equal("x", ops[1].value.name)
  end)

  it("orders non-string keys by their text, as the Lua version did", function()
    local a = { [1] = "a", [10] = "b", x = 1 }
    local b = { [1] = "a", [2] = "c", [10] = "d", x = 2, [true] = 3 }
    setmetatable(a, json.object_mt)
    setmetatable(b, json.object_mt)
    assert.same(reference.diff(a, b), json.diff(a, b))
    assert.same({ "/10", "/2", "/true", "/x" }, (function(ops)
      local paths = {}
      for i, op in ipairs(ops) do paths[i] = op.path end
      return paths
    end)(json.diff(a, b)))
  end)

  it("refuses a cycle with a clear error, not a C stack overflow", function()
    local t = {}
    t.self = t
    local ok, err = pcall(json.copy, t)
    assert.is_false(ok)
    assert.matches("cozy.json: cannot copy a table nested deeper than 1000 levels %(a cycle%?%)", err)
    local u = { self = { self = {} } }
    u.self.self.self = u
    ok, err = pcall(json.diff, t, u)
    assert.is_false(ok)
    assert.matches("cozy.json: cannot diff a table nested deeper than 1000 levels", err)
    -- a cycle in a value an op carries, and depth counted from the root, op values included
    ok, err = pcall(json.diff, {}, { x = t })
    assert.is_false(ok)
    assert.matches("cozy.json: cannot diff a table nested deeper than 1000 levels", err)
    local function nest(n, v) for _ = 1, n do v = json.array { v } end return v end
    assert.has_error(function() json.diff(nest(999, 1), nest(999, nest(2, 1))) end,
      "cozy.json: cannot diff a table nested deeper than 1000 levels (a cycle?)")
    assert.equal(1, #json.diff(nest(998, 1), nest(998, nest(1, 1))))
    -- as deep as decode allows still works
    local deep = json.decode(("["):rep(1000) .. ("]"):rep(1000))
    assert.equal(json.encode(deep), json.encode(json.copy(deep)))
    assert.same({}, json.diff(deep, json.copy(deep)))
  end)
end)

describe("lean lists", function()
  local vm = json.decode([[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
    "metadata":{"name":"vm","namespace":"ns","uid":"u","resourceVersion":"7","annotations":{"big":"x"},
      "managedFields":[{"manager":"m"}]},
    "spec":{"running":true,"template":{"spec":{"domain":{"cpu":{"cores":2},"devices":{"disks":[{"name":"a"}]}},
      "volumes":[]}}},"status":{"conditions":[{"type":"Ready"}]}}]])

  it("keeps the identity and exactly the paths asked, presence included", function()
    local tree = kube.projection({ "spec.template.spec.volumes", "spec.template.spec.domain.devices.disks",
      "spec.template.spec.domain.devices.interfaces", "status.volumeRequests" })
    local lean = kube.prune(vm, tree)
    assert.same({ apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "vm", namespace = "ns", uid = "u", resourceVersion = "7" },
      spec = { template = { spec = { domain = { devices = { disks = { { name = "a" } } } }, volumes = {} } } },
      status = {} }, lean)
    -- an empty list stays a list, an absent one absent
    assert.equal("[]", json.encode(lean.spec.template.spec.volumes))
    assert.is_nil(lean.spec.template.spec.domain.devices.interfaces)
  end)

  it("prunes as the decoder projects: \"*\" keeps an object's other keys, false leaves one out", function()
    local tree = { ["*"] = true, metadata = { ["*"] = true, managedFields = false } }
    local lean = kube.prune(vm, tree)
    assert.is_nil(lean.metadata.managedFields)
    assert.equal("x", lean.metadata.annotations.big)
    assert.equal(json.encode(json.decode(json.encode(vm), tree)), json.encode(lean))
  end)

  it("gives the same difference as the full object for what it keeps", function()
    local lean = kube.prune(vm, kube.projection({ "spec.template.spec.volumes", "spec.template.spec.domain.devices.disks" }))
    local function edit(o)
      local c = patch.deepcopy(o)
      obj.append(c, "spec.template.spec.volumes", { { name = "v" } })
      obj.append(c, "spec.template.spec.domain.devices.disks", { { name = "v" } })
      return patch.diff(o, c)
    end
    assert.same(edit(vm), edit(lean))
  end)
end)

describe("cozy.obj", function()
  local vmi = json.decode([[{"metadata":{"name":"a","namespace":"n","ownerReferences":[
    {"apiVersion":"v1","kind":"Pod","name":"p","controller":false},
    {"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","name":"a","uid":"u1","controller":true}]},
    "spec":{"volumes":null}}]])

  it("reads paths without raising", function()
    assert.equal("a", obj.get(vmi, "metadata.name"))
    assert.equal("p", obj.get(vmi, "metadata.ownerReferences.1.name"))
    assert.is_nil(obj.get(vmi, "spec.volumes"))          -- null reads as absent
    assert.is_nil(obj.get(vmi, "spec.volumes.x.y"))
    assert.same({}, obj.list(vmi, "spec.volumes"))
    assert.equal("n/a", obj.key(vmi))
    assert.equal("c", obj.key({ metadata = { name = "c" } }))
    assert.same({ metadata = { name = "a", namespace = "n" } }, obj.identity(vmi))
    assert.same({ apiVersion = "v1", kind = "Pod", metadata = { name = "p", uid = "u" } },
      obj.identity({ apiVersion = "v1", kind = "Pod", metadata = { name = "p", uid = "u", labels = { a = "b" } }, spec = {} }))
  end)

  it("finds the controller reference, by kind and group", function()
    assert.equal("u1", obj.controller_of(vmi).uid)
    assert.equal("u1", obj.controller_of(vmi, "VirtualMachine", "kubevirt.io").uid)
    assert.is_nil(obj.controller_of(vmi, "VirtualMachine", "other.io"))
    assert.is_nil(obj.controller_of({ metadata = {} }))
  end)

  it("indexes a list and compares as Kubernetes does", function()
    local idx = obj.index_by({ vmi, { metadata = { name = "b", namespace = "n" } } })
    assert.equal(vmi, idx["n/a"])
    local by_name = obj.index_by({ { name = "x", n = 1 }, { name = "y" }, { n = 3 } }, "name")
    assert.same({ x = { name = "x", n = 1 }, y = { name = "y" } }, by_name)
    assert.equal(vmi, obj.index_by({ vmi }, "metadata.name").a)
    assert.is_true(obj.equal({ a = 1, hotpluggable = false }, { a = 1 }))
    assert.is_true(obj.equal({ s = "" , n = 0 }, {}))
    assert.is_false(obj.equal({ a = 1 }, { a = 2 }))
    assert.equal("x,y", obj.names({ { name = "x" }, { name = "y" } }))
  end)
end)

describe("plan/run wording", function()
  it("picks the run or the plan form", function()
    assert.equal("VM a: adding x", context.worded("VM a: {adding|would add} x", "run"))
    assert.equal("VM a: would add x", context.worded("VM a: {adding|would add} x", "plan"))
    assert.equal("no braces", context.worded("no braces", "plan"))
  end)
end)
