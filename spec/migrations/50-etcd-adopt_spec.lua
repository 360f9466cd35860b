-- Migration 50-etcd-adopt (a port of the platform's script 50) on the spec harness
-- (spec/README.md): the cluster of spec/fixtures/50-etcd-adopt/cluster.lua, the
-- etcd-migrate double on PATH (spec/support/etcd-migrate) and the controller double
-- (spec/support/etcd-controllers) running in the background while a run does, playing
-- cert-manager's re-issue and the Deployment's rollout. The port runs through the
-- binary (its tool is found on PATH and its parameters read from the environment, as in
-- the hook Job). The #platform cases run the platform's own script 50 beside it
-- (spec/helpers/differential.lua) with the same doubles; docs/migrations/50-etcd-adopt.md
-- lists every difference, each named in a case here.
local harness = require "spec.helpers"
local files = harness.files
local cli = harness.cli
local differential = harness.differential
local fixture = require "spec.fixtures.50-etcd-adopt.cluster"

local q = files.quote
local CRD_DIR = files.absolute("spec/fixtures/50-etcd-adopt/crds")
local OPERATOR = { "Deployment.apps", "cozy-etcd-operator", "etcd-operator-controller-manager" }
local SNAPSHOT = { "--backup-s3-endpoint=https://s3.example.org", "--backup-s3-bucket=bucket-0f3a",
  "--backup-s3-credentials-secret=cozy-backups-creds", "--backup-s3-key=cozy-system/etcd-adoption/",
  "--backup-s3-region=us-east-1", "--backup-s3-force-path-style" }
local DRY_RUN = "--new-controller=cozy-etcd-operator/etcd-operator-controller-manager --skip-controller-check"
local APPLY = DRY_RUN .. " --apply --yes --agent-image=ghcr.io/cozystack/etcd-operator:v0.5.2 "

-- The kubectl on the doubles' and the shell's PATH. The fake serves no scale
-- subresource (spec/support/README.md, "Deliberate differences"): there the
-- shell's `kubectl -n NS scale deploy NAME --replicas=N` is sent as the merge
-- patch of spec.replicas it amounts to; the real server gets the real scale.
local KUBECTL_FAKE = [[#!/bin/bash
if [ "$1 $3 $4" = "-n scale deploy" ]; then
  exec %s -n "$2" patch deploy "$5" --type=merge -p "{\"spec\":{\"replicas\":${6#--replicas=}}}"
fi
exec %s "$@"
]]

-- A directory with bin/ (etcd-migrate, kubectl) and the files the doubles write.
local function tooling(real)
  local dir = files.tmpdir()
  local bin = dir .. "/bin"
  assert(files.sh("mkdir -p " .. q(bin)) == 0)
  assert(files.sh(("ln -s %s %s"):format(q(files.absolute("spec/support/etcd-migrate")), q(bin .. "/etcd-migrate"))) == 0)
  local kubectl = q(differential.kubectl())
  files.write(bin .. "/kubectl", real and ("#!/bin/sh\nexec " .. kubectl .. ' "$@"\n')
    or KUBECTL_FAKE:format(kubectl, kubectl))
  assert(files.sh("chmod +x " .. q(bin .. "/kubectl")) == 0)
  return dir, { PATH = bin .. ":" .. os.getenv("PATH"), ETCD_MIGRATE_CALLS = dir .. "/calls",
    KUBECTL = differential.kubectl(), ETCD_CRD_DIR = CRD_DIR }
end

-- The controller double in the background until stop() (which waits for it to end).
local function controllers(h, dir, never)
  local stop = dir .. "/controllers-stop"
  files.sh(("rm -f %s %s.passes"):format(q(stop), q(stop)))
  local args = { q(files.absolute("spec/support/etcd-controllers")), q(h.srv.kubeconfig), q(stop) }
  for _, n in ipairs(never or {}) do args[#args + 1] = "--never " .. q(n) end
  os.execute(("KUBECTL=%s %s >%s 2>&1 </dev/null & echo $! >%s"):format(q(differential.kubectl()),
    table.concat(args, " "), q(dir .. "/controllers.log"), q(dir .. "/controllers.pid")))
  -- its first pass done: what the fixture needs (the operator's status) is there
  assert(cli.poll(30, function() return files.read(stop .. ".passes") end), "the controller double did not start")
  return function()
    files.write(stop, "")
    local pid = (files.read(dir .. "/controllers.pid") or ""):match("%d+")
    cli.poll(10, function() return files.sh("kill -0 " .. pid .. " 2>/dev/null") ~= 0 end)
  end
end

local function ends_with(text, tail) return text:sub(-#tail) == tail end

-- The double's calls, each without its --kubeconfig=PATH: every call has exactly one,
-- naming a file (the double reads only it: a call without one cannot reach the server).
local function calls(dir)
  local out = {}
  for line in (files.read(dir .. "/calls") or ""):gmatch("[^\n]+") do
    local rest, n = line:gsub(" ?%-%-kubeconfig=%S+", "")
    assert.equal(1, n, "a call without --kubeconfig=: " .. line)
    out[#out + 1] = rest .. "\n"
  end
  return table.concat(out)
end

local function replicas(h)
  return h:object(OPERATOR[1], OPERATOR[2], OPERATOR[3]).spec.replicas
end

local function version(h)
  return h:object("ConfigMap", "cozy-system", "cozystack-version").data.version
end

local function v2(h, ns, name) return h:object("EtcdCluster.etcd-operator.cozystack.io", ns, name) end
local function legacy(h, ns, name) return h:object("EtcdCluster.etcd.aenix.io", ns, name) end
local function dns_names(h, ns, name) return h:object("Certificate.cert-manager.io", ns, name).spec.dnsNames end

local RUN = { "run", "--no-builtin", "--migrations", "migrations", "--target", "51" }

describe("migration 50-etcd-adopt", function()
  local h = harness.fake { fixtures = { fixture.items() } }
  local dir, env, stop_controllers

  before_each(function()
    dir, env = tooling(h.srv.real)
  end)
  after_each(function()
    if stop_controllers then stop_controllers() end
    stop_controllers = nil
    files.rm_rf(dir)
  end)

  local function run_port(extra_env, never)
    stop_controllers = controllers(h, dir, never)
    for k, v in pairs(extra_env or {}) do env[k] = v end
    return h:cli(RUN, env)
  end

  it("is no more code lines than the shell (counted alike: its lib holds only the stamp helper) #platform", function()
    local counts = differential.line_counts(50, "migrations/50-etcd-adopt.lua")
    assert.equal(365, counts.shell)
    assert.is_true(counts.lua <= counts.shell, counts.lua .. " > " .. counts.shell)
  end)

  -- The platform's script 50 and the port, each from `items` with the controller
  -- double running, `extra` in both environments; `first` (an env) runs each side
  -- once before (a partial adoption to rerun from). Returns d as differential.run
  -- does, each side with its etcd-migrate calls (the shell's --kubeconfig= left out,
  -- each call's flags sorted: the two order them differently).
  local function beside_shell(items, extra, first)
    local function flags(side_calls)
      local out = {}
      for line in side_calls:gmatch("[^\n]+") do
        local call = {}
        for flag in line:gmatch("%S+") do call[#call + 1] = flag end
        table.sort(call)
        out[#out + 1] = table.concat(call, " ")
      end
      return out
    end
    local function side(run)
      h:reset(items)
      files.write(dir .. "/calls", "")
      stop_controllers = controllers(h, dir)
      if first then run(first) end
      local res = run(extra or {})
      -- the controller double's work on a scale made as the run ended (finally's, the
      -- shell's EXIT trap) done before it stops: the operator's status at its spec, as
      -- written by a pass begun after the run ended. The status alone does not say so:
      -- a pass that read the scale-down can write its stale status after a poll saw the
      -- old one match (the fake gives a Deployment no generation to tell them apart),
      -- which failed this spec once in CI. Passes are counted at their ends, so the
      -- second one to end from now began after the run.
      local passes = dir .. "/controllers-stop.passes"
      local now = tonumber(files.read(passes)) or 0
      assert(cli.poll(30, function()
        local o = h:object(OPERATOR[1], OPERATOR[2], OPERATOR[3])
        return (tonumber(files.read(passes)) or 0) >= now + 2
          and o and o.status and o.status.replicas == o.spec.replicas
          and (o.status.observedGeneration or 0) >= (o.metadata.generation or 0)
      end), "the controller double did not settle the operator's status")
      stop_controllers()
      stop_controllers = nil
      res.objects, res.calls, res.version = differential.state(h), flags(calls(dir)), version(h)
      -- the runner's own objects (its Lease, its Events), which the shell has not
      for key in pairs(res.objects) do
        if key:find("^Event ") or key == "Lease cozy-system/cozystack-migrations" then res.objects[key] = nil end
      end
      return res
    end
    local shell = side(function(vars)
      local e = { ETCD_MIGRATE_KUBECONFIG = h.srv.kubeconfig, ETCD_ADOPT_SA_DIR = dir .. "/no-serviceaccount" }
      for k, v in pairs(env) do e[k] = v end
      for k, v in pairs(vars) do e[k] = v end
      return differential.run_shell(h, 50, e)
    end)
    local port = side(function(vars)
      local e = {}
      for k, v in pairs(env) do e[k] = v end
      for k, v in pairs(vars) do e[k] = v end
      return h:cli(RUN, e)
    end)
    return { shell = shell, port = port }
  end

  -- both sides left the same objects; else each differing object of each side, shown
  local function no_differences(d)
    local shown = {}
    for _, key in ipairs(differential.differences(d)) do
      shown[#shown + 1] = ("%s\n  shell: %s\n  port:  %s"):format(key,
        require("cozy.json").encode(d.shell.objects[key] or false),
        require("cozy.json").encode(d.port.objects[key] or false))
    end
    assert.equal("", table.concat(shown, "\n"))
  end

  describe("beside the platform's script 50", function()
    it("the normal adoption: the same objects, the same etcd-migrate calls #platform", function()
      local d = beside_shell(fixture.items())
      assert.equal(0, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(0, d.port.code, d.port.stderr)
      no_differences(d)
      assert.same(d.shell.calls, d.port.calls)
      assert.equal(2, #d.port.calls)
      assert.equal("51", d.shell.version)
      assert.equal("51", d.port.version)
      assert.is_not_nil(d.port.objects["EtcdCluster tenant-a/etcd"])
    end)

    it("skip-backup: the same objects (no credentials staged), both pass --skip-backup #platform", function()
      local d = beside_shell(fixture.items(), { ETCD_ADOPT_SKIP_BACKUP = "1" })
      assert.equal(0, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(0, d.port.code, d.port.stderr)
      no_differences(d)
      assert.same(d.shell.calls, d.port.calls)
      assert.matches("%-%-skip%-backup", d.port.calls[2])
      assert.is_nil(d.port.objects["Secret tenant-a/cozy-backups-creds"])
    end)

    it("a failing tool: both fail and leave the version, the same partial adoption, the operator at 1 #platform", function()
      local d = beside_shell(fixture.items(), { ETCD_MIGRATE_FAIL_AT = "tenant-b/etcd-b" })
      -- the shell exits with the tool's status (set -e; the EXIT trap keeps it), the runner 1
      assert.equal(3, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(1, d.port.code, d.port.stderr)
      no_differences(d)
      assert.equal("50", d.shell.version)
      assert.equal("50", d.port.version)
      assert.equal(1, d.port.objects["Deployment cozy-etcd-operator/etcd-operator-controller-manager"].spec.replicas)
      assert.is_not_nil(d.port.objects["EtcdCluster tenant-b/etcd-b"])
    end)

    it("a rerun after a partial adoption: both complete it and stamp, the same objects #platform", function()
      local d = beside_shell(fixture.items(), {}, { ETCD_MIGRATE_FAIL_AT = "tenant-b/etcd-b" })
      assert.equal(0, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(0, d.port.code, d.port.stderr)
      no_differences(d)
      assert.same(d.shell.calls, d.port.calls)
      assert.equal(4, #d.port.calls)
      assert.equal("51", d.port.version)
    end)

    it("the v1alpha2 CRDs absent: both apply the image's copy; the same objects #platform", function()
      local d = beside_shell(fixture.items { without = {
        ["CustomResourceDefinition etcdclusters.etcd-operator.cozystack.io"] = true } })
      assert.equal(0, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(0, d.port.code, d.port.stderr)
      no_differences(d)
    end)

    it("no backup target: both refuse before any write, naming the hatch #platform", function()
      local d = beside_shell(fixture.items { without = { ["Secret cozy-velero/cozy-backups-creds"] = true } })
      assert.equal(1, d.shell.code)
      assert.equal(1, d.port.code)
      assert.matches("etcdAdoptSkipBackup: true", d.shell.stderr, 1, true)
      assert.matches("etcdAdoptSkipBackup: true", d.port.stderr, 1, true)
      no_differences(d)
      assert.same({}, d.port.calls)
      assert.same({}, d.shell.calls)
    end)

    it("ETCD_ADOPT_SKIP_BACKUP=TRUE: the shell skips the backup, the port refuses it (exit 2, nothing run) #platform", function()
      local d = beside_shell(fixture.items(), { ETCD_ADOPT_SKIP_BACKUP = "TRUE" })
      assert.equal(0, d.shell.code, d.shell.stdout .. d.shell.stderr)
      assert.equal(2, d.port.code, d.port.stderr)
      assert.matches("%-%-skip%-backup", d.shell.calls[2])
      assert.same({}, d.port.calls)
      assert.equal("50", d.port.version)
    end)
  end)

  it("adopts: SANs re-issued, credentials staged, dry run then --apply, operator back at 1, version 51", function()
    local r = run_port()
    assert.equal(0, r.code, r.stderr)
    assert.equal("51", version(h))
    assert.equal(DRY_RUN .. "\n" .. APPLY .. table.concat(SNAPSHOT, " ") .. "\n", calls(dir))
    for _, c in ipairs { { "tenant-a", "etcd" }, { "tenant-b", "etcd-b" } } do
      assert.is_nil(legacy(h, c[1], c[2]))
      assert.is_not_nil(v2(h, c[1], c[2]))
      assert.equal("https://s3.example.org",
        h:object("ConfigMap", c[1], "etcd-adoption-snapshot-" .. c[2]).data.endpoint)
      local staged = h:object("Secret", c[1], "cozy-backups-creds")
      assert.equal("cozystack-backups", staged.metadata.labels["apps.cozystack.io/managed-by"])
      assert.is_nil(staged.metadata.labels["internal.cozystack.io/tenantresource"])
      assert.is_nil(staged.metadata.annotations)
    end
    for _, cert in ipairs { "etcd-server", "etcd-peer" } do
      local names = dns_names(h, "tenant-a", cert)
      assert.same({ "*.etcd-headless.tenant-a.svc", "*.etcd.tenant-a.svc", "etcd-0.etcd-headless.tenant-a.svc",
        "etcd-1.etcd-headless.tenant-a.svc", "etcd-2.etcd-headless.tenant-a.svc" }, names)
      assert.equal(table.concat(names, ","),
        h:object("Secret", "tenant-a", cert .. "-tls").metadata.annotations["cert-manager.io/alt-names"])
    end
    assert.equal(1, replicas(h))
    assert.matches("legacy etcd.aenix.io backup resources will NOT be migrated", r.stderr, 1, true)
    assert.matches("tenant-a/nightly", r.stderr, 1, true)
  end)

  it("skip-backup (ETCD_ADOPT_SKIP_BACKUP=1): --skip-backup, no credentials staged, no snapshot, a warning", function()
    local r = run_port { ETCD_ADOPT_SKIP_BACKUP = "1" }
    assert.equal(0, r.code, r.stderr)
    assert.equal(DRY_RUN .. "\n" .. APPLY .. "--skip-backup\n", calls(dir))
    assert.matches("adopting live etcd WITHOUT a pre-adoption safety snapshot", r.stderr, 1, true)
    for _, c in ipairs { { "tenant-a", "etcd" }, { "tenant-b", "etcd-b" } } do
      assert.is_not_nil(v2(h, c[1], c[2]))
      assert.is_nil(h:object("Secret", c[1], "cozy-backups-creds"))
      assert.is_nil(h:object("ConfigMap", c[1], "etcd-adoption-snapshot-" .. c[2]))
    end
    assert.equal("51", version(h))
  end)

  it("skip-backup takes the spellings 1|true|yes; a capitalised one is refused before anything runs (exit 2)", function()
    stop_controllers = controllers(h, dir)
    env.ETCD_ADOPT_SKIP_BACKUP = "TRUE"
    local r = h:cli(RUN, env)
    assert.equal(2, r.code, r.stderr)
    assert.matches("ETCD_ADOPT_SKIP_BACKUP", r.stderr, 1, true)
    assert.equal("", calls(dir))
    assert.equal("50", version(h))
    env.ETCD_ADOPT_SKIP_BACKUP = "yes"
    r = h:cli(RUN, env)
    assert.equal(0, r.code, r.stderr)
    assert.is_true(ends_with(calls(dir), " --skip-backup\n"))
  end)

  it("a failing tool fails the step: the version stays, finally scales the operator back up", function()
    local r = run_port { ETCD_MIGRATE_FAIL_AT = "tenant-b/etcd-b" }
    assert.equal(1, r.code, r.stderr)
    assert.matches('tool etcd-migrate exited with status 3, its last stderr line: "error: adopting tenant-b/etcd-b: '
      .. 'member etcd-b-0 not healthy"', r.stderr, 1, true)
    assert.equal("50", version(h))
    assert.equal(1, replicas(h))
    assert.matches("finally done", r.stderr, 1, true)
    -- the partial adoption the tool left: tenant-a adopted, tenant-b not
    assert.is_not_nil(v2(h, "tenant-a", "etcd"))
    assert.is_nil(legacy(h, "tenant-a", "etcd"))
    assert.is_not_nil(legacy(h, "tenant-b", "etcd-b"))
    assert.is_nil(v2(h, "tenant-b", "etcd-b"))
  end)

  it("a rerun after a partial adoption completes it and stamps", function()
    local r = run_port { ETCD_MIGRATE_FAIL_AT = "tenant-b/etcd-b" }
    assert.equal(1, r.code, r.stderr)
    assert.is_nil(legacy(h, "tenant-a", "etcd"))
    env.ETCD_MIGRATE_FAIL_AT = nil
    r = h:cli(RUN, env)
    assert.equal(0, r.code, r.stderr)
    assert.equal("51", version(h))
    -- the rerun found one legacy cluster; its SANs were done by the first run
    assert.matches("Found 1 legacy", r.stderr, 1, true)
    assert.matches("tenant-b/etcd-b-server: native wildcard already present", r.stderr, 1, true)
    assert.is_nil(legacy(h, "tenant-b", "etcd-b"))
    assert.is_not_nil(v2(h, "tenant-b", "etcd-b"))
    assert.is_not_nil(v2(h, "tenant-a", "etcd"))
    assert.equal(1, replicas(h))
    local _, applies = calls(dir):gsub("%-%-apply", "")
    assert.equal(2, applies)
  end)

  it("SIGTERM between scale-down and scale-up (during --apply): the operator is scaled up again, version stays", function()
    stop_controllers = controllers(h, dir)
    env.ETCD_MIGRATE_HOLD = dir .. "/hold"
    local args = { table.unpack(RUN) }
    args[#args + 1], args[#args + 2] = "--kubeconfig", h.srv.kubeconfig
    local p = cli.start(args, env)
    finally(function() p:cleanup() end)
    -- etcd-migrate --apply is running: the operator is at 0
    assert.truthy(cli.poll(60, function() return files.read(dir .. "/hold.waiting") end), p:stderr())
    assert.equal(0, replicas(h))
    p:kill("TERM")
    local r = p:wait(60)
    assert.equal(1, r.code, r.stderr)
    assert.matches("stopped by signal 15 during tool etcd-migrate", r.stderr, 1, true)
    assert.matches("finally done", r.stderr, 1, true)
    assert.equal(1, replicas(h))
    assert.equal("50", version(h))
    assert.is_not_nil(legacy(h, "tenant-a", "etcd"))     -- the tool was stopped before its first write
  end)

  it("a certificate never re-issued with its SANs: the wait times out, the step fails closed", function()
    local r = run_port({ ETCD_CERT_REISSUE_SECONDS = "2" }, { "tenant-a/etcd-peer" })
    assert.equal(1, r.code, r.stderr)
    assert.matches("wait for Secret tenant-a/etcd-peer-tls", r.stderr, 1, true)
    assert.matches("timed out after 2s", r.stderr, 1, true)
    assert.equal("50", version(h))
    -- nothing past the wait: no tool, the operator never scaled, no credentials staged
    assert.equal("", calls(dir))
    assert.same({}, h:requests { method = "PATCH", path = "deployments/etcd%-operator%-controller%-manager$" })
    assert.equal(1, replicas(h))
    assert.is_nil(h:object("Secret", "tenant-a", "cozy-backups-creds"))
    -- the server Certificate before it was re-issued; the peer's spec has the SANs, its Secret not
    assert.matches("%*%.etcd%.tenant%-a%.svc", h:object("Secret", "tenant-a", "etcd-server-tls")
      .metadata.annotations["cert-manager.io/alt-names"])
    assert.not_matches("%*%.etcd%.tenant%-a%.svc", h:object("Secret", "tenant-a", "etcd-peer-tls")
      .metadata.annotations["cert-manager.io/alt-names"])
  end)

  it("the v1alpha2 CRDs absent: applied from ETCD_CRD_DIR and waited on until established", function()
    h:reset(fixture.items { without = { ["CustomResourceDefinition etcdclusters.etcd-operator.cozystack.io"] = true } })
    h.srv:delete_crd("etcdclusters.etcd-operator.cozystack.io")
    local r = run_port()
    assert.equal(0, r.code, r.stderr)
    assert.matches("CRD etcdclusters.etcd-operator.cozystack.io: applied from etcdclusters.etcd-operator.cozystack.io.json",
      r.stderr, 1, true)
    assert.is_not_nil(v2(h, "tenant-a", "etcd"))
  end)

  it("no etcd.aenix.io CRD: nothing to migrate, the tool never runs, stamped", function()
    h:reset(fixture.items { without = { ["CustomResourceDefinition etcdclusters.etcd.aenix.io"] = true,
      ["EtcdCluster tenant-a/etcd"] = true, ["EtcdCluster tenant-b/etcd-b"] = true } })
    h.srv:delete_crd("etcdclusters.etcd.aenix.io")
    local r = run_port()
    assert.equal(0, r.code, r.stderr)
    assert.matches("No etcd.aenix.io CRD present; nothing to migrate", r.stderr, 1, true)
    assert.equal("", calls(dir))
    assert.equal("51", version(h))
  end)

  it("no backup target (the credentials Secret absent): refuses before any write, naming the hatch", function()
    h:reset(fixture.items { without = { ["Secret cozy-velero/cozy-backups-creds"] = true } })
    local r = run_port()
    assert.equal(1, r.code, r.stderr)
    assert.matches("refusing to adopt live etcd without a safety snapshot", r.stderr, 1, true)
    assert.matches("etcdAdoptSkipBackup: true", r.stderr, 1, true)
    assert.equal("", calls(dir))
    assert.equal(1, replicas(h))
    assert.same({}, h:requests { method = "PATCH", path = "certificates" })
  end)

  it("plan: etcd-migrate's dry run runs, its --apply is not rehearsed, nothing changes", function()
    stop_controllers = controllers(h, dir)
    local r = h:cli({ "plan", "--no-builtin", "--migrations", "migrations", "--target", "51" }, env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(DRY_RUN .. "\n", calls(dir))
    assert.matches("not rehearsed: step 50 (50-etcd-adopt): tool etcd-migrate run without dry-run marking", r.stdout, 1, true)
    assert.equal("50", version(h))
    assert.equal(1, replicas(h))
    assert.is_not_nil(legacy(h, "tenant-a", "etcd"))
    assert.equal(3, #dns_names(h, "tenant-a", "etcd-peer"))
  end)

  it("check: the Certificate patches and the adoption as findings, the parameters shown; only the dry run runs", function()
    local r = h:cli({ "check", "--no-builtin", "--migrations", "migrations", "--target", "51" }, env)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(DRY_RUN .. "\n", calls(dir))
    assert.matches("[INFO] 50-etcd-adopt: would patch certificates tenant-a/etcd-peer", r.stdout, 1, true)
    assert.matches("[INFO] 50-etcd-adopt: would adopt 2 cluster(s) with etcd-migrate --apply", r.stdout, 1, true)
    assert.matches('parameter ETCD_ADOPT_SKIP_BACKUP = "0" (default)', r.stdout, 1, true)
    assert.matches("[INFO] 50-etcd-adopt: tools: etcd-migrate", r.stdout, 1, true)
    assert.equal(3, #dns_names(h, "tenant-a", "etcd-peer"))
  end)

  it("an external bucket (no BucketClaim claims it): every coordinate from the Strategy CR", function()
    h:reset(fixture.items { without = { ["BucketClaim cozy-system/cozy-backups"] = true } })
    local r = run_port()
    assert.equal(0, r.code, r.stderr)
    assert.is_true(ends_with(calls(dir), " --backup-s3-endpoint=http://seaweedfs-s3.tenant-root.svc:8333 "
      .. "--backup-s3-bucket=cozy-backups --backup-s3-credentials-secret=cozy-backups-creds "
      .. "--backup-s3-key=cozy-system/etcd-adoption/ --backup-s3-region=us-east-1 --backup-s3-force-path-style\n"), calls(dir))
  end)
end)
