-- Configuration loading (core/kubeconfig.c through kube.connect): kubeconfig
-- variants, contexts, KUBECONFIG lists, in-cluster, and errors that name the
-- file and the field. No server is contacted: connect does not send requests.
local kube = require "cozy.kube"
local cli = require("spec.helpers").cli
local harness = require "spec.helpers"
local files = require("spec.helpers").files

local function tmpdir()
  return files.tmpdir("cozy-kubeconfig")
end

local function write(path, data)
  files.write(path, data)
  return path
end

local function b64(s)
  local p = io.popen("printf '%s' '" .. s .. "' | base64 -w0")
  local out = p:read("a")
  p:close()
  return out
end

local CA = "-----BEGIN CERTIFICATE-----\nMIIBdummyCA\n-----END CERTIFICATE-----\n"
local CERT = "-----BEGIN CERTIFICATE-----\nMIIBdummyCert\n-----END CERTIFICATE-----\n"
local KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcdummyKeySECRET\n-----END EC PRIVATE KEY-----\n"

-- A kubeconfig with one cluster "k", one user "u" and contexts; overrides by line.
local function config(t)
  return table.concat({
    "apiVersion: v1",
    "kind: Config",
    t.current == false and "" or ("current-context: " .. (t.current or "main")),
    "contexts:",
    "- name: main",
    "  context: {cluster: k, user: u, namespace: ns-main}",
    "- name: other",
    "  context: {cluster: k2, user: u, namespace: ns-other}",
    "- name: broken",
    "  context: {cluster: missing, user: u}",
    "clusters:",
    "- name: k",
    "  cluster:",
    t.server == false and "" or ("    server: " .. (t.server or "https://127.0.0.1:6443")),
    t.cluster or ("    certificate-authority-data: " .. b64(CA)),
    "- name: k2",
    "  cluster:",
    "    server: https://[::1]:7443/prefix/",
    "users:",
    "- name: u",
    "  user:",
    t.user or "    token: abc",
    "",
  }, "\n")
end

local function connect_err(path, ctx)
  local ok, err = pcall(kube.connect, { kubeconfig = path, context = ctx })
  assert.is_false(ok, "expected a configuration error")
  assert.is_true(kube.is_error(err), tostring(err))
  assert.equal("config", err.kind)
  return err
end

local function run(env, code)
  -- the host's cluster settings must not leak into what is tested
  -- (HOME too: an existing ~/.kube/config comes before in-cluster)
  local r = cli.shell(("env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST -u KUBERNETES_SERVICE_PORT HOME=/nonexistent %s %s lua -e %s")
    :format(env, files.quote(cli.bin), files.quote(code)))
  return r.code, r.stdout, r.stderr
end

