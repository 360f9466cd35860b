-- Resources by the names kubectl takes ("pvc", "deployments.apps",
-- "helmreleases.helm.toolkit.fluxcd.io", "deployments.v1.apps"), resolved
-- through discovery as kubectl's RESTMapper does (docs/engine-api.md,
-- "Resources by kubectl name"): the resource's plural, singular, kind or
-- one of its shortNames, in the group given or in any group (the core group
-- first, then the groups in the order the server lists them), at the
-- group's preferred version unless a version is named, and at another
-- served version of the group only if the preferred one lacks it.
--
-- An API that is not served is an answer (nil and why), never an error: a
-- migration for a CRD that may be absent says so in one line. Any other
-- discovery failure raises, as for Client:served: an unreachable server is
-- never read as an absent API.
local errors = require "cozy.kube.errors"
local validate = require "cozy.validate"

local names = {}

local VERSION = "^v%d+$"
local function is_version(s)
  return s:find(VERSION) ~= nil or s:find("^v%d+alpha%d+$") ~= nil or s:find("^v%d+beta%d+$") ~= nil
end

-- The decoded answer of a discovery GET, or nil when the server says 404.
local function get(c, path)
  local ok, res = pcall(c.call, c, "GET", path)
  if ok then return type(res) == "table" and res or {} end
  if errors.is_error(res) and res.code == 404 then return nil end
  error(res, 0)
end

