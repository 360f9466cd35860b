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

-- The Lua versions json.copy and json.diff replaced (core/json_value.c), kept
-- here as the oracle: the C ones must give the same ops, in the same order
-- (on JSON values: json.copy keeps only the markers' metatables).
local reference = {}
do
  local function is_array(t)
    local mt = getmetatable(t)
    if mt ~= nil and mt == json.array_mt then return true end
    if mt ~= nil and mt == json.object_mt then return false end
    return rawget(t, 1) ~= nil
  end
  local function deepcopy(v)
    if type(v) ~= "table" then return v end
    local c = {}
    for k, x in pairs(v) do c[k] = deepcopy(x) end
    return setmetatable(c, getmetatable(v))
  end
  local function escape(token)
    return (tostring(token):gsub("~", "~0"):gsub("/", "~1"))
  end
  local function by_text(x, y) return tostring(x) < tostring(y) end
  local function diff(a, b, path, ops)
    if a == b then return ops end
    local ta, tb = type(a) == "table", type(b) == "table"
    if ta and tb and next(a) == nil and next(b) == nil then return ops end
    local array = ta and is_array(a)
    if not (ta and tb) or array ~= is_array(b) then
      ops[#ops + 1] = { op = "replace", path = path, value = deepcopy(b) }
      return ops
    end
    if array then
      local common = math.min(#a, #b)
      for i = 1, common do diff(a[i], b[i], path .. "/" .. (i - 1), ops) end
      for i = common + 1, #b do ops[#ops + 1] = { op = "add", path = path .. "/-", value = deepcopy(b[i]) } end
      for i = #a, common + 1, -1 do ops[#ops + 1] = { op = "remove", path = path .. "/" .. (i - 1) } end
      return ops
    end
    local keys, strings = {}, true
    for k, x in pairs(a) do
      if x ~= b[k] then keys[#keys + 1] = k; strings = strings and type(k) == "string" end
    end
    for k in pairs(b) do
      if a[k] == nil then keys[#keys + 1] = k; strings = strings and type(k) == "string" end
    end
    if strings then table.sort(keys) else table.sort(keys, by_text) end
    for _, k in ipairs(keys) do
      local p = path .. "/" .. escape(k)
      if b[k] == nil then
        ops[#ops + 1] = { op = "remove", path = p }
      elseif a[k] == nil then
        ops[#ops + 1] = { op = "add", path = p, value = deepcopy(b[k]) }
      else
        diff(a[k], b[k], p, ops)
      end
    end
    return ops
  end
  reference.deepcopy = deepcopy
  function reference.diff(a, b) return diff(a, b, "", {}) end
end

-- Seeded random JSON values and edits of them: keys that need escaping, ints
-- and floats that are equal, null, empty arrays and objects, nesting.
local function random_values(seed)
  local rnd = { state = seed }
  local function int(n)
    rnd.state = (rnd.state * 1103515245 + 12345) % 2147483648
    return rnd.state % n + 1
  end
  local keys = { "a", "b", "name", "x/y", "m~n", "", "~1", "volumes", "Z", "é" }
  local function value(depth)
    local kind = int(depth > 3 and 6 or 9)
    if kind == 1 then return int(5) - 1
    elseif kind == 2 then return (int(5) - 1) + 0.0
    elseif kind == 3 then return keys[int(#keys)]
    elseif kind == 4 then return json.null
    elseif kind == 5 then return int(2) == 1
    elseif kind == 6 then return int(2) == 1 and json.array {} or json.object {}
    elseif kind == 7 then
      local t = json.array {}
      for i = 1, int(4) do t[i] = value(depth + 1) end
      return t
    else
      local t = int(3) == 1 and {} or json.object {}
      for _ = 1, int(5) do t[keys[int(#keys)]] = value(depth + 1) end
      return t
    end
  end
  local function edit(v, depth)
    if type(v) ~= "table" or int(4) == 1 then return int(3) == 1 and value(depth) or v end
    if getmetatable(v) == json.array_mt then
      local what = int(4)
      if what == 1 then v[#v + 1] = value(depth + 1)
      elseif what == 2 and #v > 0 then v[#v] = nil
      elseif #v > 0 then local i = int(#v) v[i] = edit(v[i], depth + 1) end
    else
      local k = keys[int(#keys)]
      if int(4) == 1 then v[k] = nil else v[k] = edit(v[k] == nil and value(depth + 1) or v[k], depth + 1) end
    end
    return v
  end
  return value, edit
end

describe("json.copy and json.diff", function()
  it("give what the Lua versions gave, op for op, on 3,000 random pairs", function()
    local value, edit = random_values(59)
    local changed = 0
    for _ = 1, 3000 do
      local a = value(1)
      local b = json.copy(a)
      for _ = 1, 3 do b = edit(b, 1) end
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
    local value = random_values(7)
    local function disjoint(x, y)
      if type(x) ~= "table" then return true end
      if x == y or getmetatable(x) ~= getmetatable(y) then return false end
      for k, v in pairs(x) do if not disjoint(v, y[k]) then return false end end
      return true
    end
    for _ = 1, 500 do
      local v = value(1)
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
    assert.is_false(pcall(json.diff, nest(999, 1), nest(999, nest(2, 1))))
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
