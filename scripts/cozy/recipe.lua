-- Whole migrations built from a description, for the platform's one-command
-- scripts (`kubectl delete ... --ignore-not-found`): the migration table,
-- its permissions and its walk, so that such a port is as short as its
-- shell (docs/engine-api.md, "Recipes"). Pure Lua over ctx; in the sandbox.
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

-- "plural" (core) or "plural.group" → plural, group; raises on anything else.
local function parse(name)
  if type(name) ~= "string" then refuse(3, "the resource (item 1) must be a string, got %s", type(name)) end
  local plural, group = name:match("^([a-z0-9-]+)%.([a-z0-9.-]+)$")
  if plural == nil then plural, group = name:match("^([a-z0-9-]+)$"), "" end
  if plural == nil then
    refuse(3, "resource %q: name it as plural (core) or plural.group, in lowercase (\"deployments.apps\")", name)
  end
  if group:match("^v%d[a-z0-9]*%.") then
    refuse(3, "resource %q: no version (\"deployments.v1.apps\"): name it plural.group, served at the server's version", name)
  end
  if group == "" and not CORE[plural] then
    refuse(3, "resource %q: not a core plural; a short name or kind needs discovery to know its permission: "
      .. "name it plural or plural.group (\"persistentvolumeclaims\", \"deployments.apps\")", name)
  end
  return plural, group
end

--- A resource named plural or plural.group as plural, group (raises on
--- anything else): what cozy.rule derives a selection's permissions from.
function recipe.resource_name(name)
  if type(name) ~= "string" then refuse(2, "the resource must be a string, got %s", type(name)) end
  return parse(name)
end

--- The permissions of `verbs` on a resource named plural or plural.group (or
--- on each of a list of them), for a migration's `permissions`: known at load
--- time, like the recipes'.
---   permissions = recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "get", "patch" })
--- opts: namespace (the grant's), check_only (as a permission's own field).
function recipe.permissions(resources, verbs, opts)
  if type(resources) ~= "table" then resources = { resources } end
  if type(verbs) ~= "table" or #verbs == 0 then refuse(2, "permissions(resource, verbs): verbs must be a list of verbs") end
  if opts ~= nil and type(opts) ~= "table" then refuse(2, "permissions(resource, verbs, opts): opts must be a table") end
  opts = opts or {}
  local out = {}
  for _, resource in ipairs(resources) do
    local plural, group = parse(resource)
    for i, verb in ipairs(verbs) do
      if type(verb) ~= "string" or not verb:match("^[a-z]+$") then refuse(2, "permissions: verb %d must be a lowercase word", i) end
      out[#out + 1] = { verb = verb, group = group, resource = plural, namespace = opts.namespace, check_only = opts.check_only }
    end
  end
  return out
end

--- A migration that deletes one object if it is there, as
--- `kubectl delete <resource> <name> [--namespace ns] --ignore-not-found`:
---   recipe.delete{ "deployments.apps", namespace = "ns", name = "x", description = "..." }
--- Its permissions are get and delete on that resource (in that namespace when
--- given). Its walk reads the object first, so that check lists the delete only
--- when there is something to delete; an API the server does not serve (a CRD
--- not installed) and an absent object are nothing to do, logged; an object
--- deleted between the read and the delete is done.
function recipe.delete(spec)
  if type(spec) ~= "table" then refuse(2, "delete{...}: expected a table, got %s", type(spec)) end
  local name, plural, group = spec.name, parse(spec[1])
  if type(name) ~= "string" or name == "" then refuse(2, "delete{...}: name must be a non-empty string") end
  if type(spec.description) ~= "string" then refuse(2, "delete{...}: description must be a string") end
  local ns = spec.namespace
  if ns ~= nil and (type(ns) ~= "string" or ns == "") then refuse(2, "delete{...}: namespace must be a non-empty string") end
  local where = ns and (ns .. "/" .. name) or name

  return {
    description = spec.description,
    timeout = spec.timeout,
    permissions = recipe.permissions(spec[1], { "get", "delete" }, { namespace = ns }),
    walk = function(ctx)
      local res, about = ctx.kube:lookup(spec[1])
      if res == nil then return ctx.log:info(("%s: %s: nothing to delete"):format(spec[1], about)) end
      -- what lookup resolved must be what the permissions name
      if about.plural ~= plural or about.group ~= group then
        error(("cozy.recipe: %q is %s.%s on this server, not the plural.group its permissions name")
          :format(spec[1], about.plural, about.group), 0)
      end
      if about.namespaced ~= (ns ~= nil) then
        error(("cozy.recipe: %s is %s: %s"):format(spec[1], about.namespaced and "namespaced" or "cluster-scoped",
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
