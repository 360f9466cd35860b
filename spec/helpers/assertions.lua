-- The harness's luassert assertions (spec/README.md). Each acts on the
-- harness given as its last argument, else on the current one (the harness
-- whose before_each ran last):
--
--   assert.no_writes([h])                   nothing but reads and access reviews since the reset/mark
--   assert.migration_idempotent(n[, h])     n twice: the second run sends no write, objects unchanged
--   assert.permissions_complete(n[, h])     n's check and run under exactly the RBAC `cozy-migrate rbac`
--                                           grants it, the run's first PATCH and PUT meeting a
--                                           conflict: no request refused
local harness = require "spec.helpers"

local assertions = {}

local function describe_entry(e)
  local s = ("%s %s"):format(e.method, e.path)
  if e.query and e.query ~= "" then s = s .. "?" .. e.query end
  return s .. " -> " .. tostring(e.status)
end

local function list(entries)
  local out = {}
  for i, e in ipairs(entries) do
    if i > 20 then
      out[#out + 1] = ("  ... and %d more"):format(#entries - 20)
      break
    end
    out[#out + 1] = "  " .. describe_entry(e)
  end
  return table.concat(out, "\n")
end

-- An object with the bookkeeping a write moves, for "identical" comparisons
-- only through what they show; a no-op run moves nothing, so all of it is kept.
local function by_key(objects)
  local out = {}
  for _, o in ipairs(objects) do
    out[(o.apiVersion or "") .. " " .. o.kind .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name] = o
  end
  return out
end

local function changed_keys(before, after)
  local a, b = by_key(before), by_key(after)
  local util = require "luassert.util"
  local out = {}
  for k, o in pairs(a) do
    if b[k] == nil then out[#out + 1] = "removed " .. k
    elseif not util.deepcompare(o, b[k], true) then out[#out + 1] = "changed " .. k end
  end
  for k in pairs(b) do
    if a[k] == nil then out[#out + 1] = "added " .. k end
  end
  table.sort(out)
  return out
end

function assertions.no_writes(state, arguments)
  local h = harness.resolve(arguments[1])
  local writes = h:writes()
  if #writes > 0 then
    state.failure_message = ("%d write(s) since the reset or mark:\n%s"):format(#writes, list(writes))
    return false
  end
  return true
end

function assertions.migration_idempotent(state, arguments)
  local n = arguments[1]
  local h = harness.resolve(arguments[2])
  h:migrate(n)
  local after_first = h:objects()
  h:mark()
  local second = h:migrate(n)
  local writes = h:writes()
  local changed = changed_keys(after_first, h:objects())
  if #writes > 0 or #changed > 0 then
    state.failure_message = ("migration %s is not idempotent: its second run sent %d write(s)%s%s"
      .. "\n--- second run's log:\n%s")
      :format(tostring(n), #writes, #writes > 0 and (":\n" .. list(writes)) or "",
        #changed > 0 and ("\nand changed objects:\n  " .. table.concat(changed, "\n  ")) or "", second.log)
    return false
  end
  return true
end

-- The allow rules of the RBAC objects `cozy-migrate rbac` makes for m
-- (preflight: the check Job's read-only variant), flattened for the fake.
function assertions.allow_rules(m, namespace, preflight)
  local rbac = require "cozy.rbac"
  local objects = rbac.objects({ m }, { namespace = namespace, preflight = preflight })
  local rules = {}
  for _, o in ipairs(objects) do
    if o.kind == "ClusterRole" or o.kind == "Role" then
      local ns = o.kind == "Role" and o.metadata.namespace or nil
      for _, r in ipairs(o.rules) do
        for _, group in ipairs(r.apiGroups or {}) do
          for _, resource in ipairs(r.resources or {}) do
            for _, verb in ipairs(r.verbs) do
              local names = r.resourceNames or { false }
              for _, name in ipairs(names) do
                rules[#rules + 1] = { verb = verb, group = group, resource = resource, namespace = ns,
                  name = name or nil }
              end
            end
          end
        end
      end
    end
  end
  return rules
end

-- The refused requests of the log, each with the declaration that covers it.
local function refused(h)
  local request = require "cozy.kube.request"
  local out = {}
  for _, e in ipairs(h:requests()) do
    if e.status == 403 then
      local a = request.attributes(e.method, e.path, e.query)
      out[#out + 1] = ("  %s: declare %s%s"):format(describe_entry(e), request.declaration(a),
        a.namespace and (" (namespace " .. a.namespace .. ")") or "")
    end
  end
  return out
end

-- A client whose step views carry no permission list: every request the
-- migration makes reaches the fake, whose allow list is then the only judge
-- (a 403 is logged even where the migration catches the error it raises;
-- the engine's own refusal would have been raised before the request, unseen).
local function unguarded_client(h, mode, log)
  local client = h:client(mode, log)
  local view = client.view
  client.view = function(self, gate)
    gate.permissions = nil
    return view(self, gate)
  end
  return client
end

-- The run pass meets a concurrent writer at its first PATCH and its first
-- PUT, so that the re-read after a conflict runs under the granted RBAC too:
-- a `get` used only then is otherwise never asked for.
local CONFLICTS = { { method = "PATCH", times = 1, bump = true }, { method = "PUT", times = 1, bump = true } }

function assertions.permissions_complete(state, arguments)
  local n = arguments[1]
  local h = harness.resolve(arguments[2])
  local m = harness.load(n)
  local problems = {}
  local ok_all = true
  if #h.srv:control("GET", "/_fake/faults") > 0 then
    error("assert.permissions_complete sets fault rules of its own: call it before the test adds any", 2)
  end
  -- check first: it is read-only, and the preflight Job runs it with the read verbs only
  for _, pass in ipairs { { mode = "check", preflight = true }, { mode = "run", preflight = false } } do
    if pass.mode ~= "check" or m.definition.check then
      h:allow(assertions.allow_rules(m, h.namespace, pass.preflight))
      if pass.mode == "run" then h:faults(CONFLICTS) end
      h:mark()
      local captured = harness.capture_log()
      local client = unguarded_client(h, pass.mode, captured.log)
      local ok, err = pcall(require("cozy.runner").run_migration, m,
        { client = client, log = captured.log, mode = pass.mode, namespace = h.namespace })
      client:close()
      local denied = refused(h)
      h:allow(nil)
      h.srv:clear_faults()
      if not ok or #denied > 0 then
        ok_all = false
        problems[#problems + 1] = ("%s (%s RBAC): %s%s"):format(pass.mode, pass.preflight and "preflight" or "hook",
          ok and "completed" or ("failed: " .. tostring(err)),
          #denied > 0 and (", refused:\n" .. table.concat(denied, "\n")) or "")
      end
    end
  end
  if not ok_all then
    state.failure_message = ("migration %s: its permissions are incomplete or it failed under them:\n%s")
      :format(m.name, table.concat(problems, "\n"))
  end
  return ok_all
end

-- Registers the assertions with luassert (the .busted helper does it once).
function assertions.register(assert)
  local say = require "say"
  for _, name in ipairs { "no_writes", "migration_idempotent", "permissions_complete" } do
    say:set("assertion." .. name .. ".positive", "Expected " .. name:gsub("_", " ") .. " (see above)")
    say:set("assertion." .. name .. ".negative", "Expected not " .. name:gsub("_", " "))
    assert:register("assertion", name, assertions[name], "assertion." .. name .. ".positive",
      "assertion." .. name .. ".negative")
  end
end

return assertions
