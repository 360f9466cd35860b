-- The label and annotation keys (and label values) a write carries, checked
-- before it is sent, as the API server checks them (cozy.obj.key_error,
-- label_value_error): a key the server would refuse is a 422 Invalid raised
-- here, for every way a migration writes (create, a merge patch, a JSON
-- patch, the difference a change sends, a batch), in plans as in runs,
-- naming the key, and nothing is sent. The server stays the judge of
-- everything else.
local json = require "cozy.json"
local obj = require "cozy.obj"
local errors = require "cozy.kube.errors"

local labels = {}

local null = json.null

-- The first defect of a map of field ("labels" or "annotations"), or nil.
local function map_defect(field, map)
  if type(map) ~= "table" then return nil end
  for k, v in pairs(map) do
    if v ~= null then -- a merge patch's removal: what is removed is not stored
      local why = obj.key_error(field == "annotations" and type(k) == "string" and k:lower() or k)
      if why then return field, "key " .. why end
      if field == "labels" then
        why = obj.label_value_error(v)
        if why then return field, "value " .. why end
      end
    end
  end
  return nil
end

local function metadata_defect(md)
  if type(md) ~= "table" then return nil end
  local field, why = map_defect("labels", md.labels)
  if field then return field, why end
  return map_defect("annotations", md.annotations)
end

-- "/metadata/labels/a~1b" -> { "metadata", "labels", "a/b" }
local function pointer(path)
  local out = {}
  for part in tostring(path):gmatch("/([^/]*)") do
    -- (most parts have no escape: no two substitutions for nothing)
    if part:find("~", 1, true) then part = part:gsub("~1", "/"):gsub("~0", "~") end
    out[#out + 1] = part
  end
  return out
end

local function op_defect(op)
  if type(op) ~= "table" or (op.op ~= "add" and op.op ~= "replace") then return nil end
  local p = pointer(op.path)
  if p[1] ~= "metadata" and #p > 0 then return nil end
  if #p == 0 then return metadata_defect(type(op.value) == "table" and op.value.metadata) end
  if #p == 1 then return metadata_defect(op.value) end
  local field = p[2]
  if field ~= "labels" and field ~= "annotations" then return nil end
  if #p == 2 then return map_defect(field, op.value) end
  if #p == 3 then return map_defect(field, { [p[3]] = op.value }) end
  return nil
end

-- Raises a kube.Error (422 Invalid, nothing sent) when body, the body of a
-- write, carries a label or annotation the API server would refuse.
function labels.check(method, path, body, content_type)
  if type(body) ~= "table" then return end
  local field, why
  if content_type == "application/json-patch+json" then
    for _, op in ipairs(body) do
      field, why = op_defect(op)
      if field then break end
    end
  else
    field, why = metadata_defect(body.metadata)
  end
  if field then
    error(errors.new { method = method, path = path, code = 422, reason = "Invalid",
      message = ("metadata.%s: invalid %s (not sent: the API server refuses it)")
        :format(field, why),
      details = { causes = { { field = "metadata." .. field, reason = "FieldValueInvalid" } } },
      attempts = {} }, 0)
  end
end

return labels
