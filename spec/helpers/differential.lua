-- A port and its shell original, run on the same fixture, compared object by
-- object (issue 28, item 3), and the rest of what every port's spec shares:
-- its fixture's namespaces, CRDs and version stamp, what it reads of the
-- server and of either side's objects, check's findings. A port's spec keeps
-- its own objects, cases and assertions, nothing else:
--
--   local differential = require("spec.helpers").differential
--   local FLEET = differential.cluster(46, { "cozy-system", "tenant-a" }, { CRD, kubernetes(...) })
--   local d = differential.run(h, 46, FLEET, { faults = {...}, before = function(h) end })
--   assert.same({}, differential.differences(d))   -- the objects' keys that differ
--
-- The shell original is the platform's own script, read at run time from
-- $COZY_PLATFORM_MIGRATIONS (the platform's migrations directory: a checkout of
-- cozystack/cozystack's packages/core/platform/images/migrations/migrations);
-- it is never copied into this repository. It runs under bash with a real,
-- current kubectl first on PATH: $COZY_SPEC_KUBECTL, else the one
-- spec/support/go/build built (go/bin/kubectl), else spec/support/kubectl (which
-- builds it on first use). Neither is optional: a spec that cannot find
-- them fails, naming what is missing, so that a differential case never passes
-- by not running.
local files = require "spec.helpers.files"

local differential = {}

-- Fixtures ------------------------------------------------------------------

--- A Namespace (labels: optional).
function differential.namespace(name, labels)
  return { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels } }
end

-- The open schemas a port's fixture CRD may have: its spec keeps any field, or
-- the whole object does.
local OPEN_SCHEMAS = {
  spec = function()
    return { type = "object", properties = { spec = { type = "object", ["x-kubernetes-preserve-unknown-fields"] = true } } }
  end,
  object = function() return { type = "object", ["x-kubernetes-preserve-unknown-fields"] = true } end,
}

--- A namespaced CRD `plural.group` serving and storing `version` with an open
--- schema (the platform's operators' CRDs stand-ins): opts.short_names, and
--- opts.open, "spec" (the default: its spec keeps any field) or "object".
function differential.crd(group, version, plural, kind, opts)
  opts = opts or {}
  local schema = assert(OPEN_SCHEMAS[opts.open or "spec"], "differential.crd: open is \"spec\" or \"object\"")()
  return { apiVersion = "apiextensions.k8s.io/v1", kind = "CustomResourceDefinition",
    metadata = { name = plural .. "." .. group },
    spec = { group = group, scope = "Namespaced",
      names = { plural = plural, singular = kind:lower(), kind = kind, listKind = kind .. "List",
        shortNames = opts.short_names },
      versions = { { name = version, served = true, storage = true, schema = { openAPIV3Schema = schema } } } } }
end

