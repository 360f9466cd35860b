-- In-cluster operation, as the hook Job runs: no kubeconfig; a temporary
-- directory stands in for /var/run/secrets/kubernetes.io/serviceaccount
-- ($COZY_MIGRATE_SERVICEACCOUNT_DIR) and KUBERNETES_SERVICE_HOST/PORT point
-- at the fake API server. The namespace file, POD_NAME as the lock holder,
-- a token rotated mid-run, SIGTERM mid-run, and HTTPS_PROXY/NO_PROXY.
local fake = require("spec.helpers").server
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local q = cli.quote

local write = require("spec.helpers").files.write

-- A migration set with one step of `n` writes to ConfigMap runner-test.
local function writes_dir(n)
  local dir = cli.tmpdir()
  write(dir .. "/1-writes.lua", ([[
return {
  description = "writes %d times",
  permissions = {
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "create", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
  },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    if cms:find(ctx.namespace, "runner-test") == nil then
      cms:create{ apiVersion = "v1", kind = "ConfigMap",
        metadata = { name = "runner-test", namespace = ctx.namespace }, data = {} }
    end
    for i = 1, %d do
      cms:merge_patch(ctx.namespace, "runner-test", { data = { i = tostring(i) } })
    end
  end,
}
]]):format(n, n))
  return dir
end

local function port_of(url) return url:match(":(%d+)$") end

-- The service account directory and the environment of a pod.
local function pod(srv, namespace, token)
  local sa = cli.tmpdir()
  write(sa .. "/token", token .. "\n")
  write(sa .. "/ca.crt", cli.slurp(srv.ca))
  write(sa .. "/namespace", namespace)
  local env = { KUBERNETES_SERVICE_HOST = "127.0.0.1", KUBERNETES_SERVICE_PORT = port_of(srv.url),
    COZY_MIGRATE_SERVICEACCOUNT_DIR = sa, KUBECONFIG = false, HOME = sa, COZY_MIGRATE_MIGRATIONS = "",
    HTTPS_PROXY = false, https_proxy = false, HTTP_PROXY = false, http_proxy = false,
    NO_PROXY = false, no_proxy = false }
  return sa, env
end

local function merged(a, b)
  local out = {}
  for k, v in pairs(a) do out[k] = v end
  for k, v in pairs(b or {}) do out[k] = v end
  return out
end

local function fixture(namespace, version)
  local items = { { apiVersion = "v1", kind = "Namespace", metadata = { name = namespace } } }
  if version then
    items[2] = { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "cozystack-version", namespace = namespace }, data = { version = tostring(version) } }
  end
  return items
end

local function patches_of(srv, namespace, name)
  local path = ("namespaces/" .. namespace .. "/configmaps/" .. name):gsub("%p", "%%%0") .. "$"
  return #srv:requests{ method = "PATCH", path = path }
end

