-- Whole migrations built from a description, for the platform's one-command
-- scripts (`kubectl delete ... --ignore-not-found`): the migration table,
-- its permissions and its walk, so that such a port is as short as its
-- shell (docs/engine-api.md, "Recipes"). Pure Lua over ctx; in the sandbox.
local validate = require "cozy.validate"

---@class cozy.Permission a grant a migration declares in `permissions`
---@field verb string
---@field group? string "" the core group
---@field resource string the plural
---@field namespace? string
---@field check_only? boolean

--- what a migration file returns (docs/engine-api.md, "The migration table")
---@class cozy.MigrationTable
---@field description string
---@field permissions? cozy.Permission[]
---@field timeout? number seconds
---@field run? fun(ctx: cozy.Ctx)
---@field check? fun(ctx: cozy.Ctx)
---@field walk? fun(ctx: cozy.Ctx)

---@class cozy.recipe
local recipe = {}

-- The core group's resources: a name without a group must be one of them,
-- so that its permission is known at load time. kubectl's short names
-- ("pvc", "cm", "deploy") would need discovery to become the plural RBAC
-- grants on, so they are refused rather than guessed.
local CORE = {}
for p in ([[bindings componentstatuses configmaps endpoints events limitranges namespaces nodes
  persistentvolumeclaims persistentvolumes pods podtemplates replicationcontrollers resourcequotas
  secrets serviceaccounts services]]):gmatch("%S+") do CORE[p] = true end

-- Raises naming the migration file's line that called recipe.delete: `level`
-- counts from refuse's caller (2 from delete itself, 3 from parse).
local function refuse(level, fmt, ...)
  error("cozy.recipe: " .. fmt:format(...), level + 1)
end

local function is_list(v) return type(v) == "table" and #v > 0 end
local function is_word(v) return type(v) == "string" and v:match("^[a-z]+$") ~= nil end

-- "plural" (core) or "plural.group" → plural, group; raises on anything else.
local function parse(name)
  validate.arg(3, "cozy.recipe", "the resource (item 1)", name, "string", { show = "got" })
  local plural, group = name:match("^([a-z0-9-]+)%.([a-z0-9.-]+)$")
  if plural == nil then plural, group = name:match("^([a-z0-9-]+)$"), "" end
  if plural == nil then
    refuse(3,
      "resource %q: name it as plural (core) or plural.group, in lowercase (\"deployments.apps\")",
      name)
  end
  if group:match("^v%d[a-z0-9]*%.") then
    refuse(3,
      "resource %q: no version (\"deployments.v1.apps\"): name it plural.group, served at the "
      .. "server's version", name)
  end
  if group == "" and not CORE[plural] then
    refuse(3,
      "resource %q: not a core plural; a short name or kind needs discovery to know "
      .. "its permission: "
      .. "name it plural or plural.group (\"persistentvolumeclaims\", \"deployments.apps\")", name)
  end
  return plural, group
end

--- A resource named plural or plural.group as plural, group (raises on
--- anything else): what cozy.rule derives a selection's permissions from.
---@param name string "deployments.apps", "configmaps"
---@return string plural, string group
function recipe.resource_name(name)
  validate.arg(2, "cozy.recipe", "the resource", name, "string", { show = "got" })
  return parse(name)
end

--- The permissions of `verbs` on a resource named plural or plural.group (or
--- on each of a list of them), for a migration's `permissions`: known at load
--- time, like the recipes'.
---   permissions = recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "get", "patch" })
--- opts: namespace (the grant's), check_only (as a permission's own field).
---@param resources string|string[] plural (core) or plural.group, or a list of them
---@param verbs string[] lowercase verbs ("get", "list", "patch", ...)
---@param opts? { namespace?: string, check_only?: boolean }
---@return cozy.Permission[]
function recipe.permissions(resources, verbs, opts)
  if type(resources) ~= "table" then resources = { resources } end
  validate.arg(2, "cozy.recipe: permissions(resource, verbs)", "verbs", verbs, is_list,
    { says = "a list of verbs" })
  validate.arg(2, "cozy.recipe: permissions(resource, verbs, opts)", "opts", opts, "table", true)
  opts = opts or {}
  local out = {}
  for _, resource in ipairs(resources) do
    local plural, group = parse(resource)
    for i, verb in ipairs(verbs) do
      validate.arg(2, "cozy.recipe: permissions", ("verb %d"):format(i), verb, is_word,
        { says = "a lowercase word" })
      out[#out + 1] = { verb = verb, group = group, resource = plural, namespace = opts.namespace,
        check_only = opts.check_only }
    end
  end
  return out
end

---@class cozy.DeleteSpec what recipe.delete deletes, and the migration's own fields
---@field [1] string
---@field name string
---@field namespace? string
---@field description string
---@field timeout? number

--- A migration that deletes one object if it is there, as
--- `kubectl delete <resource> <name> [--namespace ns] --ignore-not-found`:
---   recipe.delete{ "deployments.apps", namespace = "ns", name = "x", description = "..." }
--- Its permissions are get and delete on that resource (in that namespace when
--- given). Its walk reads the object first, so that check lists the delete only
--- when there is something to delete; an API the server does not serve (a CRD
--- not installed) and an absent object are nothing to do, logged; an object
--- deleted between the read and the delete is done.
---@param spec cozy.DeleteSpec the resource (plural or plural.group) and the object
---@return cozy.MigrationTable migration
function recipe.delete(spec)
  validate.arg(2, "cozy.recipe: delete{...}", "its argument", spec, "table", { show = "got" })
  local name, plural, group = spec.name, parse(spec[1])
  local ns = spec.namespace
  validate.args(2, "cozy.recipe: delete{...}", {
    { "name", name, "non-empty string" },
    { "description", spec.description, "string" },
    { "namespace", ns, "non-empty string", true },
  })
  local where = ns and (ns .. "/" .. name) or name

  return {
    description = spec.description,
    timeout = spec.timeout,
    permissions = recipe.permissions(spec[1], { "get", "delete" }, { namespace = ns }),
    walk = function(ctx)
      local res, about = ctx.kube:lookup(spec[1])
      if res == nil then
        return ctx.log:info(("%s: %s: nothing to delete"):format(spec[1], about))
      end
      -- what lookup resolved must be what the permissions name
      if about.plural ~= plural or about.group ~= group then
        error(("cozy.recipe: %q is %s.%s on this server, not the plural.group its permissions name")
          :format(spec[1], about.plural, about.group), 0)
      end
      if about.namespaced ~= (ns ~= nil) then
        error(("cozy.recipe: %s is %s: %s"):format(spec[1],
          about.namespaced and "namespaced" or "cluster-scoped",
          about.namespaced and "give its namespace" or "give no namespace"), 0)
      end
      local args = ns and { ns, name } or { name }
      if res:find(table.unpack(args)) == nil then
        return ctx.log:info(("%s %s absent: nothing to delete"):format(about.kind, where))
      end
      ctx.log:change("{Deleting|Would delete} %s %s", about.kind, where)
      args[#args + 1] = { absent = "skip" }
      res:delete(table.unpack(args))
    end,
  }
end

return recipe
