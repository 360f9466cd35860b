-- Helpers of the campaign specs (fault matrix, crash-resume, two runners,
-- valgrind): a fleet for migration 59 (the built-in one), a fake API server
-- with a token the runner reads from a tokenFile (so that a rotation can
-- reach it), the state a run leaves, and the VM PATCHes that landed.
local fake = require "spec.support.fake"
local generate = require "spec.fixtures.59-vmi-hotplug.generate"
local scenarios = require "spec.fixtures.59-vmi-hotplug.scenarios"
local runner = require "spec.helpers.cli"
local json = require "cozy.json"

local campaign = { runner = runner, poll = runner.poll, quote = runner.quote }

local VMS_PATH = "^/apis/kubevirt%.io/v1/namespaces/([^/]+)/virtualmachines/([^/]+)$"
campaign.VMS_PATH = VMS_PATH

local write = require("spec.helpers.files").write

-- A fleet of `count` VMs, each with its running VMI; every third VM's VMI
-- holds a hotplugged volume its VM lacks. Written to a JSON file in `dir`;
-- returns the path and the VMs that need the copy ("ns/name" -> volume).
function campaign.fleet(dir, count)
  local list, needs = scenarios.big(count, 3)
  local path = ("%s/fleet-%d.json"):format(dir, count)
  write(path, generate.encode(list))
  return path, needs
end

-- A fake API server loaded with `fixture`, requiring a token, and a
-- kubeconfig (srv.kubeconfig_file) that reads it from srv.token_file.
-- opts.tls (default true): HTTPS; without it, plain HTTP, which spares a
-- TLS handshake per write (writes go out on fresh connections) where TLS
-- is not what a spec is about.
function campaign.server(fixture, dir, opts)
  local tls = not (opts and opts.tls == false)
  local srv = fake.start { fixtures = { fixture }, tls = tls, token = "t-0" }
  srv.token_file = dir .. "/token"
  write(srv.token_file, "t-0\n")
  local f = assert(io.open(srv.kubeconfig))
  local text = f:read("a")
  f:close()
  -- the fake quotes the token, the real server's kubeconfig does not
  local replaced, n = text:gsub('\n    token: "?t%-0"?\n', '\n    tokenFile: "' .. srv.token_file .. '"\n')
  assert(n == 1, "the server's kubeconfig has no token line: " .. text)
  srv.kubeconfig_file = dir .. "/kubeconfig"
  write(srv.kubeconfig_file, replaced)
  return srv
end

-- The args of `cozy-migrate run` (the built-in migrations) against srv.
function campaign.args(srv, ...)
  local args = { "run", "--kubeconfig", srv.kubeconfig_file }
  for _, a in ipairs({ ... }) do args[#args + 1] = a end
  return args
end

-- What a run leaves that matters: every VM and VMI without its
-- resourceVersion (which counts writes, concurrent ones included) nor what a
-- real server writes of its own when it stores an object (uid,
-- creationTimestamp, managedFields: a reset of the real server makes the
-- object again), and the stamp's version and the numbers of its completed
-- steps' history records (a failed attempt's record, which a failure may or
-- may not get written, is the failure's business: e2e/runner/failure_spec). Leases are
-- left out (a run that could not release leaves its lease to expire).
-- An ownerReference's uid reads as the object it names ("owner Kind
-- ns/name"), or "foreign" when it names none (a deliberate mismatch).
function campaign.state(srv)
  local out = { objects = {} }
  local objects, by_uid = srv:objects(), {}
  for _, o in ipairs(objects) do
    by_uid[o.metadata.uid or ""] = ("owner %s %s/%s"):format(o.kind, o.metadata.namespace or "", o.metadata.name)
  end
  for _, o in ipairs(objects) do
    if o.kind == "VirtualMachine" or o.kind == "VirtualMachineInstance" then
      o.metadata.resourceVersion = nil
      o.metadata.uid, o.metadata.creationTimestamp, o.metadata.managedFields = nil, nil, nil
      for _, ref in ipairs(o.metadata.ownerReferences or {}) do ref.uid = by_uid[ref.uid] or "foreign" end
      out.objects[o.kind .. " " .. o.metadata.namespace .. "/" .. o.metadata.name] = o
    elseif o.kind == "ConfigMap" and o.metadata.name == "cozystack-version" then
      out.version = o.data.version
      local numbers = {}
      for _, h in ipairs(json.decode(o.data.history or "[]")) do
        if h.result ~= "failed" then numbers[#numbers + 1] = h.number end
      end
      out.history = numbers
    end
  end
  return out
end

-- Names in a list that occur more than once (a volume or disk added twice).
local function duplicates(items)
  local seen, dup = {}, {}
  for _, item in ipairs(items or {}) do
    if seen[item.name] then dup[#dup + 1] = item.name end
    seen[item.name] = true
  end
  return dup
end

-- Every VM whose volumes or disks name something twice, as "ns/name: x".
function campaign.duplicated(state)
  local out = {}
  for key, o in pairs(state.objects) do
    if o.kind == "VirtualMachine" then
      local spec = o.spec.template.spec
      local disks = spec.domain and spec.domain.devices and spec.domain.devices.disks
      for _, name in ipairs(duplicates(spec.volumes)) do out[#out + 1] = key .. ": volume " .. name end
      for _, name in ipairs(duplicates(disks)) do out[#out + 1] = key .. ": disk " .. name end
    end
  end
  table.sort(out)
  return out
end

-- Asserts that each object of `got` equals the same object of one of the
-- states given (e.g. the fleet before the run, or after it): no object is
-- half-done or different from both. Returns how many equal the last one.
function campaign.assert_each_of(got, states, where)
  local done = 0
  for key, o in pairs(got.objects) do
    local match
    for i, s in ipairs(states) do
      if s.objects[key] ~= nil and campaign.same(s.objects[key], o) then match = i end
    end
    assert(match, (where or "") .. ": " .. key .. " is neither as before nor as after the migration")
    if match == #states then done = done + 1 end
  end
  for key in pairs(states[1].objects) do
    assert(got.objects[key] ~= nil, (where or "") .. ": " .. key .. " is gone")
  end
  return done
end

-- Deep equality of decoded JSON values.
function campaign.same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not campaign.same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- The VMs ("ns/name" -> count) whose PATCH the server answered with a 2xx,
-- over the whole request log (or the log given).
function campaign.vm_patches(srv, log)
  local out = {}
  for _, e in ipairs(log or srv:requests { method = "PATCH" }) do
    local ns, name = tostring(e.path):match(VMS_PATH)
    if ns and e.method == "PATCH" and type(e.status) == "number" and e.status >= 200 and e.status < 300 then
      local key = ns .. "/" .. name
      out[key] = (out[key] or 0) + 1
    end
  end
  return out
end

-- Asserts that the VMs patched are exactly `needs`, each once.
function campaign.assert_patched_once(srv, needs, where, log)
  local patched = campaign.vm_patches(srv, log)
  for key, n in pairs(patched) do
    assert(needs[key], ("%s: %s was patched but did not need the copy"):format(where, key))
    assert(n == 1, ("%s: %s was patched %d times"):format(where, key, n))
  end
  for key in pairs(needs) do
    assert(patched[key], ("%s: %s needed the copy and was never patched"):format(where, key))
  end
end

function campaign.count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

function campaign.tmpdir()
  return runner.tmpdir()
end

function campaign.rmdir(dir)
  if dir then require("spec.helpers.files").rm_rf(dir) end
end

return campaign
