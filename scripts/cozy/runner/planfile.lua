-- The saved plan (`plan --save FILE`, `run --plan FILE`; docs/operations.md,
-- "A saved plan"): a JSON document, version 1, written mode 0600:
--
--   { "kind": "CozyMigratePlan", "version": 1, "engine": cozy-migrate's version,
--     "namespace", "current", "target",
--     "stamp": { "resourceVersion" },              the version ConfigMap as read
--     "migrations": [ { number, name, kind, sha256 } ],   the pending range
--     "steps": [ { number, name, writes: [ { method, path, content_type,
--                  digest, body (redacted), stamp, version, script } ] } ],
--     "not_rehearsed": [ { number, name, why } ],
--     "reads": [ { path, resourceVersion, absent } ],
--     "lists": [ { path, labelSelector, fieldSelector, complete, items: { key: rv } } ],
--     "digest": sha256 of the canonical JSON of all the above }
--
-- The digest finds a corrupted or hand-edited file; it is no signature.
local json = require "cozy.json"
local errors = require "cozy.errors"
local sys = require "cozy.sys"

local planfile = {}

planfile.KIND, planfile.VERSION = "CozyMigratePlan", 1

local function digest(doc)
  local copy = {}
  for k, v in pairs(doc) do if k ~= "digest" then copy[k] = v end end
  return sys.sha256(json.encode(json.object(copy)))
end

-- The pending range as the history records it.
function planfile.migrations(steps)
  local out = json.array {}
  for _, m in ipairs(steps) do
    out[#out + 1] = json.object { number = m.number, name = m.name, kind = m.kind,
      sha256 = m.sha256 }
  end
  return out
end

-- Writes the plan to path, mode 0600. doc: the fields above but digest.
function planfile.save(path, doc)
  doc.kind, doc.version, doc.engine = planfile.KIND, planfile.VERSION, sys.version
  doc.digest = digest(doc)
  local ok, why = sys.write_private(path, json.encode(json.object(doc)) .. "\n")
  if not ok then errors.raise("usage", ("--save: cannot write the plan: %s"):format(why)) end
end

local function bad(path, why)
  errors.raise("usage", ("--plan %s: %s"):format(path, why))
end

local function is_array(v) return type(v) == "table" end

-- Reads and checks the plan file: its form and digest, then that it is a
-- plan of this engine, namespace, target and migration set (`pending`: the
-- steps from the plan's current version to the target). Raises usage
-- (exit 2) otherwise.
function planfile.load(path, o)
  local f, err = io.open(path, "rb")
  if not f then bad(path, "cannot read it: " .. tostring(err)) end
  local text = f:read("a")
  f:close()
  if text == nil or #text > 64 * 1024 * 1024 then
    bad(path, "cannot read it, or it is larger than 64 MiB")
  end
  local ok, doc = pcall(json.decode, text)
  if not ok or type(doc) ~= "table" then
    bad(path, "not a JSON document: " .. errors.safe_text(doc))
  end
  if doc.kind ~= planfile.KIND then
    bad(path, ("kind is %q, not %s"):format(tostring(doc.kind), planfile.KIND))
  end
  if math.tointeger(doc.version) ~= planfile.VERSION then
    bad(path, ("version %s of the plan format: this engine reads version %d")
      :format(tostring(doc.version), planfile.VERSION))
  end
  if type(doc.digest) ~= "string" or digest(doc) ~= doc.digest then
    bad(path,
      "its digest does not match its content: the file was changed or damaged after it was saved")
  end
  for _, k in ipairs({ "migrations", "steps", "reads", "lists", "not_rehearsed" }) do
    if not is_array(doc[k]) then bad(path, ("%s is missing or not a list"):format(k)) end
  end
  if doc.engine ~= sys.version then
    bad(path, ("saved by cozy-migrate %s; this is %s: plan again with this one")
      :format(tostring(doc.engine), sys.version))
  end
  if doc.namespace ~= o.namespace then
    bad(path, ("planned for namespace %s; this run is for %s")
      :format(tostring(doc.namespace), o.namespace))
  end
  doc.current, doc.target = math.tointeger(doc.current), math.tointeger(doc.target)
  if doc.target ~= o.target then
    bad(path, ("planned for target %s; this run's target is %d")
      :format(tostring(doc.target), o.target))
  end
  if #doc.not_rehearsed > 0 then
    local names = {}
    for _, s in ipairs(doc.not_rehearsed) do names[#names + 1] = tostring(s.name) end
    bad(path,
      ("step(s) %s were not rehearsed (%s): a plan binds only rehearsed steps; run without --plan, "
      .. "or plan the range after them")
        :format(table.concat(names, ", "), tostring(doc.not_rehearsed[1].why)))
  end
  local by_number = {}
  for _, m in ipairs(o.set.migrations) do by_number[m.number] = m end
  for _, pm in ipairs(doc.migrations) do
    local m = by_number[math.tointeger(pm.number)]
    if m == nil or m.sha256 ~= pm.sha256 or m.name ~= pm.name then
      bad(path, ("migration %s (sha256 %s) is not this migration set's %s: plan again")
        :format(tostring(pm.name), tostring(pm.sha256),
          m and (m.name .. " (sha256 " .. m.sha256 .. ")") or "(none of that number)"))
    end
  end
  local plan = {}
  for _, s in ipairs(doc.steps) do
    if type(s) ~= "table" or not is_array(s.writes) then bad(path, "a step without its writes") end
    plan[math.tointeger(s.number) or -1] = { writes = s.writes }
  end
  doc.by_step = plan
  return doc
end

return planfile