describe("kubeconfig", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() files.rm_rf(dir) end)
  local n = 0
  local function file(t)
    n = n + 1
    return write(("%s/config-%d"):format(dir, n), type(t) == "string" and t or config(t or {}))
  end

  it("loads a token, CA data, the server and the context's namespace", function()
    local c = kube.connect { kubeconfig = file() }
    assert.equal("https://127.0.0.1:6443", c.server)
    assert.equal("ns-main", c.namespace)
    assert.equal("main", c.info.context)
    assert.equal("token", c.info.auth)
    assert.equal("configured", c.info.ca)
    assert.is_false(c.info.insecure)
    c:close()
  end)

  it("selects --context over current-context, trims a trailing slash", function()
    local c = kube.connect { kubeconfig = file(), context = "other" }
    assert.equal("https://[::1]:7443/prefix", c.server)
    assert.equal("ns-other", c.namespace)
    assert.equal("system", c.info.ca)
    c:close()
  end)

  it("reads CA, client certificate and key from files relative to the kubeconfig", function()
    write(dir .. "/ca.pem", CA)
    write(dir .. "/client.crt", CERT)
    write(dir .. "/client.key", KEY)
    local c = kube.connect { kubeconfig = file {
      cluster = "    certificate-authority: ca.pem",
      user = "    client-certificate: client.crt\n    client-key: " .. dir .. "/client.key",
    } }
    assert.equal("client-certificate", c.info.auth)
    assert.equal("configured", c.info.ca)
    c:close()
  end)

  it("reads client certificate and key as data", function()
    local c = kube.connect { kubeconfig = file {
      user = "    client-certificate-data: " .. b64(CERT) .. "\n    client-key-data: " .. b64(KEY) } }
    assert.equal("client-certificate", c.info.auth)
    c:close()
  end)

  it("reads a tokenFile relative to the kubeconfig", function()
    write(dir .. "/tok", "from-file\n")
    local c = kube.connect { kubeconfig = file { user = "    tokenFile: tok" } }
    assert.equal("token-file", c.info.auth)
    assert.equal(dir .. "/tok", c.info.token_file)
    c:close()
  end)

  it("connects anonymously with an empty user", function()
    local c = kube.connect { kubeconfig = file { user = "    {}" } }
    assert.equal("none", c.info.auth)
    c:close()
  end)

  it("warns about insecure-skip-tls-verify on every connect", function()
    local captured = harness.capture_log()
    local path = file { cluster = "    insecure-skip-tls-verify: true" }
    for _ = 1, 2 do
      local c = kube.connect { kubeconfig = path, log = captured.log }
      assert.is_true(c.info.insecure)
      c:close()
    end
    assert.equal(2, captured.count("warn", "NOT verified"))
    assert.equal(2, #captured.lines)
  end)

  describe("errors name the file and the field", function()
    it("a missing file", function()
      local err = connect_err(dir .. "/nope")
      assert.equal(dir .. "/nope", err.file)
      assert.matches("nope: cannot read kubeconfig", err.message)
      assert.matches("^configuration error: ", tostring(err))
    end)

    it("malformed YAML, with the line", function()
      local err = connect_err(file("clusters: [\n  - {name: a\nusers: ]]]\n"))
      assert.matches("malformed YAML at line %d+", err.message)
      assert.matches(dir, err.file, 1, true)
    end)

    it("a YAML document that is not a mapping", function()
      local err = connect_err(file("- just\n- a list\n"))
      assert.matches("must be a YAML mapping", err.message)
    end)

    it("no current-context", function()
      assert.equal("current-context", connect_err(file { current = false }).field)
    end)

    it("an unknown --context, an unknown current-context", function()
      local err = connect_err(file(), "nope")
      assert.equal("--context", err.field)
      assert.matches('context "nope" not found', err.message)
      assert.equal("current-context", connect_err(file { current = "gone" }).field)
    end)

    it("a context naming a missing cluster", function()
      local err = connect_err(file(), "broken")
      assert.equal("clusters[missing].cluster", err.field)
    end)

    it("a missing or invalid server", function()
      assert.equal("clusters[k].cluster.server", connect_err(file { server = false }).field)
      local err = connect_err(file { server = "ftp://x" })
      assert.equal("clusters[k].cluster.server", err.field)
      assert.matches("http:// or https://", err.message)
    end)

    it("auth-provider is refused, naming the exec plugins that replace it", function()
      local err = connect_err(file { user = "    auth-provider:\n      name: gcp" })
      assert.equal("users[u].user.auth-provider", err.field)
      assert.matches("auth%-provider plugins are not supported %(client%-go removed them%); use the exec plugin " ..
        "that replaces yours: gke%-gcloud%-auth%-plugin %(gcp%), kubelogin", err.message)
    end)

    it("a token beside an exec stanza is used and the plugin never runs, as in client-go", function()
      local c = kube.connect { kubeconfig = file { user = "    token: abc\n    exec:\n      command: cozy-no-such-plugin\n"
        .. "      apiVersion: client.authentication.k8s.io/v1\n      interactiveMode: Never" },
        log = harness.capture_log().log }
      assert.equal("token", c.info.auth)
      c:close()
    end)

    it("an exec stanza without its command or apiVersion (exec plugins run in spec/e2e/transport/exec_spec.lua)", function()
      local err = connect_err(file { user = "    exec:\n      apiVersion: client.authentication.k8s.io/v1" })
      assert.equal("users[u].user.exec.command", err.field)
      assert.matches("is missing", err.message)
      err = connect_err(file { user = "    exec:\n      command: aws" })
      assert.equal("users[u].user.exec.apiVersion", err.field)
    end)

    it("invalid base64, without echoing the (secret) value", function()
      local err = connect_err(file { user = "    client-certificate-data: " .. b64(CERT) ..
        "\n    client-key-data: NOT*BASE64*SECRETVALUE" })
      assert.equal("users[u].user.client-key-data", err.field)
      assert.is_nil(tostring(err):find("SECRETVALUE", 1, true))
    end)

    it("a certificate without its key", function()
      local err = connect_err(file { user = "    client-certificate-data: " .. b64(CERT) })
      assert.equal("users[u].user.client-key", err.field)
    end)

    it("an unreadable CA file or token file", function()
      local err = connect_err(file { cluster = "    certificate-authority: /nonexistent/ca.pem" })
      assert.equal("clusters[k].cluster.certificate-authority", err.field)
      assert.matches("/nonexistent/ca.pem", err.message)
      assert.equal("users[u].user.tokenFile", connect_err(file { user = "    tokenFile: /nonexistent/t" }).field)
    end)

    it("a non-boolean insecure-skip-tls-verify", function()
      local err = connect_err(file { cluster = "    insecure-skip-tls-verify: maybe" })
      assert.equal("clusters[k].cluster.insecure-skip-tls-verify", err.field)
    end)

    it("a wrongly typed field", function()
      local err = connect_err(file { server = "[a, b]" })
      assert.equal("clusters[k].cluster.server", err.field)
      assert.matches("must be a string", err.message)
    end)
  end)

  describe("discovery order (in a child process, for the environment)", function()
    it("$KUBECONFIG: a list merged first-wins, missing files skipped", function()
      write(dir .. "/a.yaml", "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u, namespace: from-a}\n")
      write(dir .. "/b.yaml", "current-context: ignored\nclusters:\n- name: k\n  cluster: {server: 'https://b:1'}\n"
        .. "users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: x, user: y, namespace: from-b}\n")
      local code, out, err = run(("KUBECONFIG=%s/missing.yaml:%s/a.yaml:%s/b.yaml"):format(dir, dir, dir),
        'local c = require("cozy.kube").connect{}; print(c.server, c.namespace, c.info.context)')
      assert.equal(0, code, err)
      assert.equal("https://b:1\tfrom-a\tc\n", out)
    end)

    it("--kubeconfig wins over $KUBECONFIG", function()
      local path = file()
      local code, out, err = run(("KUBECONFIG=%s/missing.yaml"):format(dir),
        ('print(require("cozy.kube").connect{ kubeconfig = %q }.server)'):format(path))
      assert.equal(0, code, err)
      assert.equal("https://127.0.0.1:6443\n", out)
    end)

    it("in-cluster: bracketed IPv6 host, token file, CA and namespace", function()
      local sa = dir .. "/sa"
      os.execute("mkdir -p '" .. sa .. "'")
      write(sa .. "/token", "sa-token\n")
      write(sa .. "/ca.crt", CA)
      write(sa .. "/namespace", "cozy-system\n")
      local code, out, err = run(
        ("KUBERNETES_SERVICE_HOST=fd00::1 KUBERNETES_SERVICE_PORT=443 COZY_MIGRATE_SERVICEACCOUNT_DIR=%s"):format(sa),
        'local c = require("cozy.kube").connect{}; print(c.server, c.namespace, c.info.auth, c.info.source)')
      assert.equal(0, code, err)
      assert.equal("https://[fd00::1]:443\tcozy-system\ttoken-file\tin-cluster\n", out)
    end)

    it("an existing ~/.kube/config comes before in-cluster, as in client-go", function()
      local sa = dir .. "/sa-order"
      os.execute("mkdir -p '" .. sa .. "' '" .. dir .. "/home-order/.kube'")
      write(sa .. "/token", "sa-token\n")
      write(sa .. "/ca.crt", CA)
      write(sa .. "/namespace", "from-sa\n")
      local env = ("KUBERNETES_SERVICE_HOST=10.0.0.1 KUBERNETES_SERVICE_PORT=443 COZY_MIGRATE_SERVICEACCOUNT_DIR=%s "
        .. "HOME=%s/home-order"):format(sa, dir)
      local code = 'local c = require("cozy.kube").connect{}; print(c.info.source, c.server, c.namespace)'
      -- no ~/.kube/config: in-cluster
      local rc, out, err = run(env, code)
      assert.equal(0, rc, err)
      assert.equal("in-cluster\thttps://10.0.0.1:443\tfrom-sa\n", out)
      -- with one: it wins (the binary before this change took in-cluster)
      write(dir .. "/home-order/.kube/config", config {})
      rc, out, err = run(env, code)
      assert.equal(0, rc, err)
      assert.equal(dir .. "/home-order/.kube/config\thttps://127.0.0.1:6443\tns-main\n", out)
    end)

    it("the default --namespace: -n, $NAMESPACE, the context's namespace, cozy-system", function()
      local path = file()
      local code = ('local r = require("cozy.runner"); print(r.namespace{ kubeconfig = %q }, '
        .. 'r.namespace{ kubeconfig = %q, context = "other" }, r.namespace{ kubeconfig = %q, namespace = "flag" }, '
        .. 'r.namespace{ kubeconfig = %q, context = "broken" })'):format(path, path, path, path)
      local rc, out, err = run("", code)
      assert.equal(0, rc, err)
      -- a context without a namespace (or one that cannot be read) leaves cozy-system
      assert.equal("ns-main\tns-other\tflag\tcozy-system\n", out)
      rc, out, err = run("NAMESPACE=from-env", code)
      assert.equal(0, rc, err)
      assert.equal("from-env\tfrom-env\tflag\tfrom-env\n", out)
    end)

    it("in-cluster: a missing token names the file", function()
      local sa = dir .. "/sa-empty"
      os.execute("mkdir -p '" .. sa .. "'")
      local code, out, err = run(
        ("KUBERNETES_SERVICE_HOST=10.0.0.1 KUBERNETES_SERVICE_PORT=443 COZY_MIGRATE_SERVICEACCOUNT_DIR=%s"):format(sa),
        'local ok, e = pcall(require("cozy.kube").connect, {}); print(e.file, e.field)')
      assert.equal(0, code, err)
      assert.equal(sa .. "/token\ttoken\n", out)
    end)

    it("the CLI exits 2 on a configuration error and names the file and field", function()
      local bin = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"
      local bad = file { user = "    auth-provider: {name: gcp}" }
      for _, args in ipairs { "status --kubeconfig " .. dir .. "/missing-kc", "status --kubeconfig " .. bad } do
        local errf = os.tmpname()
        local ok, how, rc = os.execute(("%s %s >/dev/null 2>%s </dev/null"):format(bin, args, errf))
        local f = io.open(errf); local err = f:read("a"); f:close(); os.remove(errf)
        assert.equal("exit", how)
        assert.is_nil(ok)
        assert.equal(2, rc, err)
        assert.matches(args:match("%S+$"), err, 1, true)
        if args:find(bad, 1, true) then assert.matches("users[u].user.auth-provider", err, 1, true) end
      end
    end)

    it("~/.kube/config last, and an error naming it when it is missing", function()
      os.execute("mkdir -p '" .. dir .. "/home/.kube'")
      write(dir .. "/home/.kube/config", config {})
      local code, out = run(("HOME=%s/home"):format(dir), 'print(require("cozy.kube").connect{}.info.source)')
      assert.equal(0, code)
      assert.equal(dir .. "/home/.kube/config\n", out)
      local code2, out2 = run(("HOME=%s/nohome"):format(dir),
        'local ok, e = pcall(require("cozy.kube").connect, {}); print(e.file); print(e.message)')
      assert.equal(0, code2)
      assert.matches(dir .. "/nohome/.kube/config\n", out2, 1, true)
      assert.matches("no cluster configuration", out2)
    end)
  end)
end)
