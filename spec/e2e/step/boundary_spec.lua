-- The step executor and the choke point, end to end against the fake API
-- server: under plan, run --dry-run and check no write a migration makes
-- through any path reaches the server; the migration's declared permissions
-- are enforced before a request is sent; the spec harness sends what `run`
-- sends; a migration's deliberate error is one log line.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local runner = require "cozy.runner"
local cli = require("spec.helpers").cli
local helpers = require "spec.helpers"

-- A directory holding one migration `1-NAME.lua` with `source`.
local function migration_dir(name, source)
  return cli.migration_dir { [("1-%s.lua"):format(name)] = source }
end

local CONFIGMAP_PERMISSIONS = [[
  permissions = {
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "create", group = "", resource = "configmaps" },
    { verb = "update", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
    { verb = "delete", group = "", resource = "configmaps" },
    { verb = "create", group = "coordination.k8s.io", resource = "leases", namespace = "other" },
  },
]]

-- Every write path a migration has: the raw call with each write method,
-- each Resource write method, update, and a raw path to another group.
-- Each entry: a label and the Lua statement making the write.
local WRITES = {
  { "call POST", [[ctx.kube:call("POST", "/api/v1/namespaces/cozy-system/configmaps",
    { body = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "raw-post", namespace = "cozy-system" } } })]] },
  { "call PUT", [[ctx.kube:call("PUT", "/api/v1/namespaces/cozy-system/configmaps/target", { body = { apiVersion = "v1",
    kind = "ConfigMap", metadata = { name = "target", namespace = "cozy-system" }, data = { put = "1" } } })]] },
  { "call PATCH", [[ctx.kube:call("PATCH", "/api/v1/namespaces/cozy-system/configmaps/target",
    { body = { data = { raw = "1" } }, content_type = "application/merge-patch+json" })]] },
  { "call DELETE", [[ctx.kube:call("DELETE", "/api/v1/namespaces/cozy-system/configmaps/doomed")]] },
  { "create", [[cms:create{ apiVersion = "v1", kind = "ConfigMap", metadata = { name = "created", namespace = "cozy-system" } }]] },
  { "merge_patch", [[cms:merge_patch("cozy-system", "target", { data = { merged = "1" } })]] },
  { "json_patch", [[cms:json_patch("cozy-system", "target", { { op = "add", path = "/data/patched", value = "1" } })]] },
  { "update", [[cms:update(cms:get("cozy-system", "target"), function() return { { op = "add", path = "/data/updated", value = "1" } } end)]] },
  { "delete", [[cms:delete("cozy-system", "target")]] },
  { "call POST other group", [[ctx.kube:call("POST", "/apis/coordination.k8s.io/v1/namespaces/other/leases",
    { body = { apiVersion = "coordination.k8s.io/v1", kind = "Lease", metadata = { name = "l", namespace = "other" } } })]] },
}

