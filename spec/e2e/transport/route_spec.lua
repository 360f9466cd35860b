-- A kubeconfig cluster's tls-server-name and proxy-url (issue 26, item 2),
-- both refused as "not supported" by the binary before. The fake API
-- server's certificate names 127.0.0.1, localhost and kubernetes.default.svc.
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local json = require "cozy.json"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

describe("cluster routing from the kubeconfig", function()
  local dir, seq = nil, 0
  setup(function() dir = transport_harness.tmpdir() end)
  teardown(function() if dir then os.execute("rm -rf " .. q(dir)) end end)

  local function kubeconfig(server, ca, cluster_extra)
    seq = seq + 1
    local path = ("%s/kubeconfig-%d"):format(dir, seq)
    transport_harness.write_file(path, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts: [{name: c, context: {cluster: k, user: u}}]",
      "clusters:", "- name: k", "  cluster:", "    server: " .. server, "    certificate-authority: " .. ca,
      cluster_extra or "",
      "users: [{name: u, user: {token: " .. transport_harness.TOKEN .. "}}]", "" }, "\n"))
    return path
  end

  local function settings(path)
    local c = transport_harness.connect({}, { kubeconfig = path, log = harness.capture_log().log,
      retry = { max_attempts = 1, max_time = 1, base_delay = 0.01, max_delay = 0.01 } })
    local cms = c:resource("v1", "configmaps")
    local ok, res = pcall(cms.get, cms, "cozy-system", "settings")
    c:close()
    return ok, res
  end

  describe("tls-server-name", function()
    local srv
    -- 127.0.0.2 is loopback too, and not in the server's certificate
    setup(function()
      srv = transport_harness.fake.start { fixtures = { transport_harness.FIXTURE }, tls = true, token = transport_harness.TOKEN,
        listen = "127.0.0.2:0" }
    end)
    teardown(function() if srv then srv:stop() end end)

    it("checks the server's certificate against it, not the address", function()
      local ok, err = settings(kubeconfig(srv.url, srv.ca))
      assert.is_false(ok)
      assert.equal("TLSVerification", err.reason)
      local cm
      ok, cm = settings(kubeconfig(srv.url, srv.ca, "    tls-server-name: kubernetes.default.svc"))
      assert.is_true(ok, tostring(cm))
      assert.equal("prod", cm.data.mode)
      -- and a name the certificate does not have fails as before
      ok, err = settings(kubeconfig(srv.url, srv.ca, "    tls-server-name: other.example"))
      assert.is_false(ok)
      assert.equal("TLSVerification", err.reason)
    end)
  end)

  describe("proxy-url", function()
    local srv, proxy
    local socks
    -- spec/support/connect-proxy: an HTTP CONNECT proxy, or with --socks5 a
    -- SOCKS5 one; both log each tunnel's target and reach 127.0.0.1
    local function start_proxy(flags)
      local pdir = transport_harness.tmpdir()
      local p = { dir = pdir, log = pdir .. "/connects" }
      os.execute(("sh -c %s >/dev/null 2>&1 </dev/null &"):format(q(
        ("spec/support/connect-proxy --ready-file %s --log %s %s & echo $! >%s; wait"):format(
          q(pdir .. "/ready"), q(p.log), flags, q(pdir .. "/pid")))))
      p.port = transport_harness.fake.poll(10, function() return transport_harness.read_file(pdir .. "/ready") end, 0.02)
      assert(p.port, "connect-proxy did not start")
      p.pid = tonumber(transport_harness.read_file(pdir .. "/pid"):match("%d+"))
      return p
    end
    setup(function()
      srv = transport_harness.start()
      proxy = start_proxy("")
      socks = start_proxy("--socks5")
    end)
    teardown(function()
      for _, p in ipairs { proxy, socks } do
        if p.pid then os.execute("kill " .. p.pid) end
        os.execute("rm -rf " .. q(p.dir))
      end
      if srv then srv:stop() end
    end)

    local function connects(p)
      local out = {}
      for line in (transport_harness.read_file((p or proxy).log) or ""):gmatch("[^\n]+") do
        out[#out + 1] = json.decode(line).target
      end
      return out
    end

    it("socks5: the proxy resolves the server's name, as client-go's SOCKS5 dialer asks it to", function()
      local port = srv.url:match(":(%d+)$")
      transport_harness.write_file(socks.log, "")
      local ok, cm = settings(kubeconfig("https://kubernetes.default.svc:" .. port, srv.ca,
        "    proxy-url: socks5://127.0.0.1:" .. socks.port))
      assert.is_true(ok, tostring(cm))
      assert.equal("prod", cm.data.mode)
      assert.same({ "kubernetes.default.svc:" .. port }, connects(socks))
    end)

    it("reaches a server only the proxy can name, with one CONNECT to its host and port", function()
      local port = srv.url:match(":(%d+)$")
      local by_name = "https://kubernetes.default.svc:" .. port
      transport_harness.write_file(proxy.log, "")
      local ok, err = settings(kubeconfig(by_name, srv.ca))
      assert.is_false(ok) -- no DNS for the in-cluster name here
      assert.equal("DNSError", err.reason)
      local cm
      ok, cm = settings(kubeconfig(by_name, srv.ca, "    proxy-url: http://127.0.0.1:" .. proxy.port))
      assert.is_true(ok, tostring(cm))
      assert.equal("prod", cm.data.mode)
      assert.same({ "kubernetes.default.svc:" .. port }, connects())
    end)

    it("wins over the environment's proxy settings, NO_PROXY included", function()
      local port = srv.url:match(":(%d+)$")
      local path = kubeconfig("https://kubernetes.default.svc:" .. port, srv.ca,
        "    proxy-url: http://127.0.0.1:" .. proxy.port)
      transport_harness.write_file(proxy.log, "")
      local code, out, stderr = transport_harness.run("HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY='*'",
        ([[lua -e 'print(require("cozy.kube").connect{ kubeconfig = "%s" }
          :resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)']]):format(path))
      assert.equal(0, code, stderr)
      assert.equal("prod\n", out)
      assert.same({ "kubernetes.default.svc:" .. port }, connects())
    end)

    it("refuses a scheme client-go does not transport_harness", function()
      local ok, err = pcall(transport_harness.connect, {}, { kubeconfig = kubeconfig(srv.url, srv.ca,
        "    proxy-url: ftp://127.0.0.1:" .. proxy.port) })
      assert.is_false(ok)
      assert.equal("clusters[k].cluster.proxy-url", err.field)
      assert.matches("must be an http://, https:// or socks5:// URL", err.message)
    end)
  end)
end)
