-- The transition image: today's numbered shell scripts in a directory, next
-- to the built-in Lua migrations, in one run. The scripts here are written
-- the way the platform's are (kubectl, a helper sourced through
-- `$(dirname "$0")`, and stamping N+1 themselves).
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local CLUSTER = "spec/fixtures/59-vmi-hotplug/cluster.json"

local function write(path, text, mode)
  files.write(path, text)
  if mode then assert(os.execute("chmod " .. mode .. " " .. cli.quote(path))) end
end

-- A directory with legacy scripts 57 and 58, as the platform ships them.
local function legacy_dir()
  local dir = cli.tmpdir()
  assert(os.execute("mkdir -p " .. cli.quote(dir .. "/lib")))
  write(dir .. "/lib/stamp.sh", [[
# note NAME KEY VALUE: a ConfigMap recording what the script saw
note() {
  printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s","namespace":"%s"},"data":{"%s":"%s"}}' \
    "$1" "$NAMESPACE" "$2" "$3" | kubectl apply -f -
}
stamp() {
  kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge \
    -p "{\"data\":{\"version\":\"$1\"}}"
}
]])
  write(dir .. "/57-etcd-adopt", [[
#!/bin/bash
# sources its helper through its own path, as today's scripts do
set -euo pipefail
. "$(dirname "$0")/lib/stamp.sh"
echo "57: NAMESPACE=$NAMESPACE CURRENT_VERSION=$CURRENT_VERSION TARGET_VERSION=$TARGET_VERSION"
echo "57: ETCD_ADOPT_SKIP_BACKUP=${ETCD_ADOPT_SKIP_BACKUP:-unset}"
note legacy-57 skip "${ETCD_ADOPT_SKIP_BACKUP:-unset}"
stamp $((CURRENT_VERSION + 1))
]], "755")
  write(dir .. "/58-cleanup", [[
#!/bin/bash
# relies on running from its directory: a relative path to its helper
set -euo pipefail
. lib/stamp.sh
echo "58: cwd=$(pwd)"
note legacy-58 cwd "$(pwd)"
stamp $((CURRENT_VERSION + 1))
]], "755")
  return dir
end

local function at_version(srv, v)
  local res = srv:request("PATCH", "/api/v1/namespaces/cozy-system/configmaps/cozystack-version",
    { body = { data = { version = tostring(v) } }, content_type = "application/merge-patch+json" })
  assert(res.status == 200, res.body)
  srv:clear_requests()
end

