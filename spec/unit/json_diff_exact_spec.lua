-- json.diff(a, b, true), the exact mode: the ops, or nil when they would not
-- give b back exactly as json.encode prints it. The rehearsal's overlay
-- keeps an object's before as the patch from the object back to it only
-- when this gives one (cozy.kube.overlay): ops that print another before
-- would put a wrong line in the plan's diff.
local json = require "cozy.json"
local patch = require "cozy.kube.patch"
local random_values = dofile("spec/fixtures/json/random_values.lua")

-- A random change somewhere in a copy of v: a value replaced, a key added
-- or removed, an element appended or dropped; an integer made a float.
local function mutated(v, values)
  local c = json.copy(v)
  if type(c) ~= "table" then
    if math.type(c) == "integer" then return c + 0.0 end
    return values.value()
  end
  local node = c
  while true do
    local keys = {}
    for k in pairs(node) do keys[#keys + 1] = k end
    table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
    local k = keys[#keys > 0 and values.rand(#keys) or 1]
    if k == nil or type(node[k]) ~= "table" or values.rand(3) == 1 then
      local r = values.rand(4)
      if getmetatable(node) == json.array_mt then
        if r == 1 and #node > 0 then node[#node] = nil else node[#node + 1] = values.value() end
      elseif r == 1 and k ~= nil then node[k] = nil
      elseif r == 2 then node["added-" .. values.rand(100)] = values.value()
      elseif r == 3 and k ~= nil and math.type(node[k]) == "integer" then node[k] = node[k] + 0.0
      elseif k ~= nil then node[k] = values.value() end
      return c
    end
    node = node[k]
  end
end

-- What the ops give back from a, as text.
local function back(a, ops)
  return json.encode(patch.json_patch(a, ops))
end

describe("json.diff's exact mode", function()
  it("gives ops exactly when they give b back as json.encode prints it, on seeded random values", function()
    local values = random_values.new(5959)
    local exact, refused = 0, 0
    for _ = 1, 3000 do
      local a = values.value()
      local b = mutated(a, values)
      if values.rand(4) == 1 then a, b = b, a end
      local ops = json.diff(a, b, true)
      local plain = json.diff(a, b)
      if ops ~= nil then
        assert.equal(json.encode(b), back(a, ops))
        assert.equal(json.encode(plain), json.encode(ops)) -- the same ops as without the mode
        exact = exact + 1
      else
        -- every table here is marked: nil only where the plain ops go wrong
        assert.are_not.equal(json.encode(b), back(a, plain))
        refused = refused + 1
      end
    end
    assert.is_true(exact > 2000 and refused > 50, ("exact %d, refused %d"):format(exact, refused))
  end)

  it("says nil for what the plain diff takes as equal: 1 and 1.0, 0.0 and -0.0, [] and {}", function()
    assert.is_nil(json.diff({ n = 1 }, { n = 1.0 }, true))
    assert.is_nil(json.diff(json.object { n = 0.0 }, json.object { n = -0.0 }, true))
    assert.is_nil(json.diff(json.object { e = json.array {} }, json.object { e = json.object {} }, true))
    assert.is_nil(json.diff(json.array { 1 }, json.array { 1.0 }, true))
    -- the plain diff sees nothing there
    assert.equal(0, #json.diff({ n = 1 }, { n = 1.0 }))
    -- a type or kind that changed is a replace, exact
    local ops = json.diff(json.object { e = json.array {} }, json.object { e = json.object { k = 1 } }, true)
    assert.equal('[{"op":"replace","path":"/e","value":{"k":1}}]', json.encode(ops))
    assert.equal(0, #json.diff(json.object { a = 1 }, json.object { a = 1 }, true))
  end)

  it("says nil, conservatively, where a table kept from a has another metatable than b's", function()
    local a, b = json.object { m = json.object { x = 1 } }, json.object { m = { x = 1, y = 2 } }
    assert.equal(json.encode(b), back(a, json.diff(a, b))) -- though these would print alike
    assert.is_nil(json.diff(a, b, true))
  end)
end)
