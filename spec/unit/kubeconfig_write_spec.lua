-- The kubeconfig a legacy script gets (core/kubeconfig_write.c through
-- transport.write_kubeconfig): what it holds of each kind of user, read back
-- by kubectl itself (`kubectl config view --raw`), its file and directory
-- modes, and its refusals. No server is contacted.
local transport = require "cozy.transport"
local json = require "cozy.json"
local files = require("spec.helpers").files

local CA = "-----BEGIN CERTIFICATE-----\nMIIBdummyCA\n-----END CERTIFICATE-----\n"
local CERT = "-----BEGIN CERTIFICATE-----\nMIIBdummyCert\n-----END CERTIFICATE-----\n"
local KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcdummyKeySECRET\n-----END EC PRIVATE KEY-----\n"

local function base64_decode(s)
  local dir = files.tmpdir("cozy-kcw-b64")
  files.write(dir .. "/in", s)
  local out = files.capture("base64 -d " .. files.quote(dir .. "/in"))
  files.rm_rf(dir)
  return out
end

-- kubectl's own reading of the file, secrets included
local function view(path)
  local out = files.capture("kubectl config view --raw -o json --kubeconfig " .. files.quote(path))
  return json.decode(out)
end

local function mode(path)
  return (files.capture("stat -c %a " .. files.quote(path)):gsub("%s+$", ""))
end

describe("transport.write_kubeconfig", function()
  local dir, written
  before_each(function()
    dir = files.tmpdir("cozy-kcw")
    files.write(dir .. "/ca.pem", CA)
    files.write(dir .. "/cli.pem", CERT)
    files.write(dir .. "/cli.key", KEY)
    files.write(dir .. "/token", "file-token-SECRET\n")
    written = {}
  end)
  after_each(function()
    for _, w in ipairs(written) do files.rm_rf(w) end
    files.rm_rf(dir)
  end)

  local function config(user, extra)
    files.write(dir .. "/config", table.concat({
      "apiVersion: v1", "kind: Config", "current-context: b",
      "clusters:",
      "- {name: ka, cluster: {server: 'https://a.example:6443', certificate-authority: ca.pem,"
        .. " tls-server-name: api.a, proxy-url: 'http://proxy.example:3128'}}",
      "- {name: kb, cluster: {server: 'https://b.example:6443', insecure-skip-tls-verify: true}}",
      "users:",
      "- {name: ua, user: " .. user .. "}",
      "- {name: ub, user: {token: b-token-SECRET}}",
      "contexts:",
      "- {name: 'a \"quoted\"', context: {cluster: ka, user: ua, namespace: ns-a}}",
      "- {name: b, context: {cluster: kb, user: ub}}",
      extra or "", "",
    }, "\n"))
    return dir .. "/config"
  end

  local function write(user, namespace)
    local path, tmp, source = transport.write_kubeconfig { kubeconfig = config(user), context = 'a "quoted"',
      namespace = namespace or "engine-ns" }
    assert(path, tostring(type(tmp) == "table" and tmp.message or tmp))
    written[#written + 1] = tmp
    return path, tmp, source
  end

  it("one cluster, user and context, current, with the engine's namespace, in a private file", function()
    local path, tmp, source = write("{client-certificate: cli.pem, client-key: cli.key}")
    assert.equal(dir .. "/config", source)
    assert.equal(tmp .. "/config", path)
    assert.same({ "600", "700" }, { mode(path), mode(tmp) })
    local v = view(path)
    assert.equal('a "quoted"', v["current-context"])
    assert.same({ 1, 1, 1 }, { #v.clusters, #v.users, #v.contexts })
    assert.same({ cluster = 'a "quoted"', user = 'a "quoted"', namespace = "engine-ns" }, v.contexts[1].context)
    local c = v.clusters[1].cluster
    assert.same({ "https://a.example:6443", "api.a", "http://proxy.example:3128", CA },
      { c.server, c["tls-server-name"], c["proxy-url"], base64_decode(c["certificate-authority-data"]) })
    local u = v.users[1].user
    assert.same({ CERT, KEY }, { base64_decode(u["client-certificate-data"]), base64_decode(u["client-key-data"]) })
    -- nothing of the other context
    assert.not_matches("b.example", files.read(path), 1, true)
    assert.not_matches("b-token-SECRET", files.read(path), 1, true)
  end)

  it("a token inline, a token file by absolute path", function()
    local path = write("{token: 'a-token-SECRET'}")
    assert.equal("a-token-SECRET", view(path).users[1].user.token)
    path = write("{tokenFile: token}")
    local u = view(path).users[1].user
    assert.same({ dir .. "/token" }, { u.tokenFile })
    assert.is_nil(u.token)
  end)

  it("an exec plugin as the engine resolved it: command, args, env, modes", function()
    local path = write("{exec: {apiVersion: client.authentication.k8s.io/v1, command: ./bin/plugin, "
      .. "args: [get-token, '--cluster=a b'], env: [{name: A, value: 'x=y'}, {name: B, value: ''}], "
      .. "interactiveMode: Never, provideClusterInfo: true, installHint: 'install \"it\"'}}")
    local e = view(path).users[1].user.exec
    assert.same({ "client.authentication.k8s.io/v1", dir .. "/./bin/plugin", { "get-token", "--cluster=a b" },
      { { name = "A", value = "x=y" }, { name = "B", value = "" } }, "Never", true, 'install "it"' },
      { e.apiVersion, e.command, e.args, e.env, e.interactiveMode, e.provideClusterInfo, e.installHint })
  end)

  it("refuses what the engine would refuse, and leaves no directory behind", function()
    local path, err = transport.write_kubeconfig { kubeconfig = config("{client-certificate: cli.pem}"),
      context = 'a "quoted"', namespace = "x" }
    assert.is_nil(path)
    assert.matches("client-key is missing", err.message, 1, true)
    path, err = transport.write_kubeconfig { kubeconfig = config("{}"), context = "nope", namespace = "x" }
    assert.is_nil(path)
    assert.matches('context "nope" not found', err.message, 1, true)
    -- nothing left behind: the same refusals in a process of its own whose
    -- TMPDIR is private (the shared /tmp changes under the specs that run
    -- beside this one, which made a count of it there flaky)
    local tmp = files.tmpdir("cozy-kcw-tmp")
    local refusals = ("local t = require 'cozy.transport'\n"
      .. "assert(t.write_kubeconfig { kubeconfig = %q, context = 'a \"quoted\"', namespace = 'x' } == nil)\n"
      .. "assert(t.write_kubeconfig { kubeconfig = %q, context = 'nope', namespace = 'x' } == nil)\n"
      .. "print('refused')"):format(config("{client-certificate: cli.pem}"), dir .. "/config")
    files.write(dir .. "/refusals.lua", refusals)
    local out = files.capture("TMPDIR=" .. files.quote(tmp) .. " " .. files.quote(os.getenv("COZY_MIGRATE_BIN"))
      .. " lua " .. files.quote(dir .. "/refusals.lua") .. " 2>&1")
    local left = files.capture("ls -A " .. files.quote(tmp))
    files.rm_rf(tmp)
    assert.equal("refused\n", out)
    assert.equal("", left)
    assert.has_error(function() transport.write_kubeconfig { kubeconfig = config("{}"), context = "b" } end,
      "bad argument #1 to 'write_kubeconfig' (namespace is required)")
  end)
end)
