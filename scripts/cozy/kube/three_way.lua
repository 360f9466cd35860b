-- The three-way merge of a rehearsal (docs/operations.md, "Rehearsals"):
-- a strategic merge or apply patch of an object the overlay changed is
-- sent with dryRun=All to the live server, which applies it to the live
-- object L with its own schema knowledge and answers S; the overlay holds
-- O, L changed by earlier writes. The run would apply the patch to O. Per
-- field, the side that changed it from L is taken; a field both changed to
-- different values is a conflict, named by its path, and the object is then
-- marked inexact, never silently wrong.
--
-- Arrays are atomic (a whole value), except the lists the API server
-- merges by `name` in both a strategic merge and a server-side apply of
-- the pod-bearing built-in types (containers, initContainers,
-- ephemeralContainers, volumes, env; groups "", apps and batch): those are
-- merged element by element, matched by name, when every element of the
-- three versions is an object with a unique string name. Their order is
-- the one side that changed it from L; both changing it differently is a
-- conflict.
--
-- A strategic merge patch that sets a scalar through object keys and
-- elements of those by-name lists only (data.version, metadata.labels.x,
-- spec.template.spec.containers[name=app].image) sets it in the run too,
-- whatever O held there: that field is the patch's (S's) value, not a
-- conflict. Not so
-- for an apply patch, which the run would refuse (409) where another field
-- manager owns the field with another value: there it stays a conflict.
-- A patch directive ($patch, $retainKeys, $setElementOrder/...,
-- $deleteFromPrimitiveList/...) acts on what the target holds: where O
-- differs from L under one, that is a conflict. An apply patch that removes
-- a field L had (a field its manager owned and no longer applies) on an
-- object the overlay changed is a conflict too: what it removes from O
-- depends on O's field ownership, which the server did not judge; and so
-- is an apply whose field manager applied to the object earlier in the
-- rehearsal (its managedFields entry in O is not L's: the run would remove
-- what that earlier apply set and this one leaves out).
--
-- three_way.strategic applies a strategic merge patch here, to an object
-- only the overlay holds, where these lists are all it merges (below).
--
-- Server-set metadata (resourceVersion, managedFields, generation,
-- creationTimestamp, uid, selfLink) is not merged: the overlay's is kept,
-- and the validating write answers the server's.
--
-- Pure data: no requests.
local json = require "cozy.json"
local patch = require "cozy.kube.patch"

local three_way = {}

local null = json.null
local equal, deepcopy, is_array = patch.equal, patch.deepcopy, patch.is_array

local SERVER_SET = { resourceVersion = true, managedFields = true, generation = true,
  creationTimestamp = true, uid = true, selfLink = true }

local BY_NAME = { containers = true, initContainers = true, ephemeralContainers = true,
  volumes = true, env = true }
local BY_NAME_GROUPS = { [""] = true, apps = true, batch = true }

local function absent(v) return v == nil or v == null end
local function value(v) if absent(v) then return nil end return v end

local function is_map(v) return type(v) == "table" and not is_array(v) end

local function same(a, b)
  if absent(a) and absent(b) then return true end
  return equal(a, b)
end

local function copy(v)
  if type(v) == "table" then return deepcopy(v) end
  return v
end

-- Each element's name, in order, and the elements by name; nil when the
-- list is not one of objects with unique string names.
local function named(list)
  if absent(list) then return {}, {} end
  if type(list) ~= "table" or not is_array(list) then return nil end
  local order, by = {}, {}
  for i = 1, #list do
    local el = list[i]
    if not is_map(el) or type(el.name) ~= "string" or by[el.name] ~= nil then return nil end
    order[i], by[el.name] = el.name, el
  end
  return order, by
end

