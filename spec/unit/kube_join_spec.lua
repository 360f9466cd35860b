-- cozy.kube.join: the keyed join and the queue a migration keeps a fleet's
-- matches in (docs/engine-api.md, "Helpers for migrations"): what they hand
-- out, in which order, and that they hold neither the lists' objects nor
-- tables of what they keep.
local join = require "cozy.kube.join"
local json = require "cozy.json"

local function object(ns, name, extra)
  local o = json.decode(json.encode { metadata = { namespace = ns, name = name }, spec = extra or {} })
  return o
end

-- A value the size of a lean VMI: a few volumes with nested fields.
local function vmi(ns, name, owner)
  local volumes = {}
  for i = 1, 6 do
    volumes[i] = { name = ("vol-%d"):format(i), persistentVolumeClaim = { claimName = ("pvc-%s-%d"):format(name, i),
      hotpluggable = true } }
  end
  return json.decode(json.encode { metadata = { namespace = ns, name = name, ownerReferences = { { name = owner } } },
    spec = { volumes = volumes }, status = { phase = "Running" } })
end

local function owner_key(o) return o.metadata.namespace .. "/" .. o.metadata.ownerReferences[1].name end

local function kib() collectgarbage("collect") collectgarbage("collect") return collectgarbage("count") end

describe("join.new", function()
  it("hands out each left item with its right matches in right's order, then what no left item claimed by key", function()
    local right = { vmi("a", "x1", "x"), vmi("b", "gone-1", "gone"), vmi("a", "x2", "x"), vmi("a", "y1", "y"),
      vmi("a", "gone-2", "alsogone") }
    local j = join.new({ object("a", "x"), object("a", "y"), object("a", "z") }, right, { key = owner_key })
    local seen = {}
    for left, matches in j do
      local names = {}
      for i, m in ipairs(matches) do names[i] = m.metadata.name end
      seen[#seen + 1] = left.metadata.name .. ":" .. table.concat(names, ",")
    end
    assert.same({ "x:x1,x2", "y:y1", "z:" }, seen)
    local rest = {}
    for key, item in j:unmatched() do rest[#rest + 1] = key .. " " .. item.metadata.name end
    assert.same({ "a/alsogone gone-2", "b/gone gone-1" }, rest)
    -- handed out once: nothing is left after
    assert.is_nil(j:unmatched()())
  end)

  it("keeps only the right items whose key is not nil, and reads a pager-like list and a function alike", function()
    local calls, i = 0, 0
    local rights = { vmi("a", "k", "k"), vmi("a", "drop", "d") }
    local pager = { next = function() i = i + 1 return rights[i] end }
    local lefts = { object("a", "k"), object("a", "d") }
    local n = 0
    local j = join.new(function() n = n + 1 return lefts[n] end, pager, { key = function(o)
      calls = calls + 1
      return o.metadata.name ~= "drop" and owner_key(o) or nil
    end })
    local a_left, a_matches = j()
    local b_left, b_matches = j:next()
    assert.same({ "k", 1, "d", 0 }, { a_left.metadata.name, #a_matches, b_left.metadata.name, #b_matches })
    assert.is_nil(j())
    assert.equal(2, calls)
  end)

  it("hands out fresh tables: editing a match changes nothing kept", function()
    local j = join.new({ object("a", "x") }, { vmi("a", "x1", "x"), vmi("a", "x2", "x") }, { key = owner_key })
    local _, matches = j()
    matches[1].spec.volumes[1].name = "edited"
    local j2 = join.new({ object("a", "x") }, { vmi("a", "x1", "x") }, { key = owner_key })
    local _, again = j2()
    assert.equal("vol-1", again[1].spec.volumes[1].name)
  end)

  it("holds no object of either list: each is collectable once read", function()
    local held = setmetatable({}, { __mode = "k" })
    local r, l = 0, 0
    local j = join.new(function()
      l = l + 1
      if l > 50 then return nil end
      local o = object("a", "vm-" .. l)
      held[o] = "left"
      return o
    end, function()
      r = r + 1
      if r > 50 then return nil end
      local o = vmi("a", "vm-" .. r, "vm-" .. r)
      held[o] = "right"
      return o
    end, { key = owner_key })
    for _ in j do end
    collectgarbage("collect")
    collectgarbage("collect")
    assert.is_nil(next(held))
    assert.equal(51, l)
  end)

  it("holds what it keeps in less memory than the same values as tables", function()
    local items = {}
    for i = 1, 400 do items[i] = vmi("ns", "vmi-" .. i, "vm-" .. i) end
    local as_tables = {}
    local before = kib()
    for i = 1, #items do as_tables[i] = json.decode(json.encode(items[i])) end
    local tables_kib = kib() - before
    assert.equal(#items, #as_tables) -- held, so that the count above measured them
    local n = 0
    before = kib()
    local j = join.new({}, function() n = n + 1 return items[n] and json.decode(json.encode(items[n])) end, { key = owner_key })
    local join_kib = kib() - before
    assert.is_not_nil(j)
    assert.equal(401, n)
    -- measured: about a third (400 keys, each with its array); half leaves room for allocator noise
    assert.is_true(join_kib < tables_kib / 2, ("join %.0f KiB, tables %.0f KiB"):format(join_kib, tables_kib))
  end)

  it("refuses a join without a key function", function()
    assert.has_error(function() join.new({}, {}, {}) end, "join(left, right, opts): opts.key must be a function")
    assert.has_error(function() join.new({}, 3, { key = owner_key }) end,
      "join: right must be an array, a list or a function returning the next item")
  end)
end)

describe("join.queue", function()
  it("hands out (object, value) pairs first in first out, a nil value as nil, each once", function()
    local q = join.queue()
    q:push(object("a", "one"), vmi("a", "v1", "one"))
    q:push(object("a", "two"))
    q:push(object("a", "three"), "text")
    assert.equal(3, q:len())
    local o, v = q:pop()
    assert.same({ "one", "v1" }, { o.metadata.name, v.metadata.name })
    assert.equal(2, q:len())
    local got = {}
    for obj, value in q:drain() do got[#got + 1] = obj.metadata.name .. "=" .. tostring(value) end
    assert.same({ "two=nil", "three=text" }, got)
    assert.equal(0, q:len())
    assert.is_nil(q:pop())
  end)

  it("keeps no table of what it was given", function()
    local held = setmetatable({}, { __mode = "k" })
    local q = join.queue()
    for i = 1, 20 do
      local o, v = object("a", "o" .. i), vmi("a", "v" .. i, "o" .. i)
      held[o], held[v] = true, true
      q:push(o, v)
    end
    collectgarbage("collect")
    collectgarbage("collect")
    assert.is_nil(next(held))
    assert.equal(20, q:len())
  end)
end)
