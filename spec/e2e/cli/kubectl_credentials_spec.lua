-- Credentials and kubeconfig as client-go reads them (issue 26, item 2),
-- beside the real kubectl on the same kubeconfig: the exec plugin gets the
-- same KUBERNETES_EXEC_INFO from both, both take the context's namespace,
-- and tls-server-name and proxy-url decide the same way for both.
local cli = require("spec.helpers").cli
local transport_harness = require("spec.helpers").transport
local fake = require("spec.helpers").server
local json = require "cozy.json"

local PLUGIN = os.getenv("PWD") .. "/spec/fixtures/exec/plugin.sh"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function shell(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)\n$"))
  return rc, out:gsub("rc=%d+\n$", "")
end

-- kubectl, without the host's proxy or cluster settings
local function kubectl(path, args)
  return shell(("env -u KUBERNETES_SERVICE_HOST -u HTTPS_PROXY -u https_proxy -u NO_PROXY -u no_proxy %s "
    .. "--kubeconfig=%s %s </dev/null"):format(q(fake.kubectl_path), q(path), args))
end

local function ours(path, lua)
  return shell(("env -u KUBERNETES_SERVICE_HOST -u HTTPS_PROXY -u https_proxy -u NO_PROXY -u no_proxy %s lua -e %s"
    .. " </dev/null"):format(q(os.getenv("COZY_MIGRATE_BIN")), q(lua:format(path))))
end

