-- The spec harness (spec/README.md): one fake API server per spec file, reset
-- before every test; migrations run through the production step executor
-- (runner.run_migration); any CLI command through the binary; the objects and
-- the request log; fault rules; and the assertions registered with luassert
-- (spec/helpers/assertions.lua, loaded by .busted's helper).
--
--   local harness = require "spec.helpers"
--   describe("migration 55", function()
--     local h = harness.fake{ fixtures = { "spec/fixtures/55-fluxcd-addon-orphan/cluster.json" } }
--     it("orphans", function()
--       local res = h:migrate(55)              -- raises (with its log) if the migration fails
--       assert.equal(2, res.outcome.counts.orphaned)
--       assert.migration_idempotent(55)
--     end)
--   end)
--
-- Engine modules are required lazily: .busted loads this file for every
-- busted run, also under a plain lua5.4 (spec/fake), where only the fake is used.
local fake = require "spec.support.fake"
local files = require "spec.helpers.files"
local cli = require "spec.helpers.cli"

-- The one entry point: a spec requires this module and nothing else of the
-- harness (hack/spec-lint.lua's `entry` rule), and reaches the other modules
-- through it, each under the name it goes by in specs:
--   harness.server        spec/support/fake.lua: fake.start, fake.poll, the servers
--   harness.hostile       spec/support/hostile.lua: the hostile HTTP server
--   harness.cli           spec/helpers/cli.lua: the binary, its fixtures and arguments
--   harness.files         spec/helpers/files.lua: files and temporary directories
--   harness.transport     spec/helpers/transport.lua: the transport specs' server and client
--   harness.differential  spec/helpers/differential.lua: a port beside its shell original
--   harness.campaign      spec/helpers/campaign.lua: the campaign's fleet and server
-- The last four are loaded when first used: they require engine modules
-- (cozy.kube, cozy.json), which a spec under a plain lua5.4 (spec/fake) lacks.
local harness = { server = fake, files = files, cli = cli }

local LOADED_WHEN_USED = {
  hostile = "spec.support.hostile",
  transport = "spec.helpers.transport",
  differential = "spec.helpers.differential",
  campaign = "spec.helpers.campaign",
}
setmetatable(harness, {
  __index = function(t, name)
    local module = LOADED_WHEN_USED[name]
    if module == nil then return nil end
    local value = require(module)
    rawset(t, name, value)
    return value
  end,
})

-- Where numbered migrations are found (relative to the repository root, where
-- specs run). COZY_SPEC_MIGRATIONS points the harness at another directory.
harness.migrations_dir = os.getenv("COZY_SPEC_MIGRATIONS") or "migrations"

-- The namespace migrations run for (ctx.namespace) unless a harness says otherwise.
harness.NAMESPACE = "cozy-system"

-- The harness whose before_each ran last: what the assertions act on when not
-- given one.
harness.current = nil

local function busted_api()
  return require "busted"
end

-- The file of migration `n`: a number (migrations/N-*.lua) or a path.
function harness.migration_file(n)
  if type(n) == "string" then return n end
  assert(math.type(n) == "integer", "a migration is a number or a path, got " .. tostring(n))
  local dir = harness.migrations_dir
  local found
  for _, name in ipairs(files.lines(files.capture("ls -1 " .. files.quote(dir) .. " 2>/dev/null"))) do
    local number = tonumber(name:match("^(%d+)%-.*%.lua$"))
    if number == n then
      assert(found == nil, ("two files for migration %d in %s: %s and %s"):format(n, dir, tostring(found), name))
      found = name
    end
  end
  assert(found, ("no migration %d (%s/%d-*.lua)"):format(n, dir, n))
  return dir .. "/" .. found
end

-- The validated migration (runner.load_file's entry: definition, name, number...).
function harness.load(n)
  return require("cozy.runner").load_file(harness.migration_file(n))
end

-- A validated migration that may list, get and patch ConfigMaps and whose
-- run is `body` (Lua source): a probe of what the engine does for a call or
-- a batch (the update_each policy and retry budget specs).
function harness.configmap_probe(body)
  local dir = cli.migration_dir { ["1-probe.lua"] = ([[
return { description = 'probe',
  permissions = {
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
  },
  run = function(ctx)
%s
  end }
]]):format(body) }
  local m = harness.load(dir .. "/1-probe.lua")
  files.rm_rf(dir)
  return m
end

-- The version ConfigMap at 1 and n ConfigMaps cm-1..cm-n ({ keep = "me" }).
function harness.configmaps_fixture(n)
  local extra = {}
  for i = 1, n do extra[i] = cli.configmap(("cm-%d"):format(i), { keep = "me" }) end
  return cli.fixture(1, extra)
end

-- The specs' one logger: the production cozy.log logger, keeping what it
-- writes. log = the logger (give it to runner.run_migration, kube.connect...);
-- lines = { {level=, message=, fields=}... }; text() = the text lines as
-- cozy-migrate would print them; count(level[, pattern]) = how many lines of
-- that level have a message matching the Lua pattern. verbosity 1: debug too.
function harness.capture_log(verbosity)
  local chunks, lines = {}, {}
  local stream = { write = function(self, s) chunks[#chunks + 1] = s return self end, flush = function() end }
  local log = require("cozy.log").new { format = "text", verbosity = verbosity or 0, stream = stream, tty = false,
    sink = function(level, message, fields)
      lines[#lines + 1] = { level = level, message = message, fields = fields }
    end }
  local function count(level, pattern)
    local n = 0
    for _, ln in ipairs(lines) do
      if ln.level == level and (pattern == nil or tostring(ln.message):find(pattern)) then n = n + 1 end
    end
    return n
  end
  return { log = log, lines = lines, text = function() return table.concat(chunks) end, count = count }
end

-- Connect options of the harness's clients: the production client, with
-- retries and the rate limit shortened so that a fault costs milliseconds.
harness.CONNECT = {
  qps = 1000, burst = 1000, request_timeout = 10,
  retry = { max_attempts = 3, max_time = 5, base_delay = 0.01, max_delay = 0.05 },
  update = { max_attempts = 8, base_delay = 0.001, factor = 2, max_delay = 0.01, jitter = 0.5 },
}

local Harness = {}
Harness.__index = Harness

-- A fixture source list: one path, one table (a List or an array of objects),
-- or an array of those.
local function sources(fixtures)
  if fixtures == nil then return {} end
  if type(fixtures) == "string" then return { fixtures } end
  if fake.is_source_list(fixtures) then return fixtures end
  return { fixtures }
end

--- A fake API server for the enclosing describe block: started in its setup
--- (once per block: once per file when called at the top of the file's
--- describe), stopped in its teardown, and reset to `opts.fixtures` before each
--- test (the request log, faults, denies and allows cleared too).
--- opts: fixtures (paths or tables, see spec/README.md), tls (default true),
--- token (default a fixed one; false: none), namespace (ctx.namespace),
--- and fake.start's latency_ms, deny.
function harness.fake(opts)
  opts = opts or {}
  local h = setmetatable({ fixtures = sources(opts.fixtures), namespace = opts.namespace or harness.NAMESPACE,
    mark_at = 0 }, Harness)
  local b = busted_api()
  b.setup(function()
    local token = opts.token
    if token == nil then token = "harness-token" end
    h.srv = fake.start { fixtures = h.fixtures, tls = opts.tls ~= false, token = token or nil,
      latency_ms = opts.latency_ms, deny = opts.deny, server = opts.server }
  end)
  b.teardown(function()
    if h.srv then h.srv:stop() end
    if harness.current == h then harness.current = nil end
  end)
  b.before_each(function()
    h:reset()
    harness.current = h
  end)
  return h
end

--- Replaces the server's whole state by `fixtures` (default: the harness's),
--- clearing the log, faults, denies and allows; the mark goes back to the start.
function Harness:reset(fixtures)
  self.srv:reset(fixtures == nil and self.fixtures or sources(fixtures))
  self.mark_at = 0
end

--- From here on, requests(), writes() and assert.no_writes() look only at what
--- is sent after this point.
function Harness:mark()
  self.mark_at = #self.srv:requests()
end

--- The request log since the mark (or the reset): entries
--- { method, path, query, content_type, body, status, at[, fault] }.
--- filter: { method =, path = lua pattern, all = true (the whole log, ignoring the mark) }.
function Harness:requests(filter)
  filter = filter or {}
  local out = {}
  for i, e in ipairs(self.srv:requests()) do
    if (filter.all or i > self.mark_at)
        and (not filter.method or e.method == filter.method)
        and (not filter.path or tostring(e.path):match(filter.path)) then
      out[#out + 1] = e
    end
  end
  return out
end

--- The requests since the mark that change state (not GET/HEAD, not access reviews).
function Harness:writes(filter)
  local out = {}
  for _, e in ipairs(self:requests(filter)) do
    if cli.is_write(e) then out[#out + 1] = e end
  end
  return out
end

function Harness:objects() return self.srv:objects() end
function Harness:object(kind, namespace, name) return self.srv:object(kind, namespace, name) end
function Harness:faults(rules) return self.srv:faults(rules) end
function Harness:fired(filter) return self.srv:fired(filter) end
function Harness:deny(rules) return self.srv:deny(rules) end
function Harness:allow(rules) return self.srv:allow(rules) end

-- A client of the server, as runner.run_migration would make, with the
-- harness's connect options (client dry run in plan mode).
function Harness:client(mode, log, record)
  local o = { kubeconfig = self.srv.kubeconfig, log = log,
    dry_run = mode == "plan" and "client" or nil, record = record }
  for k, v in pairs(harness.CONNECT) do o[k] = v end
  return require("cozy.kube").connect(o)
end

local function run_step(self, n, opts)
  opts = opts or {}
  local runner = require "cozy.runner"
  local m = type(n) == "table" and n or harness.load(n)
  local mode = opts.mode or "run"
  local captured = harness.capture_log(opts.verbosity)
  local writes = {}
  local client = opts.client or self:client(mode, captured.log, function(w) writes[#writes + 1] = w end)
  local ok, res = pcall(runner.run_migration, m, { client = client, log = captured.log, mode = mode,
    namespace = opts.namespace or self.namespace })
  if not opts.client then client:close() end
  local out = ok and res or {}
  out.log, out.lines, out.writes, out.migration = captured.text(), captured.lines, writes, m
  return ok, res, out
end

--- Runs migration n (a number, a path, or a loaded entry) through
--- runner.run_migration against the server. opts: mode ("run" | "plan" |
--- "check"), namespace, verbosity (1: debug lines too), client.
--- Returns the step's result { findings, outcome = { counts, warnings },
--- log = text, lines = { {level, message, fields} }, writes = plan's recorded
--- writes }; raises, with the migration's log, if the step failed.
function Harness:migrate(n, opts)
  local ok, err, out = run_step(self, n, opts)
  if not ok then
    error(("migration %s failed (%s): %s\n--- its log:\n%s"):format(out.migration.name,
      (opts or {}).mode or "run", tostring(err), out.log), 2)
  end
  return out
end

--- Runs migration n whether it fails or not: ok, the error (nil when ok), and
--- what migrate returns (spec/helpers/differential.lua compares both outcomes).
function Harness:step(n, opts)
  return run_step(self, n, opts)
end

--- Runs migration n expecting it to fail; returns the error (a cozy.errors
--- table: kind, message, ...) and what migrate returns. Raises if it succeeded.
function Harness:migrate_error(n, opts)
  local ok, err, out = run_step(self, n, opts)
  if ok then
    error(("migration %s succeeded (%s), a failure was expected\n--- its log:\n%s"):format(out.migration.name,
      (opts or {}).mode or "run", out.log), 2)
  end
  return err, out
end

--- Runs cozy-migrate `args` (an array) against the server (--kubeconfig added
--- unless given); env as cli.run. Returns { code, stdout, stderr }.
function Harness:cli(args, env, stdin)
  local full = {}
  local has_kubeconfig = false
  for i, a in ipairs(args) do
    full[i] = a
    if a == "--kubeconfig" or tostring(a):match("^%-%-kubeconfig=") then has_kubeconfig = true end
  end
  if not has_kubeconfig then
    full[#full + 1] = "--kubeconfig"
    full[#full + 1] = self.srv.kubeconfig
  end
  return cli.run(full, env, stdin)
end

harness.Harness = Harness

-- The harness an assertion acts on: the one given, or the current one.
function harness.resolve(h)
  if getmetatable(h) == Harness then return h end
  assert(harness.current, "no harness: call harness.fake{...} in the describe block")
  return harness.current
end

return harness
