-- The drop-in, proven (issue 25 item 6): a directory of legacy scripts in
-- the platform's style (spec/fixtures/dropin/migrations: `#!/bin/sh` with
-- `set -euo pipefail`, mode 0644, `. "$(dirname "$0")/lib/common.sh"`, stamps
-- by `kubectl apply` of the labelled ConfigMap, one script that exits 0
-- without stamping, one that patches through `--subresource status`) runs in
-- ONE run with the built-in 55 and 59, under kubectl v1.34.2 (spec/support's,
-- first on PATH), from 55 to 61. Against the real API server in CI
-- (REAL_SERVER_SPECS), the fake otherwise. Then the same run from a Debian
-- workstation's shell, dash, which refuses `set -o pipefail` itself.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli
local json = require "cozy.json"
local scenarios = require "spec.fixtures.59-vmi-hotplug.scenarios"

local DIR = files.absolute("spec/fixtures/dropin/migrations")
local SCRIPTS = { "56-tenant-status", "57-best-effort", "58-record", "60-finish" }
local NO_DELETE = "platform.cozystack.io/no-delete"
local ADDON = { -- 55's HelmReleases (spec/migrations/55-fluxcd-addon-orphan_spec.lua)
  "tenant-a/kubernetes-alpha-fluxcd", "tenant-a/kubernetes-alpha-fluxcd-operator",
  "tenant-b/kubernetes-beta-fluxcd", "tenant-b/kubernetes-beta-fluxcd-operator",
}
-- kubectl first: the one spec/support builds (spec/support/README.md)
local PATH = files.absolute("spec/support") .. ":" .. os.getenv("PATH")

