-- Client-certificate authentication, against a small HTTPS server that
-- requires one (spec/fixtures/transport/mtls-server.py): the fake API server
-- authenticates by token only.
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local kube = require "cozy.kube"

local function sh(cmd)
  local ok = os.execute(cmd .. " >/dev/null 2>&1")
  assert(ok, "failed: " .. cmd)
end

local function b64file(path)
  local p = io.popen("base64 -w0 '" .. path .. "'")
  local s = p:read("a")
  p:close()
  return s
end

describe("cozy.kube client-certificate auth", function()
  local dir, url, pid
  setup(function()
    dir = transport_harness.tmpdir()
    local ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    transport_harness.write_file(dir .. "/srv.ext", "subjectAltName=IP:127.0.0.1\n")
    transport_harness.write_file(dir .. "/cli.ext", "extendedKeyUsage=clientAuth\n")
    local o = "cd '" .. dir .. "' && openssl "
    sh(o .. "req -x509 " .. ec .. " -keyout ca.key -out ca.pem -days 1 -subj /CN=mtls-ca")
    sh(o .. "req " .. ec .. " -keyout srv.key -out srv.csr -subj /CN=127.0.0.1")
    sh(o .. "x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 1 -extfile srv.ext")
    sh(o .. "req " .. ec .. " -keyout cli.key -out cli.csr -subj /CN=cozy-client")
    sh(o .. "x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem -days 1 -extfile cli.ext")
    os.execute(("/usr/bin/python3 spec/fixtures/transport/mtls-server.py '%s' '%s/ready' >'%s/server.log' 2>&1 & echo $! >'%s/pid'")
      :format(dir, dir, dir, dir))
    pid = tonumber(transport_harness.read_file(dir .. "/pid"):match("%d+"))
    url = cli.poll(10, function() return transport_harness.read_file(dir .. "/ready") end)
    assert(url, "mtls server did not start: " .. (transport_harness.read_file(dir .. "/server.log") or ""))
  end)
  teardown(function()
    if pid then os.execute("kill " .. pid) end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)

  local function kubeconfig(user)
    local path = dir .. "/kc-" .. tostring(math.random(1e9))
    transport_harness.write_file(path, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts: [{name: c, context: {cluster: k, user: u}}]",
      "clusters:", "- name: k", "  cluster:", "    server: " .. url,
      "    certificate-authority: ca.pem",
      "users:", "- name: u", "  user:", user, "" }, "\n"))
    return path
  end

  local function whoami(path, log)
    local c = kube.connect { kubeconfig = path, log = log or harness.capture_log().log,
      retry = { max_attempts = 2, base_delay = 0.01, max_delay = 0.01 } }
    local ok, res = pcall(function() return c:resource("v1", "configmaps"):get("default", "whoami") end)
    c:close()
    return ok, res
  end

  it("logs the server's Warning headers, once each", function()
    local captured = harness.capture_log(1)
    local path = kubeconfig("    client-certificate: cli.pem\n    client-key: cli.key")
    local c = kube.connect { kubeconfig = path, log = captured.log }
    local cms = c:resource("v1", "configmaps")
    cms:get("default", "whoami")
    cms:get("default", "whoami")
    c:close()
    assert.equal(1, captured.count("warn", "API server warning"))
    assert.matches("WhoAmI is deprecated", captured.text())
  end)

  it("authenticates with certificate and key files", function()
    local ok, cm = whoami(kubeconfig("    client-certificate: cli.pem\n    client-key: cli.key"))
    assert.is_true(ok, tostring(cm))
    assert.equal("cozy-client", cm.data.cn)
    assert.is_false(cm.data.auth) -- no bearer token sent
  end)

  it("authenticates with certificate and key data", function()
    local ok, cm = whoami(kubeconfig("    client-certificate-data: " .. b64file(dir .. "/cli.pem")
      .. "\n    client-key-data: " .. b64file(dir .. "/cli.key")))
    assert.is_true(ok, tostring(cm))
    assert.equal("cozy-client", cm.data.cn)
  end)

  it("authenticates with the certificate an exec plugin returns (spec/fixtures/exec/plugin.sh)", function()
    local plugin = os.getenv("PWD") .. "/spec/fixtures/exec/plugin.sh"
    local ok, cm = whoami(kubeconfig(table.concat({ "    exec:", "      command: " .. plugin,
      "      apiVersion: client.authentication.k8s.io/v1", "      interactiveMode: Never", "      env:",
      "      - {name: MODE, value: cert}", "      - {name: CERT_FILE, value: " .. dir .. "/cli.pem}",
      "      - {name: KEY_FILE, value: " .. dir .. "/cli.key}" }, "\n")))
    assert.is_true(ok, tostring(cm))
    assert.equal("cozy-client", cm.data.cn)
    assert.is_false(cm.data.auth) -- the certificate alone: no bearer token
  end)

  it("fails as a transport error without a client certificate", function()
    local ok, err = whoami(kubeconfig("    token: not-enough"))
    assert.is_false(ok)
    assert.is_true(kube.is_error(err))
    assert.equal(0, err.code)
  end)

  it("fails to load a key that does not match the certificate", function()
    local ok, err = whoami(kubeconfig("    client-certificate: cli.pem\n    client-key: srv.key"))
    assert.is_false(ok)
    assert.equal(0, err.code)
    assert.is_nil(tostring(err):find("PRIVATE KEY", 1, true))
  end)
end)