--- The cluster script n starts from: the namespaces named, the version stamp
--- at n (cozy-system's cozystack-version ConfigMap), then `objects` in order.
function differential.cluster(n, namespaces, objects)
  local items = {}
  for _, name in ipairs(namespaces) do items[#items + 1] = differential.namespace(name) end
  items[#items + 1] = { apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = "cozystack-version", namespace = "cozy-system" }, data = { version = tostring(n) } }
  for _, o in ipairs(objects or {}) do items[#items + 1] = o end
  return items
end

-- Reading the server and the sides ---------------------------------------------

--- The objects of `kind` on h's server, keyed "ns/name" (a cluster-scoped one
--- by its name), each the object or what value(object) makes of it.
function differential.objects_of(h, kind, value)
  local out = {}
  for _, o in ipairs(h:objects()) do
    if o.kind == kind then
      local md = o.metadata
      local key = (md.namespace and (md.namespace .. "/") or "") .. md.name
      if value then out[key] = value(o) else out[key] = o end
    end
  end
  return out
end

--- The PATCHes sent since h's mark whose path matches `pattern`, each as its
--- captures joined with "/", sorted.
function differential.patched(h, pattern)
  local out = {}
  for _, w in ipairs(h:writes()) do
    local captures = w.method == "PATCH" and { w.path:match(pattern) } or {}
    if captures[1] ~= nil then out[#out + 1] = table.concat(captures, "/") end
  end
  table.sort(out)
  return out
end

--- What `side` ("shell" or "port") left of object `key` ("Kind ns/name"), then
--- down the field names given; nil where any of them is absent.
function differential.field(d, side, key, ...)
  local v = d[side].objects[key]
  for _, name in ipairs { ... } do
    if type(v) ~= "table" then return nil end
    v = v[name]
  end
  return v
end

--- check's findings, each as `format` with every field name in it replaced by
--- that field's value ("verb namespace/name" -> "patch tenant-a/alpha"), sorted.
function differential.finding_names(res, format)
  local names = {}
  for _, f in ipairs(res.findings) do
    names[#names + 1] = format:gsub("[%a_]+", function(name) return tostring(f.fields[name]) end)
  end
  table.sort(names)
  return names
end

-- The shell original and the port ---------------------------------------------

local function executable(path)
  return path ~= nil and path ~= "" and files.sh("test -x " .. files.quote(path)) == 0
end

--- The real kubectl the shell originals run with; raises when there is none.
function differential.kubectl()
  for _, path in ipairs { os.getenv("COZY_SPEC_KUBECTL") or "", "spec/support/go/bin/kubectl", "spec/support/kubectl" } do
    if executable(path) then return files.absolute(path) end
  end
  error("differential: no real kubectl (set COZY_SPEC_KUBECTL, or build spec/support/kubectl): "
    .. "the shell originals cannot run, and a differential case does not pass without them", 2)
end

--- The platform's script N (its path); raises when $COZY_PLATFORM_MIGRATIONS does not hold it.
function differential.script(n)
  local dir = os.getenv("COZY_PLATFORM_MIGRATIONS")
  if dir == nil or dir == "" then
    error("differential: COZY_PLATFORM_MIGRATIONS is not set: it names the platform's migrations directory "
      .. "(cozystack/cozystack packages/core/platform/images/migrations/migrations), where script "
      .. tostring(n) .. " is read from", 2)
  end
  local path = dir .. "/" .. tostring(n)
  if files.read(path) == nil then error("differential: " .. path .. " is not readable", 2) end
  return files.absolute(path)
end

--- The counting rule of issue 28 (a port's code at most 1.5x its shell's):
--- a line counts unless it is blank or a comment (`#` in shell, the shebang
--- included; `--` in Lua). Both sides are counted by this one function.
function differential.code_lines(text, comment)
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local s = line:match("^%s*(.-)%s*$")
    if s ~= "" and s:sub(1, #comment) ~= comment then n = n + 1 end
  end
  return n
end

--- { shell =, lua =, ratio = } for migration n: its script's and its port's code lines.
function differential.line_counts(n, port_file)
  local shell = differential.code_lines(assert(files.read(differential.script(n))), "#")
  local lua = differential.code_lines(assert(files.read(port_file)), "--")
  return { shell = shell, lua = lua, ratio = lua / shell }
end

-- What a run leaves that matters: every object but the version stamp (the
-- shell writes it, the port's runner does), without what the server sets
-- differently on every write, and the status the control plane keeps of what
-- a fixture's CRD brings (a CRD's and its APIService's conditions, with their times).
local VOLATILE = { "resourceVersion", "managedFields", "uid", "creationTimestamp", "generation" }

function differential.state(h)
  local out = {}
  for _, o in ipairs(h:objects()) do
    local md = o.metadata or {}
    if not (o.kind == "ConfigMap" and md.name == "cozystack-version") then
      for _, k in ipairs(VOLATILE) do md[k] = nil end
      if o.kind == "CustomResourceDefinition" or o.kind == "APIService" then o.status = nil end
      if md.annotations then
        md.annotations["kubectl.kubernetes.io/last-applied-configuration"] = nil
        if next(md.annotations) == nil then md.annotations = nil end
      end
      out[o.kind .. " " .. (md.namespace and (md.namespace .. "/") or "") .. md.name] = o
    end
  end
  return out
end

--- Runs the platform's script n under bash against h's server, as the legacy
--- runner would (NAMESPACE, CURRENT_VERSION, TARGET_VERSION, KUBECONFIG).
--- Returns { code, stdout, stderr }.
function differential.run_shell(h, n, env)
  local script = differential.script(n)
  local dir = files.tmpdir()
  local bin = dir .. "/bin"
  files.sh("mkdir -p " .. files.quote(bin))
  files.write(bin .. "/kubectl", "#!/bin/sh\nexec " .. files.quote(differential.kubectl()) .. ' "$@"\n')
  files.sh("chmod +x " .. files.quote(bin .. "/kubectl"))
  local vars = { PATH = bin .. ":" .. os.getenv("PATH"), HOME = dir, KUBECONFIG = h.srv.kubeconfig,
    NAMESPACE = "cozy-system", CURRENT_VERSION = tostring(n), TARGET_VERSION = tostring(n + 1) }
  for k, v in pairs(env or {}) do vars[k] = v end
  local assign = {}
  for k, v in pairs(vars) do assign[#assign + 1] = k .. "=" .. files.quote(v) end
  table.sort(assign)
  local out, err = dir .. "/stdout", dir .. "/stderr"
  -- stderr through a pipe: the scripts `tee /dev/stderr`, which on a file would
  -- reopen it from its start and write over what was there
  local code = files.sh(("env %s bash -c %s %s %s %s </dev/null"):format(table.concat(assign, " "),
    files.quote('bash "$0" 2>&1 >"$1" | cat >"$2"; exit "${PIPESTATUS[0]}"'),
    files.quote(script), files.quote(out), files.quote(err)))
  local res = { code = code, stdout = files.read(out) or "", stderr = files.read(err) or "" }
  files.rm_rf(dir)
  return res
end

-- One side: reset to the fixture, prepare, run, keep what it left.
local function side(h, fixture, opts, run)
  h:reset(fixture)
  if opts.before then opts.before(h) end
  h.srv:clear_requests()
  if opts.faults then h:faults(opts.faults) end
  local res = run()
  res.fired = h:fired()
  res.writes = h:writes()
  res.objects = differential.state(h)
  return res
end

--- Runs the shell original, then the port, each from `fixture` with the same
--- preparation (`opts.before(h)`, then the fault rules `opts.faults`), and returns
--- { shell = { code, stdout, stderr, fired, writes, objects },
---   port = { ok, err (nil when ok), result, fired, writes, objects } }.
--- The harness is left with the port's run.
function differential.run(h, n, fixture, opts)
  opts = opts or {}
  local shell = side(h, fixture, opts, function() return differential.run_shell(h, n, opts.env) end)
  local port = side(h, fixture, opts, function()
    local ok, err, res = h:step(n)
    return { ok = ok, err = err, result = res }
  end)
  return { shell = shell, port = port }
end

local function same(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

--- The keys ("Kind ns/name") whose objects differ between the two sides, sorted.
function differential.differences(d)
  local keys, seen = {}, {}
  for k in pairs(d.shell.objects) do seen[k] = true end
  for k in pairs(d.port.objects) do seen[k] = true end
  for k in pairs(seen) do
    if not same(d.shell.objects[k], d.port.objects[k]) then keys[#keys + 1] = k end
  end
  table.sort(keys)
  return keys
end

--- Both sides left the same objects, the shell exiting `code` (default 0) and
--- the port succeeding when that is 0, failing otherwise.
function differential.same_as_shell(d, code)
  -- luassert: a required module sees Lua's own assert, not the one busted gives specs
  local expect = require "luassert"
  expect.equal(code or 0, d.shell.code, d.shell.stderr)
  expect.equal(code == nil or code == 0, d.port.ok, tostring(d.port.err))
  expect.same({}, differential.differences(d))
end

return differential
