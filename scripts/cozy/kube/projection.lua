-- Projections: the dotted paths a lean object keeps, as a tree, and the
-- pruning of a full object to them (docs/engine-api.md, "Listing lean").
-- The transport's decoder applies the same tree while decoding
-- (spec/unit/json_projection_spec.lua: decode with it = decode, then prune).
local json = require "cozy.json"
local patch = require "cozy.kube.patch"

local projection = {}

-- A projection: dotted paths ("spec.template.spec.volumes"; "*" for every
-- element of an array) to the subtrees a lean list keeps, as a tree
-- { key = true | subtree, ["*"] = ... }. The object's identity (apiVersion,
-- kind, metadata name, namespace, uid, resourceVersion) is always kept, so
-- a lean object can be the base of an update or change.
function projection.new(paths)
  local tree = { apiVersion = true, kind = true,
    metadata = { name = true, namespace = true, uid = true, resourceVersion = true } }
  for _, p in ipairs(paths) do
    if type(p) ~= "string" or p == "" then error("a projection is an array of dotted paths", 3) end
    local node, parts = tree, {}
    for part in p:gmatch("[^.]+") do parts[#parts + 1] = part end
    for i, part in ipairs(parts) do
      if node[part] == true then break end
      if i == #parts then node[part] = true else
        node[part] = node[part] or {}
        node = node[part]
      end
    end
  end
  return tree
end

-- The lean copy of v that a projection tree keeps: a kept path is present
-- exactly when it is present in v, with its parents (each holding only what
-- the projection names, or, under "*", all but what it sets false), as the
-- decoder's projection builds it (docs/engine-api.md, "cozy.json").
local function prune(v, tree)
  if tree == true or type(v) ~= "table" then return v end
  if patch.is_array(v) then
    if not tree["*"] then return v end
    local out = json.array {}
    for i = 1, #v do out[i] = prune(v[i], tree["*"]) end
    return out
  end
  local out, star = json.object {}, tree["*"]
  if star then
    for k, x in pairs(v) do
      local sub = tree[k]
      if sub == nil then sub = star end
      if sub then out[k] = prune(x, sub) end
    end
    return out
  end
  for k, sub in pairs(tree) do
    if k ~= "*" and sub and v[k] ~= nil then out[k] = prune(v[k], sub) end
  end
  return out
end
projection.prune = prune

return projection