describe("in-cluster operation", function()
  local srv, sa, env, dir
  setup(function()
    srv = fake.start{ fixtures = { fixture("tenant-root", 1) }, tls = true, token = "token-one" }
  end)
  teardown(function() srv:stop() end)
  before_each(function()
    srv:reset(fixture("tenant-root", 1))
    srv:control("POST", "/_fake/token", { token = "token-one" })
    sa, env = pod(srv, "tenant-root", "token-one")
  end)
  after_each(function()
    os.execute("rm -rf " .. q(sa))
    if dir then os.execute("rm -rf " .. q(dir)) end
    dir = nil
  end)

  it("takes the namespace from the service account's namespace file, POD_NAME as the lock holder", function()
    dir = writes_dir(3)
    local r = cli.run({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir },
      merged(env, { POD_NAME = "cozystack-migration-hook-x7k2p" }))
    assert.equal(0, r.code, r.stderr)
    local cm = srv:object("ConfigMap", "tenant-root", "cozystack-version")
    assert.equal("2", cm.data.version)
    assert.equal("3", srv:object("ConfigMap", "tenant-root", "runner-test").data.i)
    assert.equal("cozystack-migration-hook-x7k2p", cli.history(cm)[1].runner)
    -- the Lease was taken by the pod's name, in the pod's namespace
    local taken
    for _, req in ipairs(srv:requests{ path = "namespaces/tenant%-root/leases" }) do
      if type(req.body) == "string" and req.body:find("cozystack-migration-hook-x7k2p", 1, true) then taken = req end
    end
    assert.truthy(taken, "no lease write naming the pod")
    assert.is_true(taken.method == "POST" or taken.method == "PATCH" or taken.method == "PUT")
    assert.matches("holder=cozystack%-migration%-hook%-x7k2p", r.stderr)
    -- $NAMESPACE still wins over the file
    srv:reset({ fixture("tenant-root", 1)[1], fixture("cozy-system", 1)[1], fixture("cozy-system", 1)[2] })
    r = cli.run({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir }, merged(env, { NAMESPACE = "cozy-system" }))
    assert.equal(0, r.code, r.stderr)
    assert.equal("2", srv:object("ConfigMap", "cozy-system", "cozystack-version").data.version)
  end)

  it("re-reads a token file rotated mid-run when the old token gets 401, and finishes", function()
    dir = writes_dir(400)
    local p = cli.start({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir }, env)
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(30, function() return patches_of(srv, "tenant-root", "runner-test") >= 50 end),
      p:stderr())
    -- the kubelet writes the new token, then the old one stops working
    write(sa .. "/token.new", "token-two\n")
    assert(os.rename(sa .. "/token.new", sa .. "/token"))
    srv:control("POST", "/_fake/token", { token = "token-two" })
    local r = p:wait(60)
    assert.equal(0, r.code, r.stderr)
    assert.equal("2", srv:object("ConfigMap", "tenant-root", "cozystack-version").data.version)
    assert.equal("400", srv:object("ConfigMap", "tenant-root", "runner-test").data.i)
    local refused, after = 0, 0
    for _, req in ipairs(srv:requests()) do
      if req.status == 401 then refused = refused + 1 elseif refused > 0 and req.status < 300 then after = after + 1 end
    end
    assert.is_true(refused >= 1, "the old token was never refused")
    assert.is_true(after > 0, "nothing succeeded after the rotation")
    assert.not_matches("token%-one", r.stderr)
    assert.not_matches("token%-two", r.stderr)
  end)

  it("on SIGTERM mid-run stops at once, sends no further write and exits within the hook's grace period", function()
    local values = cli.slurp("deploy/helm/values.yaml")
    local grace = assert(tonumber(values:match("terminationGracePeriodSeconds:%s*(%d+)")))
    dir = writes_dir(100000)
    local p = cli.start({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir }, env)
    finally(function() p:cleanup() end)
    assert.truthy(cli.poll(30, function() return patches_of(srv, "tenant-root", "runner-test") >= 20 end),
      p:stderr())
    -- frozen while counting, so the count is the writes sent before the
    -- signal (one may still be on its way to the server's log)
    p:kill("STOP")
    local before = patches_of(srv, "tenant-root", "runner-test")
    p:kill("TERM")
    p:kill("CONT")
    local r = p:wait(grace)
    assert.equal(1, r.code, r.stderr)
    assert.matches("1-writes stopped by signal 15", r.stderr, 1, true)
    -- at most the write in flight when the signal came
    assert.is_true(patches_of(srv, "tenant-root", "runner-test") <= before + 1)
    assert.equal("1", srv:object("ConfigMap", "tenant-root", "cozystack-version").data.version)
    local lease = srv:object("Lease", "tenant-root", "cozystack-migrations")
    assert.is_true(lease.spec.holderIdentity == nil or lease.spec.holderIdentity == "", "lock not released")
  end)

  describe("through a proxy", function()
    local proxy
    setup(function()
      local pdir = cli.tmpdir()
      proxy = { dir = pdir, log = pdir .. "/connects" }
      os.execute(("sh -c %s >/dev/null 2>&1 </dev/null &"):format(q(
        ("spec/support/connect-proxy --ready-file %s --log %s & echo $! >%s; wait"):format(
          q(pdir .. "/ready"), q(proxy.log), q(pdir .. "/pid")))))
      proxy.port = cli.poll(10, function() return cli.slurp(pdir .. "/ready") end)
      assert(proxy.port, "connect-proxy did not start")
      proxy.pid = tonumber(cli.slurp(pdir .. "/pid"):match("%d+"))
    end)
    teardown(function()
      if proxy.pid then os.execute("kill " .. proxy.pid) end
      os.execute("rm -rf " .. q(proxy.dir))
    end)

    local function connects()
      local out = {}
      for line in (cli.slurp(proxy.log) or ""):gmatch("[^\n]+") do out[#out + 1] = json.decode(line).target end
      return out
    end

    -- the in-cluster name (the fake's certificate has it), reached only through the proxy
    local function by_name(extra)
      return merged(env, merged({ KUBERNETES_SERVICE_HOST = "kubernetes.default.svc" }, extra))
    end

    it("runs through HTTPS_PROXY with a CONNECT to the service's host and port", function()
      write(proxy.log, "")
      dir = writes_dir(2)
      local r = cli.run({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir },
        by_name({ HTTPS_PROXY = "http://127.0.0.1:" .. proxy.port }))
      assert.equal(0, r.code, r.stderr)
      assert.equal("2", srv:object("ConfigMap", "tenant-root", "cozystack-version").data.version)
      local c = connects()
      assert.is_true(#c >= 1)
      for _, target in ipairs(c) do assert.equal("kubernetes.default.svc:" .. port_of(srv.url), target) end
    end)

    it("reads https_proxy too, and a proxy without a scheme as http://", function()
      write(proxy.log, "")
      dir = writes_dir(1)
      local r = cli.run({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir },
        by_name({ https_proxy = "127.0.0.1:" .. proxy.port }))
      assert.equal(0, r.code, r.stderr)
      assert.is_true(#connects() >= 1)
    end)

    -- an excluded host is dialled directly, which for this name cannot
    -- resolve: check's quick probe reports it unreachable
    for _, no_proxy in ipairs({ "kubernetes.default.svc", "example.com, .svc", "*.default.svc", "default.svc",
        "kubernetes.default.svc:" .. "PORT", "*" }) do
      it("goes direct for a host NO_PROXY matches (" .. no_proxy .. ")", function()
        write(proxy.log, "")
        local r = cli.run({ "check", "--no-builtin", "--migrations", "spec/fixtures/runner/two", "--output", "json" },
          by_name({ HTTPS_PROXY = "http://127.0.0.1:" .. proxy.port, NO_PROXY = no_proxy:gsub("PORT", port_of(srv.url)) }))
        assert.equal(1, r.code, r.stderr)
        assert.is_false(json.decode(r.stdout).reachable)
        assert.same({}, connects())
      end)
    end

    for _, no_proxy in ipairs({ "example.com", "svc.other", "kubernetes.default.svc:1", "10.0.0.0/8" }) do
      it("still uses the proxy when NO_PROXY does not match (" .. no_proxy .. ")", function()
        write(proxy.log, "")
        local r = cli.run({ "check", "--no-builtin", "--migrations", "spec/fixtures/runner/two", "--output", "json" },
          by_name({ HTTPS_PROXY = "http://127.0.0.1:" .. proxy.port, NO_PROXY = no_proxy }))
        assert.is_true(json.decode(r.stdout).reachable, r.stderr)
        assert.is_true(#connects() >= 1)
      end)
    end

    it("never proxies a loopback server, and HTTP_PROXY does not apply to https", function()
      write(proxy.log, "")
      dir = writes_dir(1)
      local r = cli.run({ "run", "--qps", "1000", "--burst", "1000", "--no-builtin", "--migrations", dir },
        merged(env, { HTTPS_PROXY = "http://127.0.0.1:" .. proxy.port }))
      assert.equal(0, r.code, r.stderr)
      assert.same({}, connects())
      r = cli.run({ "check", "--no-builtin", "--migrations", "spec/fixtures/runner/two", "--output", "json" },
        by_name({ HTTP_PROXY = "http://127.0.0.1:" .. proxy.port }))
      assert.is_false(json.decode(r.stdout).reachable)
      assert.same({}, connects())
    end)
  end)
end)
