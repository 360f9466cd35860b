-- Writes the generated RBAC into templates/migration-hook.yaml, between its
-- "BEGIN rbac"/"END rbac" and "BEGIN preflight-rbac"/"END preflight-rbac"
-- comment lines, from the built-in migrations' declared permissions: what
-- `cozy-migrate rbac --all` (and `--all --preflight`) print, as hooks that
-- exist only for the run. The rest of the template is written by hand.
-- spec/e2e/deploy/helm_spec.lua fails when the committed file drifts.
--
--   build/cozy-migrate lua deploy/helm/generate-rbac.lua [OUTDIR]
--
-- reads deploy/helm/templates/migration-hook.yaml, writes
-- OUTDIR/migration-hook.yaml (default: in place).
local discovery = require "cozy.runner.discovery"
local rbac = require "cozy.rbac"

local template = "deploy/helm/templates/migration-hook.yaml"
local outdir = arg[1] or "deploy/helm/templates"
local set = discovery.discover{ builtin = true }
local namespace = "{{ .Release.Namespace }}"

-- Hooks before the preflight Job (weight 0); deleted once every hook of the
-- upgrade succeeded (cluster-admin included, it lives only for that run), kept
-- after a failure until the next attempt recreates them.
local function hook(objects)
  for _, o in ipairs(objects) do
    o.metadata.annotations = o.metadata.annotations or {}
    o.metadata.annotations["helm.sh/hook"] = "pre-upgrade,pre-install"
    o.metadata.annotations["helm.sh/hook-weight"] = "-1"
    o.metadata.annotations["helm.sh/hook-delete-policy"] = "before-hook-creation,hook-succeeded"
  end
  return objects
end

local function slurp(path)
  local f = assert(io.open(path))
  local text = f:read("a")
  f:close()
  return text
end

-- Replaces what lies between the BEGIN and END lines of region `name`.
local function fill(text, name, content)
  name = name:gsub("%p", "%%%0")
  local begin_at, begin_end = text:find("\n[^\n]*BEGIN " .. name .. ":[^\n]*\n")
  assert(begin_at, template .. ": no BEGIN " .. name .. " line")
  local end_at = text:find("[^\n]*END " .. name .. " %*/}}\n", begin_end + 1)
  assert(end_at, template .. ": no END " .. name .. " line")
  return text:sub(1, begin_end) .. content .. text:sub(end_at)
end

-- The generated text ends with a newline; a template line follows it.
local objects = hook(rbac.objects(set.migrations, { namespace = namespace }))
local migration = rbac.yaml(objects)
  .. "{{- if $legacy }}\n"
  .. rbac.yaml(hook({ rbac.cluster_admin_binding(namespace) }))
  .. "{{- end }}\n"
local preflight = rbac.yaml(hook(rbac.objects(set.migrations, { namespace = namespace, preflight = true })))

local text = fill(fill(slurp(template), "rbac", migration), "preflight-rbac", preflight)
local path = outdir .. "/migration-hook.yaml"
local f = assert(io.open(path, "w"))
f:write(text)
f:close()
io.stdout:write(path, "\n")