describe("credentials beside kubectl", function()
  local srv, dir, seq = nil, nil, 0
  setup(function()
    srv = transport_harness.start()
    dir = transport_harness.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  -- ca: the certificate-authority file (default the server's), false for none
  local function kubeconfig(server, cluster_extra, user, ns, ca)
    seq = seq + 1
    local path = ("%s/kubeconfig-%d"):format(dir, seq)
    transport_harness.write_file(path, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts: [{name: c, context: {cluster: k, user: u" .. (ns and (", namespace: " .. ns) or "") .. "}}]",
      "clusters:", "- name: k", "  cluster:", "    server: " .. server,
      ca ~= false and ("    certificate-authority: " .. (ca or srv.ca)) or "",
      cluster_extra or "",
      "users:", "- name: u", "  user:", user or ("    token: " .. transport_harness.TOKEN), "" }, "\n"))
    return path
  end

  it("an exec plugin gets the same KUBERNETES_EXEC_INFO from both, and both are served with its token", function()
    local tf = dir .. "/token"
    transport_harness.write_file(tf, transport_harness.TOKEN .. "\n")
    local function exec_user(info_out)
      return table.concat({ "    exec:", "      command: " .. PLUGIN,
        "      apiVersion: client.authentication.k8s.io/v1", "      interactiveMode: IfAvailable",
        "      provideClusterInfo: true", "      env:", "      - {name: TOKEN_FILE, value: " .. tf .. "}",
        "      - {name: INFO_OUT, value: " .. info_out .. "}" }, "\n")
    end
    local kpath = kubeconfig(srv.url, nil, exec_user(dir .. "/info-kubectl"))
    local opath = kubeconfig(srv.url, nil, exec_user(dir .. "/info-ours"))
    local rc, out = kubectl(kpath, "get configmap settings -n cozy-system -o jsonpath='{.data.mode}'")
    assert.equal(0, rc, out)
    assert.matches("prod$", out)
    rc, out = ours(opath, [[print(require("cozy.kube").connect{ kubeconfig = %q }
      :resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)]])
    assert.equal(0, rc, out)
    assert.matches("prod\n$", out)
    local theirs = json.decode(transport_harness.read_file(dir .. "/info-kubectl"))
    local mine = json.decode(transport_harness.read_file(dir .. "/info-ours"))
    -- client-go also sends the cluster's `config` (extensions) as null: nothing to compare
    if theirs.spec.cluster then theirs.spec.cluster.config = nil end
    assert.same(theirs, mine)
  end)

  it("an existing ~/.kube/config comes before the in-cluster configuration for both", function()
    local home = dir .. "/home"
    os.execute("mkdir -p " .. q(home .. "/.kube"))
    transport_harness.write_file(home .. "/.kube/config", transport_harness.read_file(kubeconfig(srv.url)))
    -- in-cluster would be a dead address: only ~/.kube/config reaches the server
    local env = ("env -u KUBECONFIG HOME=%s KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=1 "):format(q(home))
    srv:clear_requests()
    local rc, out = shell(env .. q(fake.kubectl_path) .. " get --raw /api/v1/namespaces/cozy-system/configmaps/settings")
    assert.equal(0, rc, out)
    rc, out = shell(env .. q(os.getenv("COZY_MIGRATE_BIN")) .. " lua -e " .. q([[print(require("cozy.kube").connect{}
      :resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)]]))
    assert.equal(0, rc, out)
    assert.matches("prod\n$", out)
    local settings = 0
    for _, e in ipairs(srv:requests()) do
      if e.path == "/api/v1/namespaces/cozy-system/configmaps/settings" and e.status == 200 then settings = settings + 1 end
    end
    assert.equal(2, settings)
  end)

  it("both take the context's namespace as the default", function()
    local path = kubeconfig(srv.url, nil, nil, "team-x")
    local rc, out = kubectl(path, "config view --minify -o jsonpath='{..namespace}'")
    assert.equal(0, rc, out)
    assert.equal("team-x", out)
    rc, out = ours(path, [[io.write(require("cozy.runner").namespace{ kubeconfig = %q })]])
    assert.equal(0, rc, out)
    assert.equal("team-x", out)
  end)

  it("tls-server-name: both refuse the address the certificate lacks, both accept the name it has", function()
    local other = fake.start { fixtures = { transport_harness.FIXTURE }, tls = true, token = transport_harness.TOKEN,
      listen = "127.0.0.2:0" }
    local ok, err = pcall(function()
      local bare = kubeconfig(other.url, nil, nil, nil, other.ca)
      local named = kubeconfig(other.url, "    tls-server-name: kubernetes.default.svc", nil, nil, other.ca)
      local get = "get --raw /api/v1/namespaces/cozy-system/configmaps/settings"
      local lua = [[local c = require("cozy.kube").connect{ kubeconfig = %q, retry = { max_attempts = 1 } }
        local ok, e = pcall(function() return c:resource("v1", "configmaps"):get("cozy-system", "settings") end)
        print(ok and e.data.mode or e.reason)]]
      local krc, kout = kubectl(bare, get)
      assert.are_not.equal(0, krc)
      assert.matches("x509", kout)
      local _, oout = ours(bare, lua)
      assert.matches("TLSVerification", oout)
      krc, kout = kubectl(named, get)
      assert.equal(0, krc, kout)
      assert.matches('"mode":"prod"', kout)
      _, oout = ours(named, lua)
      assert.matches("prod\n$", oout)
    end)
    other:stop()
    assert(ok, err)
  end)

  -- An https proxy-url: TLS to the proxy itself, then CONNECT inside it. Go's
  -- http.Transport shakes hands with the proxy using the cluster's own TLS
  -- config (net/http persistConn.addTLS with TLSClientConfig), so the proxy's
  -- certificate must chain to the cluster's certificate-authority.
  describe("an https proxy-url", function()
    local pdir, proxy, mtls
    setup(function()
      pdir = transport_harness.tmpdir()
      local function openssl(args)
        assert(os.execute(("cd %s && openssl %s >/dev/null 2>&1"):format(q(pdir), args)), "openssl " .. args)
      end
      local ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
      openssl("req -x509 " .. ec .. " -keyout proxy-ca.key -out proxy-ca.crt -days 3 -subj /CN=proxy-ca"
        .. " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign")
      openssl("req " .. ec .. " -keyout proxy.key -out proxy.csr -subj /CN=127.0.0.1")
      transport_harness.write_file(pdir .. "/ext.cnf", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
      openssl("x509 -req -in proxy.csr -CA proxy-ca.crt -CAkey proxy-ca.key -CAcreateserial -out proxy.crt"
        .. " -days 3 -extfile ext.cnf")
      -- a client certificate for the proxy that asks for one
      openssl("req " .. ec .. " -keyout client.key -out client.csr -subj /CN=migrator")
      transport_harness.write_file(pdir .. "/client.cnf", "extendedKeyUsage=clientAuth\n")
      openssl("x509 -req -in client.csr -CA proxy-ca.crt -CAkey proxy-ca.key -CAcreateserial -out client.crt"
        .. " -days 3 -extfile client.cnf")
      -- the cluster's CA and the proxy's CA in one certificate-authority file
      transport_harness.write_file(pdir .. "/both-ca.crt", transport_harness.read_file(srv.ca) .. transport_harness.read_file(pdir .. "/proxy-ca.crt"))
      local function start_proxy(name, flags)
        local p = { log = pdir .. "/" .. name .. ".log" }
        os.execute(("sh -c %s >/dev/null 2>&1 </dev/null &"):format(q(
          ("spec/support/connect-proxy --ready-file %s --log %s --tls %s %s %s & echo $! >%s; wait"):format(
            q(pdir .. "/" .. name .. ".ready"), q(p.log), q(pdir .. "/proxy.crt"), q(pdir .. "/proxy.key"), flags,
            q(pdir .. "/" .. name .. ".pid")))))
        p.port = fake.poll(10, function() return transport_harness.read_file(pdir .. "/" .. name .. ".ready") end, 0.02)
        assert(p.port, "connect-proxy did not start")
        p.pid = tonumber(transport_harness.read_file(pdir .. "/" .. name .. ".pid"):match("%d+"))
        return p
      end
      proxy = start_proxy("plain", "")
      mtls = start_proxy("mtls", "--tls-client-ca " .. q(pdir .. "/proxy-ca.crt"))
    end)
    teardown(function()
      for _, p in ipairs { proxy or {}, mtls or {} } do
        if p.pid then os.execute("kill " .. p.pid) end
      end
      if pdir then os.execute("rm -rf " .. q(pdir)) end
    end)

    -- the proxy's log since it was last emptied: tunnel targets, refused handshakes
    local function proxy_log(p)
      p = p or proxy
      local targets, tls_errors = {}, 0
      for line in (transport_harness.read_file(p.log) or ""):gmatch("[^\n]+") do
        local e = json.decode(line)
        if e.target then targets[#targets + 1] = e.target else tls_errors = tls_errors + 1 end
      end
      transport_harness.write_file(p.log, "")
      return targets, tls_errors
    end

    local get = "get --raw /api/v1/namespaces/cozy-system/configmaps/settings"
    local read = [[local c = require("cozy.kube").connect{ kubeconfig = %q, retry = { max_attempts = 1 } }
      print(c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)]]

    -- the server by its in-cluster name: what the proxy's log names as the tunnel's target
    local function target() return "kubernetes.default.svc:" .. srv.url:match(":(%d+)$") end

    -- a kubeconfig for the server by that name through proxy p; the proxy's log emptied
    local function through(p, ca, user, cluster_extra)
      proxy_log(p)
      return kubeconfig("https://" .. target(), (cluster_extra or "") .. "    proxy-url: https://127.0.0.1:" .. p.port,
        user, nil, ca)
    end

    -- kubectl, then ours, read the ConfigMap through p, each in one tunnel to the server that p
    -- logged with no refused handshake; returns our output
    local function both_read(path, p)
      local krc, kout = kubectl(path, get)
      assert.equal(0, krc, kout)
      assert.matches('"mode":"prod"', kout)
      assert.same({ { target() }, 0 }, { proxy_log(p) })
      local orc, oout = ours(path, read)
      assert.equal(0, orc, oout)
      assert.same({ { target() }, 0 }, { proxy_log(p) })
      return oout
    end

    it("both reach the server by its in-cluster name through it when the cluster's CA signed the proxy's", function()
      assert.equal("prod\n", both_read(through(proxy, pdir .. "/both-ca.crt"), proxy))
    end)

    it("both refuse a proxy whose certificate the cluster's CA did not sign, before any CONNECT", function()
      -- the cluster's CA alone: the server would be trusted, the proxy is not
      local path = through(proxy)
      local krc, kout = kubectl(path, get)
      assert.are_not.equal(0, krc)
      assert.matches("proxyconnect tcp: tls: failed to verify certificate: x509", kout)
      -- the proxy logs the refused handshake when its own side of it ends, which can
      -- be after kubectl has exited (it failed once so under AddressSanitizer's load)
      local targets, refused = {}, 0
      cli.poll(10, function()
        local t, r = proxy_log()
        table.move(t, 1, #t, #targets + 1, targets)
        refused = refused + r
        return refused >= 1
      end)
      assert.same({}, targets)
      assert.is_true(refused >= 1, "kubectl's handshake with the proxy was not refused")
      -- ours: exit 1 (an API call failed), one ERROR line naming the TLS check
      local code, out, stderr = transport_harness.run("HTTPS_PROXY= NO_PROXY=", ("status --kubeconfig %s"):format(q(path)))
      assert.equal(1, code, out .. stderr)
      local lines = {}
      for l in stderr:gmatch("[^\n]+") do lines[#lines + 1] = l end
      assert.equal(1, #lines, stderr)
      assert.matches(" ERROR GET /api/v1/.*: TLSVerification: the https proxy: SSL certificate problem", lines[1])
      targets, refused = proxy_log()
      assert.same({}, targets)
      assert.is_true(refused >= 1, "our handshake with the proxy was not refused")
    end)

    it("a trusted proxy before an untrusted server: both blame the server, not the proxy", function()
      -- the proxy's CA alone: the proxy is trusted, the server is not
      local path = through(proxy, pdir .. "/proxy-ca.crt")
      local krc, kout = kubectl(path, get)
      assert.are_not.equal(0, krc)
      assert.matches("tls: failed to verify certificate: x509", kout)
      assert.not_matches("proxyconnect", kout)
      assert.same({ { target() }, 0 }, { proxy_log() })
      local code, out, stderr = transport_harness.run("HTTPS_PROXY= NO_PROXY=", ("status --kubeconfig %s"):format(q(path)))
      assert.equal(1, code, out .. stderr)
      assert.matches(" ERROR GET /api/v1/.*: TLSVerification: SSL certificate problem", stderr)
      assert.not_matches("https proxy", stderr)
      assert.same({ { target() }, 0 }, { proxy_log() })
    end)

    it("insecure-skip-tls-verify turns the proxy's check off too, for both", function()
      local oout = both_read(through(proxy, false, nil, "    insecure-skip-tls-verify: true\n"), proxy)
      assert.matches("warning: insecure%-skip%-tls%-verify is set in the kubeconfig: the certificates of the API "
        .. "server and of an https proxy are NOT verified", oout)
      assert.matches("\nprod\n$", oout)
    end)

    it("a proxy that asks for a client certificate gets the kubeconfig user's from both", function()
      local user = table.concat({ "    token: " .. transport_harness.TOKEN, "    client-certificate: " .. pdir .. "/client.crt",
        "    client-key: " .. pdir .. "/client.key" }, "\n")
      assert.equal("prod\n", both_read(through(mtls, pdir .. "/both-ca.crt", user), mtls))
    end)
  end)
end)