local function writer_source()
  local run, check = {}, {}
  for _, w in ipairs(WRITES) do
    run[#run + 1] = "    " .. w[2]
    check[#check + 1] = ("    attempt(%q, function() %s end)"):format(w[1], w[2])
  end
  return ([[
return {
  description = "writes through every path there is",
%s
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
%s
  end,
  check = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local refused, total = 0, 0
    local function attempt(label, fn)
      total = total + 1
      local ok, err = pcall(fn)
      if not ok and err.kind == "readonly" then
        refused = refused + 1
        ctx:finding("info", "refused " .. label .. ": " .. tostring(err))
      end
    end
%s
    ctx:finding("info", ("refused %%d of %%d writes"):format(refused, total))
  end,
}
]]):format(CONFIGMAP_PERMISSIONS, table.concat(run, "\n"), table.concat(check, "\n"))
end

-- Requests other than reads (the access reviews `check` asks are the engine's own).
local function sent_writes(srv)
  local out = {}
  for _, r in ipairs(cli.writes(srv)) do out[#out + 1] = r.method .. " " .. r.path end
  return out
end

-- the writes a plan sent that could persist: a rehearsal sends each with dryRun=All
local function persisting_writes(srv)
  local out = {}
  for _, r in ipairs(cli.writes(srv)) do
    if r.query ~= "dryRun=All" then out[#out + 1] = r.method .. " " .. r.path .. "?" .. tostring(r.query) end
  end
  return out
end

-- One API server for the whole file (a real one takes seconds to start):
-- each block resets it to its own fixture before each test.
local srv
setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
teardown(function() if srv then srv:stop() end end)

local function count(haystack, needle)
  local n, i = 0, 1
  while true do
    local s, e = haystack:find(needle, i, true)
    if not s then return n end
    n, i = n + 1, e + 1
  end
end

describe("no write is sent where none may be", function()
  local dir
  setup(function() dir = migration_dir("writer", writer_source()) end)
  teardown(function() os.execute("rm -rf " .. cli.quote(dir)) end)
  before_each(function()
    srv:reset(cli.fixture(1, {
      cli.configmap("target", { keep = "me" }),
      cli.configmap("doomed", {}),
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "other" } },
    }))
    srv:clear_requests()
  end)

  for _, command in ipairs({ { "plan" }, { "run", "--dry-run" } }) do
    it(table.concat(command, " ") .. " sends only reads and dryRun=All writes and shows each write once", function()
      local before = srv:objects()
      local args = cli.args(srv, dir, table.unpack(command))
      local r = cli.run(args)
      assert.equal(0, r.code, r.stdout .. r.stderr)
      assert.same({}, persisting_writes(srv))
      assert.same(before, srv:objects())
      -- each migration write once, plus the stamp: 10 + 1
      assert.matches("plan: 1 step%(s%), 11 write%(s%)", r.stdout)
      assert.equal(1, count(r.stdout, '"name":"raw-post"'))
      -- (a rehearsal also names the PUT that validated a write to an object it had changed: "validated as PUT")
      assert.equal(1, count(r.stdout, "\n  PUT /api/v1/namespaces/cozy-system/configmaps/target"))
      assert.equal(1, count(r.stdout, "DELETE /api/v1/namespaces/cozy-system/configmaps/doomed?dryRun=All\n"))
      assert.equal(1, count(r.stdout, "DELETE /api/v1/namespaces/cozy-system/configmaps/target?dryRun=All\n"))
      assert.equal(1, count(r.stdout, "POST /apis/coordination.k8s.io/v1/namespaces/other/leases"))
      assert.equal(1, count(r.stdout, '"name":"created"'))
      assert.equal(1, count(r.stdout, '{"data":{"merged":"1"}}'))
      assert.equal(1, count(r.stdout, '{"data":{"raw":"1"}}'))
      assert.equal(1, count(r.stdout, '"path":"/data/patched"'))
      assert.equal(1, count(r.stdout, '"path":"/data/updated"'))
    end)
  end

  it("the JSON plan carries every write once, with its body", function()
    local r = cli.run(cli.args(srv, dir, "plan", "--log-format", "json"))
    assert.equal(0, r.code, r.stderr)
    local writes = {}
    for _, line in ipairs(cli.lines(r.stdout)) do
      local e = json.decode(line)
      if e.type == "write" and e.step == 1 then writes[#writes + 1] = e end
    end
    assert.equal(#WRITES + 1, #writes) -- and the stamp
    assert.equal("raw-post", writes[1].body.metadata.name)
    assert.equal("PUT", writes[2].method)
    assert.equal("application/merge-patch+json", writes[3].content_type)
    assert.is_nil(writes[4].body)
    assert.same({}, persisting_writes(srv))
  end)

  it("check refuses every write, names the migration and the request, and sends nothing", function()
    local r = cli.run(cli.args(srv, dir, "check"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("refused 10 of 10 writes", r.stdout, 1, true)
    assert.matches("refused delete: migration 1-writer attempted a write, DELETE "
      .. "/api/v1/namespaces/cozy-system/configmaps/target: check() is read-only; nothing was sent", r.stdout, 1, true)
    assert.same({}, sent_writes(srv))
  end)

  it("run sends each of those writes (the same migration, for real)", function()
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(0, r.code, r.stderr)
    local sent = sent_writes(srv)
    local migration_writes = 0
    for _, w in ipairs(sent) do
      -- the engine's: the stamp, the Lease, the run's Events
      if not w:find("cozystack-version", 1, true) and not w:find("cozy-system/leases", 1, true)
          and not w:find("/apis/events.k8s.io/", 1, true) then
        migration_writes = migration_writes + 1
      end
    end
    assert.equal(#WRITES, migration_writes, table.concat(sent, "\n"))
    assert.equal(2, cli.version(srv))
  end)
end)

describe("declared permissions", function()
  local dir
  before_each(function() srv:reset("spec/fixtures/59-vmi-hotplug/cluster.json") end)
  setup(function()
    dir = migration_dir("lists-then-patches", [[
return {
  description = "declares list only, then patches",
  permissions = { { verb = "list", group = "kubevirt.io", resource = "virtualmachines" } },
  run = function(ctx)
    local vms = ctx.kube:resource("kubevirt.io/v1", "virtualmachines")
    for vm in vms:list() do
      vms:merge_patch(vm.metadata.namespace, vm.metadata.name, { metadata = { labels = { touched = "yes" } } })
    end
  end,
}
]])
  end)
  teardown(function() os.execute("rm -rf " .. cli.quote(dir)) end)

  it("a request the migration did not declare fails before it is sent, naming the declaration", function()
    local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/cozystack-version",
      { body = { data = { version = "1" } }, content_type = "application/merge-patch+json" })
    assert.equal(200, res.status, res.body)
    srv:clear_requests()
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches('migration 1-lists-then-patches sent PATCH /apis/kubevirt.io/v1/namespaces/', r.stderr, 1, true)
    assert.matches('declare { verb = "patch", group = "kubevirt.io", resource = "virtualmachines" }', r.stderr, 1, true)
    local listed, patched = 0, 0
    for _, req in ipairs(srv:requests()) do
      if req.path:find("/virtualmachines", 1, true) then
        if req.method == "GET" then listed = listed + 1 else patched = patched + 1 end
      end
    end
    assert.is_true(listed >= 1, "the declared list was not sent")
    assert.equal(0, patched)
    assert.equal(1, cli.version(srv))
  end)
end)

-- Runs `source` as migration 1 in this Lua state through the spec harness
-- (the step executor), against srv. Returns ok, err, result.
local function harness(server, source, mode)
  local dir = migration_dir("probe", source)
  local m = runner.load_file(dir .. "/1-probe.lua")
  os.execute("rm -rf " .. cli.quote(dir))
  return pcall(runner.run_migration, m, { kubeconfig = server.kubeconfig, mode = mode or "run",
    log = helpers.capture_log().log })
end

local function probe(body)
  return ([[
local json = require "cozy.json"
return {
  description = "probe",
%s
  run = function(ctx)
%s
  end,
}
]]):format(CONFIGMAP_PERMISSIONS, body)
end

describe("the context is a boundary", function()
  before_each(function()
    srv:reset(cli.fixture(1, { cli.configmap("target", { keep = "me" }) }))
    srv:clear_requests()
  end)

  -- each escape, and the error it must end in
  local escapes = {
    { "the raw transport", [[assert(ctx.kube._t == nil and ctx.kube._transport == nil); ctx.kube._t:request("DELETE", "/x")]],
      "attempt to index a nil value" },
    { "the client behind a resource", [[local r = ctx.kube:resource("v1", "configmaps"); assert(r.client == nil); r.client:call("DELETE", "/x")]],
      "attempt to index a nil value" },
    { "the resource behind a pager", [[local p = ctx.kube:resource("v1", "configmaps"):list()
      assert(p.resource == nil); p.resource.client:call("DELETE", "/x")]],
      "attempt to index a nil value" },
    { "the logger's class", [[getmetatable(ctx.log)]], "metatable of an engine object is not available" },
    { "the logger's class through a tagged logger", [[getmetatable(ctx.log:with{ a = 1 })]], "metatable of an engine object is not available" },
    { "a resource's methods", [[ctx.kube:resource("v1", "configmaps").get = nil]], "is read-only" },
    { "the client's methods", [[ctx.kube.call = function() end]], "is read-only" },
    { "the pager's metatable", [[getmetatable(ctx.kube:resource("v1", "configmaps"):list())]], "metatable of an engine object is not available" },
    { "the error class", [[local r = ctx.kube:resource("v1", "configmaps"); local ok, err = pcall(r.get, r, "cozy-system", "absent")
      assert(not ok and err.code == 404 and err.__index == nil and err.__tostring == nil); getmetatable(err)]],
      "metatable of an engine object is not available" },
    { "the counters", [[ctx.kube.stats.writes = 0]], "ctx.kube.stats is read-only" },
    { "the counters' metatable", [[setmetatable(ctx.kube.stats, {})]], "cannot change the metatable of an engine object" },
    { "json.object_mt", [[json.object_mt.__index = function() return 1 end]], "json.object_mt is read-only" },
    { "json.array_mt from a decoded value", [[getmetatable(json.decode("[]")).__newindex = print]], "json.array_mt is read-only" },
    { "string.dump", [[string.dump(function() end)]], "attempt to call a nil value (field 'dump')" },
    { "a binary chunk", ("assert(load(%q))"):format(string.dump(function() return 1 end)), "attempt to load a binary chunk" },
    { "a binary chunk, mode b", [[assert(load("return 1", "x", "b"))]], "only text chunks can be loaded" },
    { "debug", [[debug.getupvalue(ctx.kube.call, 1)]], "attempt to index a nil value (global 'debug')" },
    { "package.loadlib", [[package.loadlib("libc.so.6", "system")]], "attempt to index a nil value (global 'package')" },
    { "require of the transport", [[require "cozy.transport"]], "module 'cozy.transport' is not available to migrations" },
    { "require of the kube client", [[require "cozy.kube"]], "module 'cozy.kube' is not available to migrations" },
    { "collectgarbage", [[collectgarbage("incremental", 1, 1)]], "attempt to call a nil value (global 'collectgarbage')" },
    { "the string metatable", [[assert(getmetatable("") == nil); ("").format = 1]], "attempt to index a string value" },
    { "io and os.execute", [[assert(io == nil and os.execute == nil and os.exit == nil); io.popen("true")]], "attempt to index a nil value (global 'io')" },
  }
  for _, e in ipairs(escapes) do
    it("keeps out of reach " .. e[1], function()
      local ok, err = harness(srv, probe("    " .. e[2]))
      assert.is_false(ok, "the escape worked")
      assert.matches(e[3], tostring(err), 1, true)
      assert.same({}, cli.writes(srv))
    end)
  end

  it("leaves the engine's shared tables untouched by what a migration tried", function()
    local real = require "cozy.json"
    harness(srv, probe([[    pcall(function() json.object_mt.x = 1 end)
    pcall(function() json.array_mt.__index = {} end)
    json.encode = nil]]))
    assert.is_nil(rawget(real.object_mt, "x"))
    assert.is_nil(rawget(real.array_mt, "__index"))
    assert.is_function(real.encode)
    assert.equal("[]", real.encode(real.decode("[]")))
  end)

  it("still does everything a legitimate migration needs", function()
    local ok, res = harness(srv, probe([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local names = {}
    for cm in cms:list{ namespace = "cozy-system" } do names[#names + 1] = cm.metadata.name end
    assert(#names == 2, "listed " .. #names)
    local p = cms:list{ namespace = "cozy-system" }
    assert(#p:collect() == 2 and p.pages == 1 and p.count == 2)
    assert(cms:get("cozy-system", "target").data.keep == "me")
    assert(cms:find("cozy-system", "absent") == nil)
    cms:create{ apiVersion = "v1", kind = "ConfigMap", metadata = { name = "made", namespace = "cozy-system" } }
    cms:merge_patch("cozy-system", "made", { data = { a = "1" } })
    cms:json_patch("cozy-system", "made", { { op = "add", path = "/data/b", value = "2" } })
    local obj, changed = cms:update("cozy-system", "made", function(cm)
      return { { op = "add", path = "/data/c", value = cm.data.a .. cm.data.b } }
    end)
    assert(changed and obj.data.c == "12")
    cms:delete("cozy-system", "target")
    local arr = setmetatable({}, json.array_mt)
    assert(json.encode(arr) == "[]", json.encode(arr))
    assert(json.encode(json.array{}) == "[]")
    local mine = setmetatable({}, { __index = function() return 7 end })
    assert(mine.x == 7 and getmetatable(mine) ~= nil)
    ctx.log:info("a line", { n = 1 })
    ctx.log:with{ part = "x" }:debug("another")
    local bar = ctx:progress("things", 2)
    bar:step(1); bar:step(2); bar:done()
    ctx:finding("info", "found", { n = 1 })
    assert(ctx.findings[1].message == "found")
    ctx:finding("warn", "points at an object", { cm = obj, key = "c" })
    assert(ctx.kube.stats.writes >= 0 and ctx.kube.namespace == nil or true)]]))
    assert.is_true(ok, tostring(res))
    assert.same({ { severity = "info", message = "found", fields = { n = 1 } },
                  { severity = "warn", message = "points at an object",
                    fields = { namespace = "cozy-system", cm = "made", key = "c" } } }, res.findings)
    local made = srv:object("ConfigMap", "cozy-system", "made")
    assert.same({ a = "1", b = "2", c = "12" }, made.data)
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "target"))
  end)
end)

describe("the spec harness runs what production runs", function()

  -- The resourceVersion of each object as the run will read it, by its
  -- path: a reset of the fake restarts resourceVersions, a real server's
  -- never do, so the two runs' guards are compared as "the version read".
  local function versions()
    local out = {}
    for _, o in ipairs(srv:objects()) do
      local group, version = (o.apiVersion or ""):match("^(.-)/?([^/]+)$")
      local plural = ({ VirtualMachine = "virtualmachines", VirtualMachineInstance = "virtualmachineinstances" })[o.kind]
      if plural and group == "kubevirt.io" then
        out[("/apis/%s/%s/namespaces/%s/%s/%s"):format(group, version, o.metadata.namespace, plural,
          o.metadata.name)] = o.metadata.resourceVersion
      end
    end
    return out
  end

  -- The requests a migration made: everything but the engine's own
  -- (the version ConfigMap and the Lease); a guard on the resourceVersion
  -- the object had before the run reads "<read>".
  local function migration_requests(read)
    local out = {}
    for _, r in ipairs(srv:requests()) do
      if not r.path:find("cozystack-version", 1, true) and not r.path:find("/leases", 1, true)
          and not r.path:find("/apis/events.k8s.io/", 1, true) then
        local body = r.body
        if type(body) == "string" and read[r.path] then
          body = body:gsub('("op":"test","path":"/metadata/resourceVersion","value":")(%d+)(")', function(a, v, b)
            if v == read[r.path] then return a .. "<read>" .. b end
          end)
        end
        out[#out + 1] = { method = r.method, path = r.path, query = r.query, content_type = r.content_type,
          body = body }
      end
    end
    return out
  end

  it("migration 59 sends the same requests through run_migration as through `cozy-migrate run`", function()
    srv:reset("spec/fixtures/59-vmi-hotplug/cluster.json")
    local read = versions()
    srv:clear_requests()
    local m = runner.load_file("migrations/59-vmi-hotplug.lua")
    runner.run_migration(m, { kubeconfig = srv.kubeconfig, log = helpers.capture_log().log })
    local by_harness = migration_requests(read)
    local after_harness = srv:objects()

    srv:reset("spec/fixtures/59-vmi-hotplug/cluster.json")
    read = versions()
    srv:clear_requests()
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig })
    assert.equal(0, r.code, r.stderr)
    local by_run = migration_requests(read)
    assert.is_true(#by_harness > 5, "too few requests to compare: " .. #by_harness)
    local guarded = 0
    for _, req in ipairs(by_run) do
      if req.method == "PATCH" then
        assert.matches('"path":"/metadata/resourceVersion","value":"<read>"', req.body, 1, true)
        guarded = guarded + 1
      end
    end
    assert.is_true(guarded >= 5, guarded .. " guarded patches")
    -- the same requests; the patches run in parallel, so in any order
    local function sorted(list)
      local keys = {}
      for i, req in ipairs(list) do
        keys[i] = table.concat({ req.method, req.path, req.query or "", tostring(req.content_type), tostring(req.body) }, " ")
      end
      table.sort(keys)
      return keys
    end
    assert.same(sorted(by_harness), sorted(by_run))
    -- and the VMs end the same (the stamp differs: the harness does not stamp)
    local function vms(objects)
      local out = {}
      for _, o in ipairs(objects) do if o.kind == "VirtualMachine" then out[#out + 1] = o.spec end end
      return out
    end
    assert.same(vms(after_harness), vms(srv:objects()))
  end)
end)

describe("a migration's own error", function()
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function error_lines(text)
    local out = {}
    for _, line in ipairs(cli.lines(text)) do
      if line:find(" ERROR ", 1, true) then out[#out + 1] = line end
    end
    return out
  end

  local function run_failing(raise, ...)
    local dir = migration_dir("refuses", ([[
return {
  description = "refuses",
  run = function(ctx) %s end,
}
]]):format(raise))
    local r = cli.run(cli.args(srv, dir, "run", ...))
    os.execute("rm -rf " .. cli.quote(dir))
    return r
  end

  it("error(msg, 0) is exactly one ERROR line naming the migration, without -v", function()
    local r = run_failing([[error("the cluster is not ready for this", 0)]])
    assert.equal(1, r.code)
    local lines = error_lines(r.stderr)
    assert.equal(1, #lines, r.stderr)
    assert.matches("migration 1-refuses failed: the cluster is not ready for this; version stays at 1", lines[1], 1, true)
    assert.not_matches("traceback", r.stderr)
    assert.equal(1, cli.version(srv))
  end)

  it("its traceback is shown with -v, at debug level", function()
    local r = run_failing([[error("the cluster is not ready for this", 0)]], "-v")
    assert.equal(1, r.code)
    assert.equal(1, #error_lines(r.stderr), r.stderr)
    -- one log line per line of the traceback, each with its timestamp and level
    assert.matches("DEBUG the cluster is not ready for this\n[%d%-T:.]+Z DEBUG stack traceback:", r.stderr)
  end)

  it("an error value that is not a string is a bug: shown safely, with its traceback", function()
    local r = run_failing([[error(setmetatable({}, { __tostring = function() error("and tostring fails") end }))]])
    assert.equal(1, r.code)
    assert.matches("migration 1-refuses failed: 1-refuses raised a table value: (a table value that cannot be shown)",
      r.stderr, 1, true)
    assert.matches("stack traceback", r.stderr, 1, true)
  end)
end)

describe("a step's outcome", function()

  it("keeps the counts and warnings a migration reports, bounded", function()
    srv:reset(cli.fixture(1))
    local dir = migration_dir("reports", [[
return {
  description = "reports",
  run = function(ctx)
    local many = {}
    for i = 1, 30 do many[("k%02d"):format(i)] = i end
    ctx:outcome{ updated = 3, note = ("x"):rep(500) }
    ctx:outcome(many)
    local given = { updated = 4 }
    assert(rawequal(ctx:outcome(given), given), "ctx.outcome did not return the fields it was given")
    for i = 1, 15 do ctx.log:warn("careful " .. i) end
    local ok, err = pcall(ctx.outcome, ctx, { bad = {} })
    assert(not ok and tostring(err):find("ctx:outcome: bad must be a number, a string or a boolean, got a table", 1, true),
      "ctx.outcome took a table value, or refused it otherwise: " .. tostring(err))
  end,
}
]])
    local r = cli.run(cli.args(srv, dir, "run"))
    os.execute("rm -rf " .. cli.quote(dir))
    assert.equal(0, r.code, r.stderr)
    local _, cm = cli.version(srv)
    local o = cli.history(cm)[1].outcome
    local keys = 0
    for _ in pairs(o.counts) do keys = keys + 1 end
    assert.equal(20, keys)
    assert.equal(4, o.counts.updated)
    assert.equal(200, #o.counts.note)
    assert.equal(10, #o.warnings)
    assert.equal("careful 1", o.warnings[1])
    assert.equal(5, o.warnings_dropped)
    local st = cli.run(cli.args(srv, cli.tmpdir(), "status", "--target", "2"))
    assert.equal(0, st.code, st.stderr)
    assert.matches("outcome: .*updated=4", st.stdout)
    assert.matches("(5 more warnings not kept)", st.stdout, 1, true)
  end)
end)
