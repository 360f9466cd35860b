-- obj.walk: jq's walk(f) over a decoded document, compared with jq itself.
local json = require "cozy.json"
local obj = require "cozy.obj"
local cli = require("spec.helpers").cli

local DOC = [[{"metadata":{"name":"a","annotations":{"x":"1","drop":"y"},"labels":{}},
  "spec":{"list":[{"drop":1,"keep":[]},{"keep":{"drop":2}},null,3],"empty":[],"n":7}}]]

local function jq(filter, doc)
  local r = cli.shell("jq -cS " .. cli.quote(filter), doc)
  assert(r.code == 0, r.stderr)
  return (r.stdout:gsub("\n$", ""))
end

-- cozy.json sorts object keys bytewise, as jq -S prints them
local sorted = json.encode

describe("obj.walk", function()
  it("removes a key from every object, innermost first, as jq's walk does", function()
    local out = obj.walk(json.decode(DOC), function(v)
      if type(v) == "table" and getmetatable(v) ~= json.array_mt then v.drop = nil end
    end)
    assert.equal(jq('walk(if type == "object" then del(.drop) else . end)', DOC), sorted(out))
  end)

  it("replaces values, keeps arrays and objects as they were (empty ones too), and leaves its input alone", function()
    local doc = json.decode(DOC)
    local before = json.encode(doc)
    local out = obj.walk(doc, function(v)
      if type(v) == "number" then return v * 10 end
      if v == json.null then return "was null" end
    end)
    assert.equal(jq('walk(if type == "number" then . * 10 elif . == null then "was null" else . end)', DOC),
      sorted(out))
    assert.equal(before, json.encode(doc))
  end)

  it("gives each value its path from the root", function()
    local paths = {}
    obj.walk(json.decode('{"a":[{"b":true}]}'), function(_, path)
      paths[#paths + 1] = table.concat((function()
        local t = {}
        for i, s in ipairs(path) do t[i] = tostring(s) end
        return t
      end)(), ".")
    end)
    assert.same({ "a.1.b", "a.1", "a", "" }, paths)
    assert.has_error(function() obj.walk({}, nil) end, "obj.walk(v, fn): fn must be a function(value, path)")
  end)
end)
