-- One cluster for everything (issue 25 item 3): a legacy script's kubectl
-- acts on exactly the cluster, user and namespace the engine locked, however
-- the kubeconfig, $KUBECONFIG or the in-cluster variables would choose.
-- Two API servers: A, the one `--context a` names, and B, the kubeconfig's
-- current context and everything the environment points at.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local TOKEN_A, TOKEN_B = "token-a-7f3c9e", "token-b-51d2aa"

-- a version ConfigMap at 1 in namespace ns, and the namespace
local function cluster(ns)
  return {
    { apiVersion = "v1", kind = "Namespace", metadata = { name = ns } },
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cozystack-version", namespace = ns },
      data = { version = "1" } },
  }
end

-- a script written as the platform writes them: no -n, no --context; it
-- prints what its kubectl sees, then stamps through the current context
local SCRIPT = [[#!/bin/sh
set -euo pipefail
echo "svc=${KUBERNETES_SERVICE_HOST:-unset}"
echo "mode=$(stat -c %a "$KUBECONFIG") dir=$(stat -c %a "$(dirname "$KUBECONFIG")") path=$KUBECONFIG"
echo "contexts=$(kubectl config view -o jsonpath='{.contexts[*].name}') current=$(kubectl config current-context)"
echo "minify=$(kubectl config view --minify -o jsonpath='{.contexts[0].context.namespace} {.clusters[0].cluster.server}')"
echo "view=$(kubectl config view --minify -o jsonpath='{.users[0].user}')"
echo "read=$(kubectl get configmap cozystack-version -o jsonpath='{.metadata.namespace} {.data.version}')"
kubectl patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}' >/dev/null
]]