-- The server's groups, in its order, each { name =, preferred =, versions = {...} }:
-- the core group first (name ""), from /api, then /apis. Cached in `cache`.
local function groups(c, cache)
  if cache.groups then return cache.groups end
  local out = {}
  local core = get(c, "/api")
  if core then
    local versions = {}
    for _, v in ipairs(type(core.versions) == "table" and core.versions or {}) do
      if type(v) == "string" then versions[#versions + 1] = v end
    end
    if #versions > 0 then out[1] = { name = "", preferred = versions[1], versions = versions } end
  end
  local list = get(c, "/apis") or {}
  for _, g in ipairs(type(list.groups) == "table" and list.groups or {}) do
    if type(g) == "table" and type(g.name) == "string" then
      local versions = {}
      for _, v in ipairs(type(g.versions) == "table" and g.versions or {}) do
        if type(v) == "table" and type(v.version) == "string" then
          versions[#versions + 1] = v.version
        end
      end
      local preferred = type(g.preferredVersion) == "table" and g.preferredVersion.version
        or versions[1]
      if type(preferred) == "string" then
        out[#out + 1] = { name = g.name, preferred = preferred, versions = versions }
      end
    end
  end
  cache.groups = out
  return out
end

-- The resources of a group version (subresources left out), cached.
local function resources(c, cache, group, version)
  local gv = group == "" and version or (group .. "/" .. version)
  cache.lists = cache.lists or {}
  local list = cache.lists[gv]
  if list == nil then
    local body = get(c, group == "" and ("/api/" .. version) or ("/apis/" .. gv)) or {}
    list = {}
    for _, r in ipairs(type(body.resources) == "table" and body.resources or {}) do
      if type(r) == "table" and type(r.name) == "string" and not r.name:find("/", 1, true) then
        list[#list + 1] = r
      end
    end
    cache.lists[gv] = list
  end
  return list, gv
end

-- Does discovery's entry r answer to `word`, as kubectl reads a name: its
-- plural, singular or kind in any case, or one of its shortNames as the
-- server spells it (kubectl's short-name expansion is exact: "PVC" is no
-- resource to it)?
local function answers(r, word)
  local lower = word:lower()
  if r.name:lower() == lower then return true end
  if type(r.singularName) == "string" and r.singularName ~= ""
    and r.singularName:lower() == lower then
    return true
  end
  if type(r.kind) == "string" and r.kind:lower() == lower then return true end
  for _, s in ipairs(type(r.shortNames) == "table" and r.shortNames or {}) do
    if s == word then return true end
  end
  return false
end

-- The versions of group g to look in, the preferred one first (or only
-- `version` when it is named).
local function versions_of(g, version)
  if version then
    for _, v in ipairs(g.versions) do
      if v == version then return { v } end
    end
    return {}
  end
  local out = { g.preferred }
  for _, v in ipairs(g.versions) do
    if v ~= g.preferred then out[#out + 1] = v end
  end
  return out
end

local function find_in(c, cache, word, g, version)
  for _, v in ipairs(versions_of(g, version)) do
    local list, gv = resources(c, cache, g.name, v)
    for _, r in ipairs(list) do
      if answers(r, word) then
        return { api_version = gv, plural = r.name, kind = r.kind,
          namespaced = r.namespaced == true, group = g.name, version = v,
          short_names = r.shortNames, verbs = r.verbs }
      end
    end
  end
  return nil
end

-- A name kubectl would take for a resource ("pvc", "deployments.apps"), and
-- one for an API group ("" the core group).
local function is_resource_name(v)
  return type(v) == "string" and v ~= "" and not v:find("[%s/]")
end
local function is_group_name(v) return type(v) == "string" and not v:find("[%s/]") end

-- Resolves `name` for client c (its discovery answers cached in `cache` for
-- the client's life). Returns a table { api_version, plural, kind,
-- namespaced, group, version }, or nil and why it is absent.
function names.resolve(c, cache, name)
  validate.arg(3, "lookup(name)", "name", name, is_resource_name,
    { says = 'a resource as kubectl names it ("pvc", "deployments.apps")', show = "not" })
  -- answers by name are kept apart from the cached discovery lists (a
  -- resource may well be named "groups")
  cache.names = cache.names or {}
  local answers_of, key = cache.names, name
  local hit = answers_of[key]
  if hit ~= nil then
    if hit.absent then return nil, hit.absent end
    return hit
  end
  local word, rest = key:match("^([^.]+)%.(.+)$")
  word = word or key
  local found
  local all = groups(c, cache)
  if rest == nil then
    for _, g in ipairs(all) do
      found = find_in(c, cache, word, g)
      if found then break end
    end
  else
    -- "resource.version.group" when the second part is a version and the
    -- group serves it; else "resource.group" (kubectl tries both the same way)
    local version, group = rest:match("^([^.]+)%.(.+)$")
    for _, g in ipairs(all) do
      if version and is_version(version) and g.name == group then
        found = find_in(c, cache, word, g, version)
      end
      if not found and g.name == rest then found = find_in(c, cache, word, g) end
      if found then break end
    end
  end
  if found then
    answers_of[key] = found
    return found
  end
  local why
  if rest == nil then
    why = ("no resource named %q is served"):format(name)
  else
    local version, group = rest:match("^([^.]+)%.(.+)$")
    local by_name = {}
    for _, g in ipairs(all) do by_name[g.name] = g end
    if by_name[rest] then
      why = ("API group %q serves no resource %q"):format(rest, word)
    elseif version and is_version(version) and by_name[group] then
      why = ("API group %q serves no resource %q at version %s"):format(group, word, version)
    else
      why = ("API group %q is not served"):format(rest)
    end
  end
  answers_of[key] = { absent = why }
  return nil, why
end

-- The resources API group `group` serves ("" the core group), as `kubectl
-- api-resources --api-group` lists them: each resource once, at the group's
-- preferred version, or at the first other version that serves it when the
-- preferred one does not; sorted by name. Each is a table like resolve's.
-- nil and why when the group is not served.
function names.group_resources(c, cache, group)
  validate.arg(3, "api_resources(group)", "group", group, is_group_name,
    { says = 'an API group ("apps", "" for the core group)', show = "not" })
  for _, g in ipairs(groups(c, cache)) do
    if g.name == group then
      local out, seen = {}, {}
      for _, v in ipairs(versions_of(g)) do
        local list, gv = resources(c, cache, g.name, v)
        for _, r in ipairs(list) do
          if not seen[r.name] then
            seen[r.name] = true
            out[#out + 1] = { api_version = gv, plural = r.name, kind = r.kind,
              namespaced = r.namespaced == true, group = g.name, version = v,
              short_names = r.shortNames, verbs = r.verbs }
          end
        end
      end
      table.sort(out, function(a, b) return a.plural < b.plural end)
      return out
    end
  end
  return nil, ("API group %q is not served"):format(group)
end

return names
