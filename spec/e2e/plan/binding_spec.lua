-- `plan --save FILE` records the rehearsal (what it read, with each
-- object's resourceVersion, and every write); `run --plan FILE` starts only
-- on the cluster the plan read and stops before a write the plan does not
-- hold (docs/operations.md, "A saved plan"). Runs on both servers.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local sys = require "cozy.sys"

local DIR = "spec/fixtures/plan_binding/"
local SECRET_VALUE = "s3cr3t-token-value"

local function fixture()
  return cli.fixture(1, {
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "src", namespace = "cozy-system" },
      data = { token = SECRET_VALUE, note = "hello" } },
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "dst", namespace = "cozy-system",
      labels = { app = "bind" } }, data = { original = "yes" } },
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "other", namespace = "cozy-system",
      labels = { app = "bind" } }, data = { original = "yes" } },
  })
end

-- the run's writes to the cluster, leaving out the lock's Lease: "METHOD path"
local function migration_writes(h)
  local out = {}
  for _, w in ipairs(h:writes()) do
    if not tostring(w.path):match("/leases") and not tostring(w.path):match("/events$") then out[#out + 1] = w.method .. " " .. w.path end
  end
  return out
end

local function plan_file(h, dir, ...)
  local path = cli.tmpdir() .. "/plan.json"
  local r = h:cli(cli.args(h.srv, DIR .. dir, "plan", "--save", path, ...))
  return path, r
end

local function read_plan(path)
  return json.decode(assert(files.read(path)))
end

-- the plan's writes, stamps included: "METHOD path"
local function planned_writes(doc)
  local out = {}
  for _, s in ipairs(doc.steps) do
    for _, w in ipairs(s.writes) do out[#out + 1] = w.method .. " " .. w.path end
  end
  return out
end

-- run --plan PATH refused before it starts: exit 1 naming `pattern`, no
-- write sent and nothing stored changed.
local function refused_to_start(h, path, pattern)
  local before = cli.stored_versions(h, { Lease = true })
  h:mark()
  local r = h:cli(cli.args(h.srv, DIR .. "bind", "run", "--plan", path))
  assert.equal(1, r.code, r.stdout .. r.stderr)
  assert.matches(pattern, r.stderr)
  assert.same({}, h:writes())
  assert.same(before, cli.stored_versions(h, { Lease = true }))
end

local function configmaps(h)
  local cms = h:client():resource("v1", "configmaps")
  return cms
end

describe("a saved plan binds the run", function()
  local h = harness.fake { fixtures = { fixture() } }

  it("runs unchanged: the run's writes are the plan's, and the version reaches the target", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local doc = read_plan(path)
    assert.equal("CozyMigratePlan", doc.kind)
    assert.equal(1, doc.version)
    assert.equal(1, doc.current)
    assert.equal(3, doc.target)
    assert.equal(2, #doc.steps)
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "bind", "run", "--plan", path))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.same(planned_writes(doc), migration_writes(h))
    assert.equal(3, (cli.version(h.srv)))
    local dst = h:object("ConfigMap", "cozy-system", "dst")
    assert.equal("hello", dst.data.copied)
    assert.truthy(h:object("Secret", "cozy-system", "made"))
    assert.equal("step-2", dst.metadata.labels.seen)
  end)

  it("keeps no Secret value in the file, and the file is its owner's only", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local text = assert(files.read(path))
    assert.matches("/api/v1/namespaces/cozy%-system/secrets", text)
    assert.is_nil(text:find(SECRET_VALUE, 1, true))
    assert.matches("<redacted>", text)
    assert.equal("600", (files.capture("stat -c %a " .. files.quote(path)):gsub("%s+$", "")))
  end)

  it("refuses to start when the stamp moved since, writing nothing", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local cms = configmaps(h)
    cms:change(cms:get("cozy-system", "cozystack-version"), function(c) c.data.note = "moved" end)
    refused_to_start(h, path, "the version ConfigMap cozy%-system/cozystack%-version changed since it was planned")
  end)

  it("refuses to start naming an object the plan read that changed since", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local cms = configmaps(h)
    cms:change(cms:get("cozy-system", "src"), function(c) c.data.token = "rotated" end)
    refused_to_start(h, path, "/api/v1/namespaces/cozy%-system/configmaps/src changed since the plan read it")
  end)

  it("refuses to start when an object a listed selector now matches appeared", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    configmaps(h):create { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "late", namespace = "cozy-system", labels = { app = "bind" } } }
    refused_to_start(h, path, "labelSelector=app=bind: cozy%-system/late appeared since the plan listed it")
  end)

  it("stops before the first write that differs, stamped only up to the last completed step", function()
    local planned_at = os.time()
    local path, p = plan_file(h, "differs")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    -- the time of day written must be another one in the run: the clock has moved to the next second
    assert.truthy(cli.poll(3, function() return os.time() > planned_at + 1 end))
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "differs", "run", "--plan", path))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 2's write differs from the plan: expected POST /api/v1/namespaces/cozy%-system/configmaps "
      .. "[^\n]*, got POST /api/v1/namespaces/cozy%-system/configmaps [^\n]*; not sent", r.stderr)
    assert.matches("version stays at 2", r.stderr)
    assert.equal(2, (cli.version(h.srv)))
    assert.truthy(h:object("ConfigMap", "cozy-system", "first"))
    assert.truthy(h:object("ConfigMap", "cozy-system", "second-a"))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "second-b"))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "second-c"))
    -- after the stop: only the failure's history record and the lock's release
    local after = {}
    for _, w in ipairs(migration_writes(h)) do
      if not w:match("cozystack%-version") then after[#after + 1] = w end
    end
    assert.same({ "POST /api/v1/namespaces/cozy-system/configmaps", "POST /api/v1/namespaces/cozy-system/configmaps" },
      after)
  end)

  it("stops before a first write that depends on the mode it runs in, nothing written", function()
    local path, p = plan_file(h, "mode")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "mode", "run", "--plan", path))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1's write differs from the plan", r.stderr)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "moded"))
    assert.equal(1, (cli.version(h.srv)))
  end)

  it("stops a step that wrote fewer than planned before its stamp", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    -- the same plan without step 2's list: an object step 2 would label is gone from the selector...
    local doc = read_plan(path)
    -- ...so instead make the run find one fewer: the plan holds a write the run will not make
    local extra = { method = "DELETE", path = "/api/v1/namespaces/cozy-system/configmaps/never",
      digest = sys.sha256("") }
    table.insert(doc.steps[2].writes, 1, extra)
    doc.digest = nil
    local copy = {}
    for k, v in pairs(doc) do copy[k] = v end
    doc.digest = sys.sha256(json.encode(json.object(copy)))
    files.write(path, json.encode(doc))
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "bind", "run", "--plan", path))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 2 wrote fewer than planned: the planned write DELETE "
      .. "/api/v1/namespaces/cozy%-system/configmaps/never[^\n]* was not made", r.stderr)
    assert.equal(2, (cli.version(h.srv)))
  end)