describe("legacy scripts act on the engine's cluster", function()
  local a, b, dir
  setup(function()
    a = fake.start{ fixtures = { cluster("ns-a") }, tls = true, token = TOKEN_A }
    b = fake.start{ fixtures = { cluster("ns-b"), cluster("cozy-system") }, tls = true, token = TOKEN_B }
    dir = cli.tmpdir()
    assert.equal(0, files.sh("mkdir " .. files.quote(dir .. "/migrations")))
    files.write(dir .. "/migrations/1-platform-style", SCRIPT)
    -- both clusters in one kubeconfig, B current
    files.write(dir .. "/both", table.concat({
      "apiVersion: v1", "kind: Config", "current-context: b",
      "clusters:",
      "- {name: a, cluster: {server: '" .. a.url .. "', certificate-authority: '" .. a.ca .. "'}}",
      "- {name: b, cluster: {server: '" .. b.url .. "', certificate-authority: '" .. b.ca .. "'}}",
      "users:",
      "- {name: a, user: {token: " .. TOKEN_A .. "}}",
      "- {name: b, user: {token: " .. TOKEN_B .. "}}",
      "contexts:",
      "- {name: a, context: {cluster: a, user: a, namespace: ns-a}}",
      "- {name: b, context: {cluster: b, user: b, namespace: ns-b}}", "",
    }, "\n"))
  end)
  teardown(function()
    a:stop()
    b:stop()
    files.rm_rf(dir)
  end)

  local function line(stderr, key)
    return stderr:match("INFO  " .. key .. "=([^\n]-) migration=")
  end

  it("under --context A, with B current and $KUBECONFIG and the in-cluster variables naming B, acts on A only", function()
    a:reset(cluster("ns-a"))
    b:reset({ cluster("ns-b"), cluster("cozy-system") })
    b:clear_requests()
    local host, port = b.url:match("^https://([^:]+):(%d+)$")
    local r = cli.run({ "run", "--kubeconfig", dir .. "/both", "--context", "a", "--no-builtin",
      "--migrations", dir .. "/migrations", "--target", "2" },
      { KUBECONFIG = b.kubeconfig, KUBERNETES_SERVICE_HOST = host, KUBERNETES_SERVICE_PORT = port })
    assert.equal(0, r.code, r.stderr)
    -- what the script's kubectl saw: one context, A's, with the engine's namespace
    assert.equal("a a", (line(r.stderr, "contexts"):gsub(" current=", " ")))
    assert.equal("ns-a " .. a.url, line(r.stderr, "minify"))
    assert.equal("ns-a 1", line(r.stderr, "read"))
    assert.equal("unset", line(r.stderr, "svc"))
    -- a private file in a private directory, gone once the script has ended
    local mode, dmode, path = r.stderr:match("mode=(%d+) dir=(%d+) path=(%S+)")
    assert.same({ "600", "700" }, { mode, dmode })
    assert.equal(1, files.sh("test -e " .. files.quote(path)))
    assert.equal(1, files.sh("test -e " .. files.quote(path:match("^(.*)/[^/]+$"))))
    -- A stamped, B untouched and never asked
    assert.equal("2", a:object("ConfigMap", "ns-a", "cozystack-version").data.version)
    assert.equal("1", b:object("ConfigMap", "ns-b", "cozystack-version").data.version)
    assert.equal("1", b:object("ConfigMap", "cozy-system", "cozystack-version").data.version)
    assert.same({}, b:requests())
    -- the token reached the script's kubectl (it read and wrote), and never the log
    assert.not_matches(TOKEN_A, r.stderr, 1, true)
    assert.not_matches(TOKEN_B, r.stderr, 1, true)
  end)

  -- the kubeconfig `name` in dir: A's cluster, current context a, whose user is `user` (YAML flow)
  local function single(name, user)
    files.write(dir .. "/" .. name, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: a",
      "clusters: [{name: a, cluster: {server: '" .. a.url .. "', certificate-authority: '" .. a.ca .. "'}}]",
      "users: [{name: a, user: " .. user .. "}]",
      "contexts: [{name: a, context: {cluster: a, user: a, namespace: ns-a}}]", "",
    }, "\n"))
    return dir .. "/" .. name
  end

  it("the user's exec plugin and token file, at paths relative to the kubeconfig, work from the script's directory", function()
    assert.equal(0, files.sh(("cp spec/fixtures/exec/plugin.sh %s/plugin.sh && printf '%%s\\n' %s >%s/token-a")
      :format(files.quote(dir), TOKEN_A, files.quote(dir))))
    local runs = dir .. "/runs"
    local exec = single("exec", ("{exec: {apiVersion: client.authentication.k8s.io/v1, command: ./plugin.sh, "
      .. "interactiveMode: Never, env: [{name: TOKEN_FILE, value: '%s/token-a'}, {name: RUNS, value: '%s'}]}}")
      :format(dir, runs))
    a:reset(cluster("ns-a"))
    local r = cli.run({ "run", "--kubeconfig", exec, "--no-builtin", "--migrations", dir .. "/migrations",
      "--target", "2" })
    assert.equal(0, r.code, r.stderr)
    assert.equal("ns-a 1", line(r.stderr, "read"))
    assert.equal("2", a:object("ConfigMap", "ns-a", "cozystack-version").data.version)
    -- the engine ran the plugin, and so did each of the script's kubectl commands
    local n = select(2, (files.read(runs) or ""):gsub("run\n", ""))
    assert.truthy(n >= 2, ("the plugin ran %d time(s)"):format(n))

    local token_file = single("token-file", "{tokenFile: token-a}")
    a:reset(cluster("ns-a"))
    r = cli.run({ "run", "--kubeconfig", token_file, "--no-builtin", "--migrations", dir .. "/migrations",
      "--target", "2" })
    assert.equal(0, r.code, r.stderr)
    assert.equal("ns-a 1", line(r.stderr, "read"))
    assert.equal("2", a:object("ConfigMap", "ns-a", "cozystack-version").data.version)
    assert.not_matches(TOKEN_A, r.stderr, 1, true)
  end)

  it("in a pod: the service account's cluster, token file and namespace; the in-cluster variables stay", function()
    local sa = dir .. "/sa"
    assert.equal(0, files.sh("mkdir -p " .. files.quote(sa)))
    files.write(sa .. "/token", TOKEN_A .. "\n")
    files.write(sa .. "/ca.crt", files.read(a.ca))
    files.write(sa .. "/namespace", "ns-a")
    a:reset(cluster("ns-a"))
    local r = cli.run({ "run", "--no-builtin", "--migrations", dir .. "/migrations", "--target", "2" },
      { KUBERNETES_SERVICE_HOST = "127.0.0.1", KUBERNETES_SERVICE_PORT = a.url:match(":(%d+)$"),
        COZY_MIGRATE_SERVICEACCOUNT_DIR = sa, KUBECONFIG = false, HOME = sa, HTTPS_PROXY = false,
        https_proxy = false })
    assert.equal(0, r.code, r.stderr)
    assert.equal("in-cluster in-cluster", (line(r.stderr, "contexts"):gsub(" current=", " ")))
    assert.equal("ns-a 1", line(r.stderr, "read"))
    assert.equal("127.0.0.1", line(r.stderr, "svc"))
    assert.equal("2", a:object("ConfigMap", "ns-a", "cozystack-version").data.version)
    assert.not_matches(TOKEN_A, r.stderr, 1, true)
  end)

  it("a script that fails or is stopped at its time limit leaves no kubeconfig behind", function()
    local failing = cli.tmpdir()
    finally(function() files.rm_rf(failing) end)
    files.write(failing .. "/1-fails", '#!/bin/sh\necho "path=$KUBECONFIG"\nexit 3\n')
    files.write(failing .. "/2-hangs", '#!/bin/sh\necho "path=$KUBECONFIG"\nexec sleep 600\n')
    for _, case in ipairs { { 1, "exited with status 3" }, { 2, "ran past its time limit of 1s" } } do
      a:reset(cluster("ns-a"))
      if case[1] == 2 then
        assert.truthy(a:kubectl("-n", "ns-a", "patch", "configmap", "cozystack-version", "--type", "merge",
          "-p", '{"data":{"version":"2"}}').ok)
      end
      local r = cli.run({ "run", "--kubeconfig", dir .. "/both", "--context", "a", "--no-builtin",
        "--migrations", failing, "--target", tostring(case[1] + 1), "--step-timeout", "1s" })
      assert.equal(1, r.code, r.stderr)
      assert.matches(case[2], r.stderr, 1, true)
      local path = assert(r.stderr:match("path=(%S+)"), r.stderr)
      assert.equal(1, files.sh("test -e " .. files.quote(path:match("^(.*)/[^/]+$"))))
    end
  end)

  it("-n overrides the context's namespace for the script as for the engine", function()
    a:reset({ cluster("ns-a"), cluster("ns-other") })
    local r = cli.run({ "run", "--kubeconfig", dir .. "/both", "--context", "a", "-n", "ns-other",
      "--no-builtin", "--migrations", dir .. "/migrations", "--target", "2" })
    assert.equal(0, r.code, r.stderr)
    assert.equal("ns-other 1", line(r.stderr, "read"))
    assert.equal("2", a:object("ConfigMap", "ns-other", "cozystack-version").data.version)
    assert.equal("1", a:object("ConfigMap", "ns-a", "cozystack-version").data.version)
  end)
end)