describe("legacy scripts beside the built-in migrations", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { CLUSTER }, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)

  it("runs legacy 57 and 58 from a directory, then the built-in 59, in one run", function()
    srv:reset(CLUSTER)
    at_version(srv, 57)
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--migrations", dir },
      { NAMESPACE = "cozy-system", TARGET_VERSION = "60", ETCD_ADOPT_SKIP_BACKUP = "true" })
    assert.equal(0, r.code, r.stderr)
    local v, cm = cli.version(srv)
    assert.equal(60, v)

    -- the environment the scripts got, and where they ran
    assert.matches("57: NAMESPACE=cozy%-system CURRENT_VERSION=57 TARGET_VERSION=60", r.stderr)
    assert.matches("58: cwd=" .. dir:gsub("%p", "%%%0"), r.stderr)
    assert.equal("true", srv:object("ConfigMap", "cozy-system", "legacy-57").data.skip)
    local real = io.popen("realpath " .. cli.quote(dir)):read("l")
    assert.equal(real, srv:object("ConfigMap", "cozy-system", "legacy-58").data.cwd)

    -- the history shows all three, in order, each with its kind
    local h = cli.history(cm)
    local steps = {}
    for _, rec in ipairs(h) do steps[#steps + 1] = { rec.number, rec.name, rec.kind, rec.from, rec.to } end
    assert.same({
      { 57, "57-etcd-adopt", "legacy", 57, 58 },
      { 58, "58-cleanup", "legacy", 58, 59 },
      { 59, "59-vmi-hotplug", "lua", 59, 60 },
    }, steps)
    -- 59 did its work (the fixture's VMs needing a copy were patched)
    assert.matches("updated 7 VMs", r.stderr)
    -- the outcome record of 59: its counts, kept with the stamp; legacy
    -- steps report none
    assert.is_nil(h[1].outcome)
    local counts = h[3].outcome.counts
    assert.equal(7, counts.updated)
    assert.is_true(counts.volumes >= 6)
    assert.is_number(counts.disks)
    assert.equal(0, counts.deleted_meanwhile)
    -- status shows it, and its JSON carries it
    local st = cli.run({ "status", "--kubeconfig", srv.kubeconfig, "--migrations", dir },
      { NAMESPACE = "cozy-system", TARGET_VERSION = "60" })
    assert.equal(0, st.code, st.stderr)
    assert.matches("outcome: already_complete=%d+ deleted_meanwhile=0 disks=%d+ updated=7", st.stdout)
    local js = cli.run({ "status", "--output", "json", "--kubeconfig", srv.kubeconfig, "--migrations", dir },
      { NAMESPACE = "cozy-system", TARGET_VERSION = "60" })
    local doc = require("cozy.json").decode(js.stdout)
    assert.equal(7, doc.history[3].outcome.counts.updated)
  end)

  it("lists the directory's scripts beside the built-ins", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local r = cli.run({ "list", "--output", "json", "--migrations", dir })
    assert.equal(0, r.code, r.stderr)
    local doc = json.decode(r.stdout)
    local got = {}
    for _, m in ipairs(doc.migrations) do got[#got + 1] = m.number .. " " .. m.kind end
    -- whatever the build has compiled in (a new built-in must not break this),
    -- with the directory's two scripts in their place
    local builtin = json.decode(cli.run({ "list", "--output", "json" }, { COZY_MIGRATE_MIGRATIONS = "" }).stdout)
    local want = { "57 legacy", "58 legacy" }
    for _, m in ipairs(builtin.migrations) do want[#want + 1] = m.number .. " " .. m.kind end
    table.sort(want, function(a, b) return tonumber(a:match("%d+")) < tonumber(b:match("%d+")) end)
    assert.is_true(#builtin.migrations >= 2)
    assert.same(want, got)
  end)

  it("takes the directory from $COZY_MIGRATE_MIGRATIONS; empty means none", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local r = cli.run({ "list" }, { COZY_MIGRATE_MIGRATIONS = dir })
    assert.equal(0, r.code, r.stderr)
    assert.matches("57%-etcd%-adopt", r.stdout)
    r = cli.run({ "list" }, { COZY_MIGRATE_MIGRATIONS = "" })
    assert.equal(0, r.code, r.stderr)
    assert.not_matches("57%-etcd%-adopt", r.stdout)
    assert.matches("59%-vmi%-hotplug", r.stdout)
  end)

  it("runs the built-in in place of a legacy script of its number: the platform's directory drops in as it is", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    -- the shell original of the built-in 59, as the platform's directory holds it
    write(dir .. "/59", [[
#!/bin/bash
set -euo pipefail
. "$(dirname "$0")/lib/stamp.sh"
note legacy-59 ran yes
stamp $((CURRENT_VERSION + 1))
]], "755")
    srv:reset(CLUSTER)
    at_version(srv, 57)
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--migrations", dir },
      { NAMESPACE = "cozy-system", TARGET_VERSION = "60" })
    assert.equal(0, r.code, r.stderr)
    assert.equal(60, cli.version(srv))
    assert.matches("the built%-in migrations/59%-vmi%-hotplug%.lua runs in place of the legacy script "
      .. dir:gsub("%p", "%%%0") .. "/59", r.stderr)
    -- the script never ran; the built-in did, recorded as the Lua step it is
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "legacy-59"))
    local _, cm = cli.version(srv)
    local steps = {}
    for _, rec in ipairs(cli.history(cm)) do steps[#steps + 1] = { rec.number, rec.name, rec.kind } end
    assert.same({ { 57, "57-etcd-adopt", "legacy" }, { 58, "58-cleanup", "legacy" }, { 59, "59-vmi-hotplug", "lua" } }, steps)
    -- and list shows one 59, the built-in
    local l = json.decode(cli.run({ "list", "--output", "json", "--migrations", dir }).stdout)
    local kinds = {}
    for _, m in ipairs(l.migrations) do if m.number == 59 then kinds[#kinds + 1] = m.kind end end
    assert.same({ "lua" }, kinds)
  end)

  it("refuses a .lua numbered like a built-in, naming both files (exit 2)", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    write(dir .. "/59-other.lua", "return { description = 'x', run = function() end }\n")
    srv:reset(CLUSTER)
    at_version(srv, 57)
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--migrations", dir })
    assert.equal(2, r.code, r.stderr)
    assert.matches(dir:gsub("%p", "%%%0") .. "/59%-other%.lua", r.stderr)
    assert.matches("migrations/59%-vmi%-hotplug%.lua", r.stderr)
    assert.matches("also built in", r.stderr)
    assert.same({}, cli.writes(srv))
  end)

  it("refuses a .lua that shadows a built-in, naming both files (exit 2)", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    write(dir .. "/59-vmi-hotplug.lua", "return { description = 'x', run = function() end }\n")
    local r = cli.run({ "list", "--migrations", dir })
    assert.equal(2, r.code, r.stderr)
    assert.matches(dir:gsub("%p", "%%%0") .. "/59%-vmi%-hotplug%.lua: shadows the built%-in migrations/59%-vmi%-hotplug%.lua",
      r.stderr)
  end)

  it("accepts a directory's .lua of a number the binary does not have", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    write(dir .. "/60-later.lua", "return { description = 'a later step', run = function() end }\n")
    local r = cli.run({ "list", "--output", "json", "--migrations", dir })
    assert.equal(0, r.code, r.stderr)
    local doc = json.decode(r.stdout)
    -- the built-ins, however many there are, the directory's two scripts and 60
    local builtin = json.decode(cli.run({ "list", "--output", "json" }, { COZY_MIGRATE_MIGRATIONS = "" }).stdout)
    assert.equal(#builtin.migrations + 3, #doc.migrations)
    local last = doc.migrations[#doc.migrations]
    assert.same({ 60, "lua", "a later step" }, { last.number, last.kind, last.description })
  end)

  it("runs the directory's set alone with --no-builtin", function()
    local dir = legacy_dir()
    finally(function() os.execute("rm -rf " .. cli.quote(dir)) end)
    local r = cli.run({ "list", "--output", "json", "--no-builtin", "--migrations", dir })
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, #json.decode(r.stdout).migrations)
  end)
end)
