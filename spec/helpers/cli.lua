-- Running cozy-migrate from specs: the binary (COZY_MIGRATE_BIN, else
-- build/cozy-migrate) in the foreground or the background, any shell command
-- line with its output captured, polling with a bound, and the fixtures and
-- arguments the runner's e2e specs share. The harness (spec/helpers/init.lua)
-- runs its CLI commands through here.
local files = require "spec.helpers.files"

local cli = {}

cli.bin = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"

local q = files.quote
cli.quote = q
cli.slurp = files.read
cli.lines = files.lines

-- A temporary migrations directory holding `migrations` (file name -> source).
function cli.migration_dir(migrations)
  local dir = cli.tmpdir()
  for name, source in pairs(migrations) do files.write(dir .. "/" .. name, source) end
  return dir
end

function cli.tmpdir()
  return files.tmpdir("cozy-runner-spec")
end

-- Variables of the host environment that would change what a command does:
-- unset unless a spec gives them.
local CLEAN_ENV = { NAMESPACE = false, TARGET_VERSION = false, CURRENT_VERSION = false, POD_NAME = false,
  POD_NAMESPACE = false, COZY_MIGRATE_TERMINATION_LOG = false }

local function merged_env(env)
  local e = {}
  for k, v in pairs(CLEAN_ENV) do e[k] = v end
  for k, v in pairs(env or {}) do e[k] = v end
  return e
end

