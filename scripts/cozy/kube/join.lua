-- What a migration keeps between two passes over a fleet, held by the
-- engine: a keyed join of two lists, and a queue of (object, value) pairs.
--
-- Both hold what they keep as JSON text, about a fifth of the memory of the
-- same values as Lua tables, and decode a value only when it is handed out:
-- memory grows with what is kept, never with the lists read. The values
-- handed out are fresh tables, so what a migration does to one never reaches
-- what is still kept. (docs/engine-api.md, "Helpers for migrations")
local json = require "cozy.json"
local obj = require "cozy.obj"
local validate = require "cozy.validate"

local join = {}

-- A function returning the next item of an array, a list (anything with a
-- next method: a pager or its facade) or a function.
local function puller(items, what)
  validate.arg(3, nil, what, items, { "function", "table" },
    { says = "an array, a list or a function returning the next item" })
  if type(items) == "function" then return items end
  if type(items.next) == "function" then return function() return items:next() end end
  local i = 0
  return function() i = i + 1 return items[i] end
end

-- A queue of (object, value) pairs, first in first out.
local Queue = {}
Queue.__index = Queue

function join.queue()
  return setmetatable({ texts = {}, head = 1, tail = 0 }, Queue)
end

function Queue:push(o, value)
  self.tail = self.tail + 1
  self.texts[self.tail] = json.encode(json.array { o, value == nil and json.null or value })
end

function Queue:len() return self.tail - self.head + 1 end

-- The next pair, released from the queue (nil when it is empty).
function Queue:pop()
  if self.head > self.tail then return nil end
  local text = self.texts[self.head]
  self.texts[self.head], self.head = nil, self.head + 1
  local pair = json.decode(text)
  local value = pair[2]
  if value == json.null then value = nil end
  return pair[1], value
end

-- An iterator of the pairs, each released as it is handed out: for o, v in q:drain()
function Queue:drain()
  return function() return self:pop() end
end

-- A keyed join (join.new): reads all of `right` at once, keeping each item
-- whose opts.key(item) is not nil under that key; then, as it is iterated,
-- reads `left` one item at a time and hands out (left_item, matches): the
-- kept right items under opts.left_key(left_item) (default obj.key,
-- "namespace/name"), in right's list order, an empty array when none. Each
-- key's matches are released as they are handed out; what no left item
-- claimed is read with unmatched().
local Join = {}
Join.__index = Join

function join.new(left, right, opts)
  opts = opts or {}
  validate.args(2, "join(left, right, opts)", {
    { "opts.key", opts.key, "function" },
    { "opts.left_key", opts.left_key, "function", true },
  })
  local self = setmetatable({ pull = puller(left, "join: left"), kept = {},
    left_key = opts.left_key or obj.key }, Join)
  local pull_right = puller(right, "join: right")
  for item in pull_right do
    local key = opts.key(item)
    if key ~= nil then
      local texts = self.kept[key] or {}
      texts[#texts + 1] = json.encode(item)
      self.kept[key] = texts
    end
  end
  return self
end

local function decoded(texts)
  local out = {}
  for i, text in ipairs(texts or {}) do out[i] = json.decode(text) end
  return out
end

-- The next left item and its matches, or nil when left is read through.
function Join:next()
  local item = self.pull()
  if item == nil then return nil end
  local key = self.left_key(item)
  local texts = self.kept[key]
  self.kept[key] = nil
  return item, decoded(texts)
end

Join.__call = Join.next

-- An iterator of the kept right items no left item claimed, as (key, item),
-- by key and then in list order; each released as it is handed out. Meant
-- for after the join is read through (before, it hands out what is not yet
-- claimed, which is then never handed to a left item).
function Join:unmatched()
  local keys = {}
  for key in pairs(self.kept) do keys[#keys + 1] = key end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local k, i = 1, 0
  return function()
    while keys[k] ~= nil do
      local texts = self.kept[keys[k]]
      i = i + 1
      if texts ~= nil and texts[i] ~= nil then
        local text = texts[i]
        texts[i] = false
        return keys[k], json.decode(text)
      end
      self.kept[keys[k]], k, i = nil, k + 1, 0
    end
    return nil
  end
end

return join