-- 55's cluster and 59's in one, at version 55 with the label the platform's
-- chart gives the ConfigMap
local function cluster()
  -- cli.fixture brings the namespace and the ConfigMap
  local seen, items = { ["Namespace//cozy-system"] = true, ["ConfigMap/cozy-system/cozystack-version"] = true }, {}
  for _, path in ipairs { "spec/fixtures/55-fluxcd-addon-orphan/cluster.json",
      "spec/fixtures/59-vmi-hotplug/cluster.json" } do
    for _, o in ipairs(json.decode(assert(files.read(path))).items) do
      local key = o.kind .. "/" .. (o.metadata.namespace or "") .. "/" .. o.metadata.name
      if not seen[key] then
        seen[key] = true
        items[#items + 1] = o
      end
    end
  end
  return cli.fixture(55, items, { [NO_DELETE] = "true" })
end

-- what each script reported before it changed anything (lib/common.sh's
-- report), by script name
local function reports(stderr)
  local out = {}
  for fields in stderr:gmatch("INFO  seen (.-) migration=") do
    local t = {}
    for k, v in fields:gmatch("(%w+)=(%S*)") do t[k] = v end
    out[t.step] = t
  end
  return out
end

local function split(key) return key:match("^([^/]+)/(.+)$") end

describe("the platform's style of legacy scripts with the built-in 55 and 59, in one run", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cluster() } } end)
  teardown(function() srv:stop() end)

  -- the VMs of the cluster, counted by namespace (what 60-finish annotates)
  local function vms_by_namespace()
    local out = {}
    for _, o in ipairs(cluster()) do
      if o.kind == "VirtualMachine" then out[o.metadata.namespace] = (out[o.metadata.namespace] or 0) + 1 end
    end
    return out
  end

  -- everything one run from 55 to 61 must leave, whichever shell started it
  local function assert_the_run(r, root_before)
    assert.equal(0, r.code, r.stderr)
    -- what each script saw: its own version (not the run's), the run's
    -- target, its own directory, bash in POSIX mode with pipefail, the
    -- current kubectl, and the ConfigMap labelled, with the history so far
    local seen = reports(r.stderr)
    local want = {
      ["56-tenant-status"] = { current = "56", version = "56", history = "1" },
      ["57-best-effort"] = { current = "57", version = "57", history = "2" },
      ["58-record"] = { current = "58", version = "57", history = "3" },
      ["60-finish"] = { current = "60", version = "60", history = "5" },
    }
    for _, name in ipairs(SCRIPTS) do
      local s = assert(seen[name], name .. " did not report:\n" .. r.stderr)
      assert.same(want[name], { current = s.current, version = s.version, history = s.history }, name)
      assert.same({ "61", "cozy-system", DIR, "on", "v1.34.2", "true" },
        { s.target, s.ns, s.cwd, s.pipefail, s.kubectl, s.label }, name)
      assert.matches("/bash$", s.shell, nil, false)
    end
    -- 57 left the version; the run went on, and 58 stamped past it
    assert.matches("WARN  step did not stamp: the version stays, the run goes on to the next step", r.stderr, 1, true)
    assert.matches('reason="' .. DIR .. '/57-best-effort exited 0 without stamping 58"', r.stderr, 1, true)
    assert.matches('namespaces "tenant-gone" not found', r.stderr, 1, true)
    assert.matches("1 step(s) did not stamp: version is 61, target 61", r.stderr, 1, true)
    assert.matches("stamped_past=57", r.stderr, 1, true)

    -- one ConfigMap: the scripts' stamps, the engine's stamps and its history
    local version, cm = cli.version(srv)
    assert.equal(61, version)
    assert.equal("true", cm.metadata.labels[NO_DELETE])
    local keys = {}
    for k in pairs(cm.data) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.same({ "history", "version" }, keys)
    -- a script's apply left its last-applied configuration: its three-way
    -- merge saw no history there, so it never removed it
    local applied = json.decode(cm.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"])
    assert.same({ version = "61" }, applied.data)
    local h = cli.history(cm)
    local got = {}
    for i, rec in ipairs(h) do got[i] = { rec.name, rec.from, rec.to, rec.result or "stamped" } end
    assert.same({
      { "55-fluxcd-addon-orphan", 55, 56, "stamped" },
      { "56-tenant-status", 56, 57, "stamped" },
      { "57-best-effort", 57, 58, "unstamped" },
      { "58-record", 58, 59, "stamped" },
      { "59-vmi-hotplug", 59, 60, "stamped" },
      { "60-finish", 60, 61, "stamped" },
    }, got)
    assert.same({ 57, DIR .. "/57-best-effort exited 0 without stamping 58" }, { h[3].version, h[3].reason })

    -- 55: the addon's HelmReleases orphaned, the others kept
    for _, key in ipairs(ADDON) do
      local ns, name = split(key)
      assert.is_nil(srv:object("HelmRelease", ns, name), key)
    end
    assert.is_not_nil(srv:object("HelmRelease", "tenant-c", "kubernetes-gamma-fluxcd-extras"))
    -- 56: tenants labelled; the root tenant's HelmRelease status written
    -- through its subresource, its spec (and so its generation) untouched
    for _, tenant in ipairs { "root", "a", "b", "c" } do
      assert.equal(tenant, srv:object("Namespace", nil, "tenant-" .. tenant).metadata.labels["dropin.cozystack.io/tenant"])
    end
    local root = srv:object("HelmRelease", "tenant-root", "tenant-root")
    assert.equal("dropin-56", root.status.lastHandledReconcileAt)
    assert.same({ root_before.metadata.generation, root_before.spec }, { root.metadata.generation, root.spec })
    -- 57: what it could do, done
    assert.equal("done", srv:object("Namespace", nil, "tenant-a").metadata.annotations["dropin.cozystack.io/step-57"])
    -- 58: its CURRENT_VERSION, and the version 57 left
    assert.same({ current = "58", found = "57" }, srv:object("ConfigMap", "cozy-system", "dropin-58").data)
    -- 59: each VM that needed it holds its VMI's hotplug volumes
    for key, copy in pairs(scenarios.expected_copies) do
      local ns, name = split(key)
      local names = {}
      for _, v in ipairs(srv:object("VirtualMachine", ns, name).spec.template.spec.volumes or {}) do
        names[v.name] = true
      end
      for _, v in ipairs(copy.volumes) do assert.is_true(names[v] == true, key .. " lacks " .. v) end
    end
    -- 60: after 59, every namespace with VMs annotated with their count
    for ns, count in pairs(vms_by_namespace()) do
      assert.equal(tostring(count), srv:object("Namespace", nil, ns).metadata.annotations["dropin.cozystack.io/vms"], ns)
    end
  end

  it("reads as the platform's scripts are: mode 0644 in git, #!/bin/sh with pipefail, lib/ sourced", function()
    local r = cli.shell("git ls-files -s " .. files.quote("spec/fixtures/dropin/migrations"))
    assert.equal(0, r.code, r.stderr)
    local modes = {}
    for mode, path in r.stdout:gmatch("(%d+) %x+ %d+\t([^\n]+)") do modes[path:match("[^/]+$")] = mode end
    for _, name in ipairs(SCRIPTS) do
      assert.equal("100644", modes[name], name)
      local text = assert(files.read(DIR .. "/" .. name))
      assert.equal("#!/bin/sh\n", text:sub(1, 10))
      assert.matches("\nset %-euo pipefail\n", text)
      assert.matches('\n%. "%$%(dirname "%$0"%)/lib/common%.sh"\n', text)
    end
    assert.equal("100644", modes["common.sh"])
  end)

  it("runs with 55 and 59 under the current kubectl: stamps, history, objects, the label kept", function()
    srv:reset(cluster())
    local root_before = srv:object("HelmRelease", "tenant-root", "tenant-root")
    local r = cli.run({ "run", "--kubeconfig", srv.kubeconfig, "--migrations", DIR, "--target", "61" },
      { PATH = PATH })
    assert_the_run(r, root_before)
  end)

  it("runs the same from a Debian workstation's shell, where /bin/sh is dash", function()
    -- the shell the engine is started from refuses the scripts' own first line
    local refused = cli.shell("dash -c 'set -euo pipefail'")
    assert.equal(2, refused.code)
    assert.matches("Illegal option -o pipefail", refused.stderr, 1, true)

    srv:reset(cluster())
    local root_before = srv:object("HelmRelease", "tenant-root", "tenant-root")
    local home = cli.tmpdir()
    finally(function() files.rm_rf(home) end)
    local cmdline = ("cd %s && exec env -u NAMESPACE -u TARGET_VERSION -u CURRENT_VERSION -u POD_NAME PATH=%s "
      .. "SHELL=/bin/dash %s run --kubeconfig %s --migrations %s --target 61")
      :format(files.quote(home), files.quote(PATH), files.quote(files.absolute(cli.bin)),
        files.quote(srv.kubeconfig), files.quote(DIR))
    local r = cli.shell("dash -c " .. files.quote(cmdline))
    assert_the_run(r, root_before)
  end)
end)
