-- Credentials and kubeconfig as client-go reads them (issue 26, item 2),
-- beside the real kubectl on the same kubeconfig: the exec plugin gets the
-- same KUBERNETES_EXEC_INFO from both, both take the context's namespace,
-- and tls-server-name and proxy-url decide the same way for both.
local support = require "spec.helpers.transport"
local fake = require "spec.support.fake"
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
    srv = support.start()
    dir = support.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  local function kubeconfig(server, cluster_extra, user, ns, ca)
    seq = seq + 1
    local path = ("%s/kubeconfig-%d"):format(dir, seq)
    support.write_file(path, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts: [{name: c, context: {cluster: k, user: u" .. (ns and (", namespace: " .. ns) or "") .. "}}]",
      "clusters:", "- name: k", "  cluster:", "    server: " .. server, "    certificate-authority: " .. (ca or srv.ca),
      cluster_extra or "",
      "users:", "- name: u", "  user:", user or ("    token: " .. support.TOKEN), "" }, "\n"))
    return path
  end

  it("an exec plugin gets the same KUBERNETES_EXEC_INFO from both, and both are served with its token", function()
    local tf = dir .. "/token"
    support.write_file(tf, support.TOKEN .. "\n")
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
    local theirs = json.decode(support.read_file(dir .. "/info-kubectl"))
    local mine = json.decode(support.read_file(dir .. "/info-ours"))
    -- client-go also sends the cluster's `config` (extensions) as null: nothing to compare
    if theirs.spec.cluster then theirs.spec.cluster.config = nil end
    assert.same(theirs, mine)
  end)

  it("an existing ~/.kube/config comes before the in-cluster configuration for both", function()
    local home = dir .. "/home"
    os.execute("mkdir -p " .. q(home .. "/.kube"))
    support.write_file(home .. "/.kube/config", support.read_file(kubeconfig(srv.url)))
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
    local other = fake.start { fixtures = { support.FIXTURE }, tls = true, token = support.TOKEN,
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
end)