local function command_line(args, env)
  local parts = { "exec env" }
  -- env wants its -u options before the assignments
  for k, v in pairs(env or {}) do
    if v == false then parts[#parts + 1] = "-u " .. k end
  end
  for k, v in pairs(env or {}) do
    if v ~= false then parts[#parts + 1] = q(k .. "=" .. v) end
  end
  parts[#parts + 1] = q(cli.bin)
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  return table.concat(parts, " ")
end

-- Runs a shell command line, stdin from /dev/null (or the text `stdin`);
-- returns { code =, stdout =, stderr = } (code 128 + N when killed by signal N).
function cli.shell(cmdline, stdin)
  local dir = cli.tmpdir()
  local input = "/dev/null"
  if stdin then
    input = dir .. "/in"
    files.write(input, stdin)
  end
  local code = files.sh(("(%s) >%s 2>%s <%s"):format(cmdline, q(dir .. "/out"), q(dir .. "/err"), q(input)))
  local res = { code = code, stdout = files.read(dir .. "/out") or "", stderr = files.read(dir .. "/err") or "" }
  files.rm_rf(dir)
  return res
end

-- Runs cozy-migrate with `args` (an array); returns { code =, stdout =, stderr = }.
-- env: name -> value, or false to unset (NAMESPACE, TARGET_VERSION... are
-- unset unless given, so the host environment does not leak in).
function cli.run(args, env, stdin)
  return cli.shell(command_line(args, merged_env(env)), stdin)
end

-- A temporary source tree that specs can run in: `.busted`, spec/helpers,
-- spec/support and an empty migrations/ (e.g. for `new`'s scaffold, or a
-- guide's example). Returns its path; the caller removes it (files.rm_rf).
function cli.spec_tree()
  local tree = files.tmpdir("cozy-spec-tree")
  local code = files.sh(("mkdir -p %s/spec/migrations %s/migrations && cp .busted %s/ "
    .. "&& cp -r spec/helpers spec/support %s/spec/"):format(q(tree), q(tree), q(tree), q(tree)))
  assert(code == 0, "could not copy the harness into " .. tree)
  return tree
end

-- Runs a shell command line from `tree`, with COZY_MIGRATE_BIN set to this
-- build's binary (absolute) and COZY_SPEC_MIGRATIONS unset.
function cli.in_tree(tree, cmdline)
  return cli.shell(("cd %s && env -u COZY_SPEC_MIGRATIONS COZY_MIGRATE_BIN=%s %s")
    :format(q(tree), q(files.absolute(cli.bin)), cmdline))
end

-- Runs busted on `spec` inside `tree`, inside the host; returns { code, stdout, stderr }.
function cli.busted_in(tree, spec)
  return cli.in_tree(tree, ("%s lua /usr/bin/busted --output=plainTerminal %s")
    :format(q(files.absolute(cli.bin)), q(spec)))
end

local Proc = {}
Proc.__index = Proc

-- Starts cozy-migrate in the background; returns a Proc. opts.gate: a
-- path; the process waits until it exists before cozy-migrate starts, so
-- that a spec can release several at the same moment (cli.open_gate).
function cli.start(args, env, opts)
  local dir = cli.tmpdir()
  local cmdline = command_line(args, merged_env(env))
  if opts and opts.gate then
    cmdline = ("while [ ! -e %s ]; do sleep 0.005; done; %s"):format(q(opts.gate), cmdline)
  end
  os.execute(("sh -c %s >/dev/null 2>&1 </dev/null &"):format(q(
    ("(%s) >%s 2>%s </dev/null & echo $! >%s; wait $!; echo $? >%s"):format(
      cmdline, q(dir .. "/out"), q(dir .. "/err"), q(dir .. "/pid"), q(dir .. "/rc")))))
  local self = setmetatable({ dir = dir }, Proc)
  assert(cli.poll(5, function()
    self.pid = tonumber((files.read(dir .. "/pid") or ""):match("%d+"))
    return self.pid
  end), "background cozy-migrate did not start")
  return self
end

-- Releases the processes started with opts.gate = path.
function cli.open_gate(path)
  files.write(path, "")
end

function Proc:done()
  local rc = files.read(self.dir .. "/rc")
  return rc and rc:match("%d+") and tonumber(rc:match("%d+")) or nil
end

-- Waits (bounded) for exit; returns { code =, stdout =, stderr = }.
function Proc:wait(timeout)
  local code = cli.poll(timeout or 60, function() return self:done() end)
  assert(code, "cozy-migrate did not exit within " .. tostring(timeout or 60) .. "s: " .. self:stderr())
  return { code = code, stdout = files.read(self.dir .. "/out") or "", stderr = self:stderr() }
end

function Proc:stderr() return files.read(self.dir .. "/err") or "" end

function Proc:kill(sig)
  os.execute("kill -" .. (sig or "KILL") .. " " .. self.pid .. " 2>/dev/null")
end

function Proc:cleanup()
  if not self:done() then self:kill("KILL") end
  cli.poll(5, function() return self:done() end)
  files.rm_rf(self.dir)
end

-- Calls fn every `step` seconds until it returns a truthy value (returned)
-- or `timeout` seconds pass (nil). Inside the host only (cozy.sys).
function cli.poll(timeout, fn, step)
  local sys = require "cozy.sys"
  local deadline = sys.monotime() + timeout
  repeat
    local v = fn()
    if v then return v end
    sys.sleep(step or 0.02)
  until sys.monotime() > deadline
  return nil
end

-- Is pid a live process (not gone, not a zombie)? Read from /proc, as
-- `kill -0` also answers for a zombie.
function cli.alive(pid)
  local stat = files.read(("/proc/%d/stat"):format(pid))
  return stat ~= nil and stat:match("%) (%a)") ~= "Z"
end

-- The pids a script wrote into `path`, one a line, once there are n of them
-- (polled for up to 20 s: it writes them as it goes); nil if they never come.
function cli.pids(path, n)
  return cli.poll(20, function()
    local got = {}
    for line in (files.read(path) or ""):gmatch("%d+") do got[#got + 1] = tonumber(line) end
    return #got >= n and got or nil
  end)
end

-- Is this request-log entry a write, i.e. does it change state? An access
-- review (self or not) persists nothing: it is a read in all but method.
function cli.is_write(entry)
  local path = tostring(entry.path)
  return entry.method ~= "GET" and entry.method ~= "HEAD"
    and not path:match("subjectaccessreviews$") and not path:match("/selfsubjectreviews$")
end

-- Requests of the fake that change state (what "no write" means).
function cli.writes(srv)
  local out = {}
  for _, r in ipairs(srv:requests()) do
    if cli.is_write(r) then out[#out + 1] = r end
  end
  return out
end

-- A fixture: the namespace, the version ConfigMap at `version` (nil: no
-- ConfigMap, a fresh install) and `extra` objects: for srv:reset(...), and
-- fake.start{ fixtures = { cli.fixture(...) } }.
function cli.fixture(version, extra, labels)
  local items = { { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } } }
  if version then
    items[#items + 1] = { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "cozystack-version", namespace = "cozy-system", labels = labels },
      data = { version = tostring(version) } }
  end
  for _, o in ipairs(extra or {}) do items[#items + 1] = o end
  return items
end

function cli.configmap(name, data)
  return { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, namespace = "cozy-system" }, data = data }
end

-- The args of a command against srv with the migrations of fixture dir `dir`
-- alone (--no-builtin: the fixture sets are numbered from 1 and must not mix
-- with the built-in ones). A `dir` without a slash is one of spec/fixtures/runner/.
function cli.args(srv, dir, ...)
  local args = { ... }
  for _, a in ipairs({ "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations",
      dir:find("/") and dir or ("spec/fixtures/runner/" .. dir) }) do
    args[#args + 1] = a
  end
  return args
end

-- The runners' Lease as the server holds it (nil when there is none).
function cli.get_lease(srv)
  return srv:object("Lease.coordination.k8s.io", "cozy-system", "cozystack-migrations")
end

-- The holder of the runners' Lease ("" once released), nil when there is no Lease.
function cli.lease_holder(srv)
  local l = cli.get_lease(srv)
  return l and l.spec.holderIdentity
end

-- A Lease of the runners held by `holder`, renewed at `renewed` (an RFC 3339
-- micro time of the holder's clock) for `duration` seconds: a fixture.
function cli.lease_object(holder, renewed, duration)
  return { apiVersion = "coordination.k8s.io/v1", kind = "Lease",
    metadata = { name = "cozystack-migrations", namespace = "cozy-system" },
    spec = { holderIdentity = holder, leaseDurationSeconds = duration, renewTime = renewed,
      acquireTime = renewed, leaseTransitions = 0 } }
end

-- Every stored object's identity and resourceVersion ("Kind ns/name rv"),
-- sorted, leaving out the kinds `skip` names ({ Lease = true }): "nothing
-- written" is that this list did not change. server: anything with
-- :objects() (a fake or real server, a harness).
function cli.stored_versions(server, skip)
  local out = {}
  for _, o in ipairs(server:objects()) do
    if not (skip and skip[o.kind]) then
      out[#out + 1] = ("%s %s/%s %s"):format(o.kind, o.metadata.namespace or "", o.metadata.name,
        o.metadata.resourceVersion)
    end
  end
  table.sort(out)
  return out
end

-- The JSON lines of a command's stdout (--log-format json), decoded; and
-- those of one event type.
function cli.json_lines(stdout)
  local out = {}
  for _, line in ipairs(cli.lines(stdout)) do out[#out + 1] = require("cozy.json").decode(line) end
  return out
end

function cli.of_type(events, t)
  local out = {}
  for _, e in ipairs(events) do if e.type == t then out[#out + 1] = e end end
  return out
end

-- The runner's requests in the server's log (not the spec's own), optionally
-- of one method and with a path matching a Lua pattern.
function cli.runner_requests(srv, method, path)
  local out = {}
  for _, e in ipairs(srv:requests()) do
    if (e.user_agent or ""):match("^cozy%-migrate") and (method == nil or e.method == method)
        and (path == nil or tostring(e.path):match(path)) then
      out[#out + 1] = e
    end
  end
  return out
end

-- data.version of the stamp, as a number (nil: absent), and the ConfigMap
function cli.version(srv)
  local cm = srv:object("ConfigMap", "cozy-system", "cozystack-version")
  return cm and tonumber(cm.data.version), cm
end

-- The real server's ServiceAccount `name` of `namespace` (made if need be)
-- with a fresh TokenRequest token, and a kubeconfig for it: the server's
-- own, with that token in place of the admin's. Returns { kubeconfig,
-- token, user }.
function cli.account_kubeconfig(srv, namespace, name)
  local minted = srv:control("POST", "/_real/token", { namespace = namespace, name = name })
  local text = assert(files.read(srv.kubeconfig))
  local replaced, n = text:gsub("\n    token: [^\n]*\n", "\n    token: " .. minted.token .. "\n")
  assert(n == 1, "the server's kubeconfig has no token line: " .. text)
  local path = srv.dir .. "/kubeconfig-" .. namespace .. "-" .. name
  files.write(path, replaced)
  return { kubeconfig = path, token = minted.token, user = minted.user }
end

-- Does the authorizer let `token` do what `r` names ({ verb, group,
-- resource[, namespace][, name] })? Its own SelfSubjectAccessReview.
function cli.authorized(srv, token, r)
  local res = srv:request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", { token = token,
    body = { apiVersion = "authorization.k8s.io/v1", kind = "SelfSubjectAccessReview",
      spec = { resourceAttributes = { verb = r.verb, group = r.group, resource = r.resource,
        namespace = r.namespace, name = r.name } } } })
  assert(res.status == 201, "access review answered " .. res.status .. ": " .. res.body)
  return res.json.status.allowed == true
end

-- An identity that may do what `rules` grant and nothing else: rules in the
-- fake's allow-rule shape, { verb, group, resource[, namespace][, name] }.
-- On the real server a ServiceAccount `name` of `namespace` with its own
-- token, RBAC granting `rules` (with a namespace a Role there, without one a
-- ClusterRole) plus discovery and its own access reviews, as `cozy-migrate
-- rbac` grants them; the spec's own requests (srv:request) stay the
-- admin's. On the fake, allow-list mode with those rules (srv:allow), which
-- binds every request, the spec's own included, and the fake's one token.
-- Returns { kubeconfig = a kubeconfig of srv for the identity, grant =
-- function(rules) that replaces the rules }; on the real server grant
-- returns once the authorizer answers by the new rules (each granted rule
-- allowed, each dropped one refused: a dropped rule must not be covered by
-- a kept one). A reset removes the account and its RBAC, or ends the mode.
function cli.restricted(srv, namespace, name, rules)
  local json = require "cozy.json"
  local REVIEWS = { verb = "create", group = "authorization.k8s.io", resource = "selfsubjectaccessreviews" }
  if not srv.real then
    local self = { kubeconfig = srv.kubeconfig }
    function self.grant(new_rules)
      local all = { REVIEWS }
      for _, r in ipairs(new_rules) do all[#all + 1] = r end
      srv:allow(all)
    end
    self.grant(rules)
    return self
  end
  local account = cli.account_kubeconfig(srv, namespace, name)
  local function call(method, path, body)
    local res = srv:request(method, path, { body = body })
    assert(res.status >= 200 and res.status < 300, ("%s %s answered %d: %s"):format(method, path, res.status, res.body))
    return res.json
  end
  local RBAC = "/apis/rbac.authorization.k8s.io/v1"
  local role_name = "spec-" .. name
  local subjects = { { kind = "ServiceAccount", name = name, namespace = namespace } }
  local made = {}  -- namespace ("" = cluster) -> true: its role and binding exist
  local function allowed(r) return cli.authorized(srv, account.token, r) end
  local current = {}
  local self = { user = account.user, kubeconfig = account.kubeconfig }
  function self.grant(new_rules)
    local by_ns = { [""] = {
      { nonResourceURLs = { "/api", "/api/*", "/apis", "/apis/*", "/version" }, verbs = { "get" } },
      { apiGroups = { REVIEWS.group }, resources = { REVIEWS.resource }, verbs = { REVIEWS.verb } },
    } }
    for _, r in ipairs(new_rules) do
      local ns = r.namespace or ""
      by_ns[ns] = by_ns[ns] or {}
      table.insert(by_ns[ns], { apiGroups = { r.group }, resources = { r.resource }, verbs = { r.verb },
        resourceNames = r.name and { r.name } or nil })
    end
    for ns in pairs(made) do by_ns[ns] = by_ns[ns] or {} end
    for ns, list in pairs(by_ns) do
      local kind, base = "ClusterRole", RBAC
      if ns ~= "" then kind, base = "Role", RBAC .. "/namespaces/" .. ns end
      local plural = kind == "Role" and "roles" or "clusterroles"
      local role = { apiVersion = "rbac.authorization.k8s.io/v1", kind = kind,
        metadata = { name = role_name, namespace = ns ~= "" and ns or nil }, rules = json.array(list) }
      if made[ns] then
        call("PUT", base .. "/" .. plural .. "/" .. role_name, role)
      else
        call("POST", base .. "/" .. plural, role)
        call("POST", base .. "/" .. kind:lower() .. "bindings", { apiVersion = "rbac.authorization.k8s.io/v1",
          kind = kind .. "Binding", metadata = { name = role_name, namespace = ns ~= "" and ns or nil },
          roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = kind, name = role_name }, subjects = subjects })
        made[ns] = true
      end
    end
    -- the authorizer reads RBAC from its informers: wait until it answers
    -- by the new rules
    local keep = {}
    for _, r in ipairs(new_rules) do keep[json.encode(r)] = true end
    local ok = cli.poll(30, function()
      for _, r in ipairs(new_rules) do
        if not allowed(r) then return false end
      end
      for _, r in ipairs(current) do
        if not keep[json.encode(r)] and allowed(r) then return false end
      end
      return true
    end, 0.05)
    assert(ok, "the authorizer did not take up the new rules of " .. account.user)
    current = new_rules
  end
  self.grant(rules)
  return self
end

-- An args array with the value of its --kubeconfig replaced by `kubeconfig`.
function cli.with_kubeconfig(args, kubeconfig)
  local out = {}
  for i, a in ipairs(args) do
    out[i] = a
    if args[i - 1] == "--kubeconfig" then out[i] = kubeconfig end
  end
  return out
end

function cli.history(cm)
  local json = require "cozy.json"
  return json.decode(cm.data.history or "[]")
end

return cli