local function same_order(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

local merge

local function conflict(ctx, path, s)
  ctx.conflicts[#ctx.conflicts + 1] = path
  return copy(value(s))
end

local function merge_named(l, s, o, path, ctx)
  local ln, lb = named(l)
  local sn, sb = named(s)
  local on, ob = named(o)
  if ln == nil or sn == nil or on == nil then return conflict(ctx, path, s) end
  local order
  if same_order(sn, ln) then order = on
  elseif same_order(on, ln) or same_order(sn, on) then order = sn
  else return conflict(ctx, path .. " (order)", s) end
  local out, placed = json.array {}, {}
  for _, name in ipairs(order) do
    placed[name] = true
    local el = merge(lb[name], sb[name], ob[name], ("%s[name=%s]"):format(path, name), ctx)
    if el == nil then
      -- kept by the order of one side, removed by the other's change
      conflict(ctx, ("%s[name=%s]"):format(path, name))
    else
      out[#out + 1] = el
    end
  end
  -- an element the order leaves out that the merge keeps: both sides disagree on it
  for _, names in ipairs { ln, sn, on } do
    for _, name in ipairs(names) do
      if not placed[name] then
        placed[name] = true
        if merge(lb[name], sb[name], ob[name], ("%s[name=%s]"):format(path, name), ctx) ~= nil then
          conflict(ctx, ("%s[name=%s]"):format(path, name))
        end
      end
    end
  end
  return out
end

-- The merged value at path (nil: absent).
function merge(l, s, o, path, ctx)
  if same(s, l) then return copy(value(o)) end
  if same(o, l) or same(s, o) then return copy(value(s)) end
  -- both changed it, differently
  if ctx.patch_sets[path] then return copy(value(s)) end
  local key = path:match("([^%.%]]+)$")
  if ctx.by_name and BY_NAME[key] and (absent(s) or is_array(s)) and (absent(o) or is_array(o))
      and (absent(l) or is_array(l)) then
    return merge_named(l, s, o, path, ctx)
  end
  if is_map(s) and is_map(o) and (absent(l) or is_map(l)) then
    local lm = is_map(l) and l or {}
    local out, keys = json.object {}, {}
    for k in pairs(lm) do keys[k] = true end
    for k in pairs(s) do keys[k] = true end
    for k in pairs(o) do keys[k] = true end
    for k in pairs(keys) do
      local sub = path == "" and k or (path .. "." .. k)
      if path == "metadata" and SERVER_SET[k] then
        out[k] = copy(value(o[k]))
      else
        out[k] = merge(lm[k], s[k], o[k], sub, ctx)
      end
    end
    return out
  end
  return conflict(ctx, path, s)
end

-- The scalars a strategic merge patch sets through object keys only, as a
-- set of paths; and where a directive acts on what the target holds, each
-- { path shown, keys }.
local function patch_paths(p, path, keys, sets, directives, by_name)
  for k, v in pairs(p) do
    local sub = path == "" and k or (path .. "." .. k)
    if type(k) == "string" and k:sub(1, 1) == "$" then
      local field = k:match("^%$[%a]+/(.+)$")
      local at_keys = table.move(keys, 1, #keys, 1, {})
      if field then at_keys[#at_keys + 1] = field end
      directives[#directives + 1] = { field and (path == "" and field or (path .. "." .. field))
        or path, at_keys }
    elseif is_map(v) then
      keys[#keys + 1] = k
      patch_paths(v, sub, keys, sets, directives, by_name)
      keys[#keys] = nil
    elseif type(v) == "table" then
      -- a list: a directive anywhere inside it but an element's own `$patch: delete` acts on the
      -- target's list
      local function inside(x, top)
        if type(x) ~= "table" then return false end
        for kk, vv in pairs(x) do
          if type(kk) == "string" and kk:sub(1, 1) == "$"
            and not (top and kk == "$patch" and vv == "delete") then
            return true
          end
          if inside(vv, false) then return true end
        end
        return false
      end
      local directive = false
      for _, el in ipairs(v) do
        if inside(el, true) then
          local at_keys = table.move(keys, 1, #keys, 1, {})
          at_keys[#at_keys + 1] = k
          directives[#directives + 1] = { sub, at_keys }
          directive = true
          break
        end
      end
      if not directive and by_name and BY_NAME[k] then
        -- a list merged by name: what the patch sets in an element it sets in the run's element of
        -- that name
        for _, el in ipairs(v) do
          if is_map(el) and type(el.name) == "string" and el["$patch"] == nil then
            patch_paths(el, ("%s[name=%s]"):format(sub, el.name), {}, sets, {}, by_name)
          end
        end
      end
    elseif v ~= null then
      sets[sub] = true
    end
  end
end

local function at(obj, keys)
  local v = obj
  for _, k in ipairs(keys) do
    if not is_map(v) then return nil end
    v = v[k]
  end
  return v
end

-- The fields an apply by this field manager owns in obj (its Apply entry's
-- fieldsV1), or nil.
local function applied_by(obj, manager)
  local md = is_map(obj) and obj.metadata
  local mf = is_map(md) and md.managedFields
  if type(mf) ~= "table" then return nil end
  for _, m in ipairs(mf) do
    if is_map(m) and m.manager == manager and m.operation == "Apply"
      and (m.subresource or "") == "" then
      return m.fieldsV1
    end
  end
  return nil
end

-- A strategic merge patch applied here, to an object only the overlay
-- holds (the server cannot apply it to an object it does not hold), where
-- its semantics are known without the server's schema: object keys merged
-- (null deletes), the by-name lists above merged by name (an element's
-- `$patch: delete` removes it) and ordered as kube-apiserver orders them
-- (apimachinery's normalizeElementOrder: the patch's elements in the
-- patch's order, interleaved with the others in the original's order; an
-- original element goes first only where both are in the original and it
-- comes first there), a container's `args` and `command` replaced whole.
-- Returns the result, or nil and why not: another list (its strategy is the
-- server's schema's), or any other directive.
local ATOMIC = { args = true, command = true }

local function element_order(merged, patch_names, original_names)
  local in_patch, where = {}, {}
  for i, n in ipairs(patch_names) do in_patch[n] = i end
  for i, n in ipairs(original_names) do where[n] = i end
  local patched, server_only = {}, {}
  for _, el in ipairs(merged) do
    if in_patch[el.name] then patched[#patched + 1] = el else server_only[#server_only + 1] = el end
  end
  table.sort(patched, function(x, y) return in_patch[x.name] < in_patch[y.name] end)
  table.sort(server_only, function(x, y) return (where[x.name] or 0) < (where[y.name] or 0) end)
  local out, i, j = json.array {}, 1, 1
  while i <= #server_only or j <= #patched do
    local left, right = server_only[i], patched[j]
    if right == nil
      or (left ~= nil and where[left.name] and where[right.name]
        and where[left.name] < where[right.name]) then
      out[#out + 1] = left
      i = i + 1
    else
      out[#out + 1] = right
      j = j + 1
    end
  end
  return out
end

local strategic

local function strategic_named(target, p, path, by_name)
  local original_names, by = named(target)
  if original_names == nil then return nil, path .. " is not a list of named elements" end
  local merged = json.array {}
  for _, el in ipairs(type(target) == "table" and target or {}) do
    merged[#merged + 1] = deepcopy(el)
  end
  local index = {}
  for i, n in ipairs(original_names) do index[n] = i end
  local patch_names, deleted = {}, {}
  for _, pe in ipairs(p) do
    if not is_map(pe) or type(pe.name) ~= "string" then
      return nil, path .. " has an element without a name"
    end
    local sub = ("%s[name=%s]"):format(path, pe.name)
    if pe["$patch"] == "delete" then
      deleted[pe.name] = true
    elseif pe["$patch"] ~= nil then
      return nil, sub .. " has a $patch directive"
    elseif by[pe.name] ~= nil then
      local r, why = strategic(merged[index[pe.name]], pe, sub, by_name)
      if r == nil then return nil, why end
      merged[index[pe.name]] = r
      patch_names[#patch_names + 1] = pe.name
    else
      local r, why = strategic(nil, pe, sub, by_name)
      if r == nil then return nil, why end
      merged[#merged + 1] = r
      by[pe.name], index[pe.name] = r, #merged
      patch_names[#patch_names + 1] = pe.name
    end
  end
  local kept = json.array {}
  for _, el in ipairs(merged) do
    if not deleted[el.name] then kept[#kept + 1] = el end
  end
  return element_order(kept, patch_names, original_names)
end

function strategic(target, p, path, by_name)
  local result = is_map(target) and deepcopy(target) or json.object {}
  for k, v in pairs(p) do
    local sub = path == "" and k or (path .. "." .. k)
    if type(k) == "string" and k:sub(1, 1) == "$" then
      return nil, ("the directive %s"):format(sub)
    elseif v == null then
      result[k] = nil
    elseif is_map(v) then
      local r, why = strategic(result[k], v, sub, by_name)
      if r == nil then return nil, why end
      result[k] = r
    elseif type(v) == "table" then
      if by_name and BY_NAME[k] then
        local r, why = strategic_named(value(result[k]), v, sub, by_name)
        if r == nil then return nil, why end
        result[k] = r
      elseif by_name and ATOMIC[k] then
        result[k] = deepcopy(v)
      else
        return nil, ("the list %s (its merge strategy is the server's schema's)"):format(sub)
      end
    else
      result[k] = v
    end
  end
  return result
end

function three_way.strategic(obj, p, group)
  if not is_map(p) then return nil, "the patch is not an object" end
  return strategic(obj, p, "", BY_NAME_GROUPS[group or ""] == true)
end

-- Merges S (the server's answer to the patch on the live object L) with O
-- (the overlay's version of it). opts: { patch = the patch sent (a table),
-- apply = it was an apply patch, field_manager = the apply's, group = the
-- object's API group }. Returns
-- the merged object and the conflicting field paths (sorted; empty when
-- none).
function three_way.merge(l, s, o, opts)
  opts = opts or {}
  local ctx = { conflicts = {}, patch_sets = {},
    by_name = BY_NAME_GROUPS[opts.group or ""] == true }
  local directives = {}
  if is_map(opts.patch) then
    local sets = {}
    patch_paths(opts.patch, "", {}, sets, directives, ctx.by_name)
    if not opts.apply then ctx.patch_sets = sets end
  end
  local merged = merge(l, s, o, "", ctx)
  for _, d in ipairs(directives) do
    if not same(at(o, d[2]), at(l, d[2])) then
      ctx.conflicts[#ctx.conflicts + 1] = (d[1] == "" and "." or d[1]) .. " (a patch directive)"
    end
  end
  if opts.apply
    and not same(applied_by(o, opts.field_manager), applied_by(l, opts.field_manager)) then
    -- an earlier apply of this manager in the rehearsal: the fields this one would remove from O
    -- are not L's
    ctx.conflicts[#ctx.conflicts + 1] = ("metadata.managedFields (fields applied by %s earlier "
      .. "in the rehearsal)")
      :format(tostring(opts.field_manager))
  end
  if opts.apply and not same(o, l) then
    -- a field the apply removed from L: whether the run removes it from O depends on O's ownership
    local function removed(lv, sv, path)
      if absent(lv) then return end
      if absent(sv) then
        ctx.conflicts[#ctx.conflicts + 1] = path .. " (removed by the apply)"
        return
      end
      if is_map(lv) and is_map(sv) then
        for k, v in pairs(lv) do
          if not (path == "metadata" and SERVER_SET[k]) then
            removed(v, sv[k], path == "" and k or (path .. "." .. k))
          end
        end
      end
    end
    removed(l, s, "")
  end
  table.sort(ctx.conflicts)
  local seen, uniq = {}, {}
  for _, c in ipairs(ctx.conflicts) do
    if not seen[c] then seen[c] = true uniq[#uniq + 1] = c end
  end
  return merged, uniq
end

return three_way