end)

describe("a plan file run --plan cannot use", function()
  local h = harness.fake { fixtures = { fixture() } }

  local function refused(path, pattern, ...)
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "bind", "run", "--plan", path, ...))
    assert.equal(2, r.code, r.stdout .. r.stderr)
    assert.matches(pattern, r.stderr)
    assert.is_nil(r.stderr:find("traceback", 1, true))
    assert.same({}, h:writes())
  end

  it("is refused, exit 2, when it is not JSON", function()
    local path = cli.tmpdir() .. "/plan.json"
    files.write(path, "{\"kind\": \"CozyMigratePlan\", \"vers")
    refused(path, "%-%-plan [^\n]*: not a JSON document")
  end)

  it("is refused, exit 2, when it does not exist", function()
    refused(cli.tmpdir() .. "/none.json", "%-%-plan [^\n]*: cannot read it")
  end)

  it("is refused, exit 2, when a write in it was edited", function()
    local path, p = plan_file(h, "bind")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    local text = assert(files.read(path))
    local edited, n = text:gsub('"digest":"(%x)', function(c) return '"digest":"' .. (c == "0" and "1" or "0") end, 1)
    assert.equal(1, n)
    files.write(path, edited)
    refused(path, "its digest does not match its content")
  end)

  it("is refused, exit 2, when it was planned for another target", function()
    local path, p = plan_file(h, "bind", "--target", "2")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    refused(path, "planned for target 2; this run's target is 3")
  end)

  it("binds a legacy script step: a script that writes nothing runs, its record counting no write", function()
    local path, p = plan_file(h, "script")
    assert.equal(0, p.code, p.stdout .. p.stderr)
    assert.equal("legacy", read_plan(path).migrations[1].kind)
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "script", "run", "--plan", path))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    -- it left the version, as planned (the default rule goes on): its record says so, and that it wrote nothing
    local v, cm = cli.version(h.srv)
    assert.equal(1, v)
    local rec = cli.history(cm)[1]
    assert.same({ "1-script", "unstamped", 0 }, { rec.name, rec.result, rec.writes })
    h:reset(fixture())
  end)

  it("is refused, exit 2, when it is not a plan", function()
    local path = cli.tmpdir() .. "/plan.json"
    files.write(path, '{"kind":"ConfigMap","version":1}')
    refused(path, 'kind is "ConfigMap", not CozyMigratePlan')
  end)
end)
