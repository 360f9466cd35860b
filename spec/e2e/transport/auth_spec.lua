-- TLS and token handling: wrong CA, wrong token, 401 then a rotated token
-- file, periodic token re-read, in-cluster config, insecure warning, and the
-- token never appearing in any output.
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local kube = require "cozy.kube"
local sys = require "cozy.sys"

local SETTINGS = "/api/v1/namespaces/cozy%-system/configmaps/settings$"

local function kubeconfig(dir, srv, user, cluster_extra)
  local path = dir .. "/kubeconfig-" .. tostring(math.random(1e9))
  transport_harness.write_file(path, table.concat({
    "apiVersion: v1",
    "kind: Config",
    "current-context: c",
    "contexts:",
    "- name: c",
    "  context: {cluster: k, user: u, namespace: team-a}",
    "clusters:",
    "- name: k",
    "  cluster:",
    "    server: " .. srv.url,
    cluster_extra or ("    certificate-authority: " .. srv.ca),
    "users:",
    "- name: u",
    "  user:",
    user,
    "",
  }, "\n"))
  return path
end

describe("cozy.kube auth and TLS", function()
  local srv, other, dir, captured
  setup(function()
    srv = transport_harness.start()
    dir = transport_harness.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if other then other:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)
  before_each(function()
    srv:clear_faults()
    srv:clear_requests()
    captured = harness.capture_log(1)
  end)

  local function statuses(entries)
    local out = {}
    for i, e in ipairs(entries) do out[i] = e.status end
    return out
  end

  it("reads the CA from a file and the namespace from the context", function()
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv, "    token: " .. transport_harness.TOKEN) })
    assert.equal("team-a", c.namespace)
    assert.equal("prod", c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    c:close()
  end)

  it("refuses a server whose certificate the configured CA did not sign, without retrying", function()
    other = other or transport_harness.start()
    local path = kubeconfig(dir, srv, "    token: " .. transport_harness.TOKEN, "    certificate-authority: " .. other.ca)
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    local cms = c:resource("v1", "configmaps")
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(0, err.code)
    assert.equal("TLSVerification", err.reason)
    assert.equal(1, #err.attempts)
    assert.equal(0, #transport_harness.api_requests(srv, "GET", SETTINGS))
    c:close()
  end)

  it("raises Unauthorized for a wrong literal token after one attempt", function()
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv, "    token: wrong-token"), log = captured.log })
    local cms = c:resource("v1", "configmaps")
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(401, err.code)
    assert.equal("Unauthorized", err.reason)
    assert.same({ 401 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    c:close()
  end)

  it("after a 401, re-reads a rotated token file and retries once", function()
    local tf = dir .. "/token-rotated"
    transport_harness.write_file(tf, "old-token\n")
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv, "    tokenFile: " .. tf), log = captured.log })
    assert.equal("token-file", c.info.auth)
    transport_harness.write_file(tf, transport_harness.TOKEN .. "\n") -- rotated by the kubelet
    local cm = c:resource("v1", "configmaps"):get("cozy-system", "settings")
    assert.equal("prod", cm.data.mode)
    assert.same({ 401, 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    assert.equal(1, c.stats.retries)
    c:close()
  end)

  it("prefers tokenFile over token when both are set", function()
    local tf = dir .. "/token-both"
    transport_harness.write_file(tf, transport_harness.TOKEN)
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv,
      "    token: stale-literal\n    tokenFile: " .. tf), log = captured.log })
    assert.equal("prod", c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.same({ 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    c:close()
  end)

  it("retries an injected 401 once, and only once", function()
    local tf = dir .. "/token-good"
    transport_harness.write_file(tf, transport_harness.TOKEN)
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv, "    tokenFile: " .. tf), log = captured.log })
    local cms = c:resource("v1", "configmaps")
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, status = { code = 401 } } }
    assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
    srv:faults { { method = "GET", path = "configmaps/settings", times = 5, status = { code = 401 } } }
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(401, err.code)
    assert.equal(2, #err.attempts)
    assert.same({ 401, 200, 401, 401 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    assert.same({ "status", "status", "status" }, srv:fired())
    c:close()
  end)

  it("re-reads the token file after token_refresh seconds, without waiting for a 401", function()
    local tf = dir .. "/token-periodic"
    transport_harness.write_file(tf, transport_harness.TOKEN)
    local path = kubeconfig(dir, srv, "    tokenFile: " .. tf)
    local cached = transport_harness.connect(srv, { kubeconfig = path, log = captured.log }) -- default: 60 s
    local fast = transport_harness.connect(srv, { kubeconfig = path, log = captured.log, token_refresh = 0.2 })
    local cms = fast:resource("v1", "configmaps")
    local t_read = sys.monotime()
    assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
    transport_harness.write_file(tf, "revoked-token")
    srv:clear_requests()
    -- the fast client goes on with the token it holds until its refresh
    -- interval has passed, then re-reads the file and sends the new (here:
    -- revoked) token: poll until it does, with a bound
    local err = transport_harness.fake.poll(10, function()
      local ok, e = pcall(cms.get, cms, "cozy-system", "settings")
      if not ok then return e end
    end, 0.02)
    local switched = sys.monotime() - t_read
    assert.is_truthy(err, "the token file was not re-read within 10 s")
    assert.equal(401, err.code)
    assert.is_true(switched >= 0.2, ("re-read after %.3fs, before the 0.2 s interval"):format(switched))
    -- every request before the switch had the old token; the re-read one is
    -- refused, and the retry after the 401 (a re-read again) too
    local seen = statuses(transport_harness.api_requests(srv, "GET", SETTINGS))
    assert.same({ 401, 401 }, { seen[#seen - 1], seen[#seen] })
    for i = 1, #seen - 2 do assert.equal(200, seen[i], "request " .. i) end
    -- the cached client, told nothing, keeps the token it read: no re-read before its 60 s
    srv:clear_requests()
    assert.equal("prod", cached:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.same({ 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    cached:close()
    fast:close()
  end)

  it("honours insecure-skip-tls-verify from the kubeconfig, with a warning", function()
    local path = kubeconfig(dir, srv, "    token: " .. transport_harness.TOKEN, "    insecure-skip-tls-verify: true")
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.is_true(c.info.insecure)
    assert.equal(1, captured.count("warn", "insecure%-skip%-tls%-verify"))
    assert.equal("prod", c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    c:close()
  end)

  it("connects in-cluster from the service account directory", function()
    local sa = dir .. "/sa"
    os.execute("mkdir -p '" .. sa .. "'")
    transport_harness.write_file(sa .. "/token", transport_harness.TOKEN .. "\n")
    transport_harness.write_file(sa .. "/ca.crt", transport_harness.read_file(srv.ca))
    transport_harness.write_file(sa .. "/namespace", "team-b")
    local port = srv.url:match(":(%d+)$")
    local code, out, err = transport_harness.run(
      ("-u KUBECONFIG KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=%s COZY_MIGRATE_SERVICEACCOUNT_DIR=%s")
        :format(port, sa),
      [[lua -e 'local c = require("cozy.kube").connect{}; print(c.namespace, c.info.source, c.info.auth,
        c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)']])
    assert.equal(0, code, err)
    assert.equal("team-b\tin-cluster\ttoken-file\tprod\n", out)
  end)

  it("a second client can be opened from the plain-data options of the first", function()
    local c = transport_harness.connect(srv, { log = captured.log })
    local opts = c.options
    for _, v in pairs(opts) do assert.are_not.equal("function", type(v)) end
    local c2 = kube.connect(opts)
    assert.equal("prod", c2:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.equal(1, c2.stats.requests)
    assert.equal(0, c.stats.requests)
    c2:close()
    c:close()
  end)

  describe("the token never appears in output", function()
    local function scan(v, seen, found)
      seen = seen or {}
      if type(v) == "string" then
        if v:find(transport_harness.TOKEN, 1, true) then found[#found + 1] = v end
      elseif type(v) == "table" and not seen[v] then
        seen[v] = true
        for k, x in pairs(v) do scan(k, seen, found); scan(x, seen, found) end
        local mt = getmetatable(v)
        if type(mt) == "table" then scan(mt, seen, found) end
      end
      return found
    end

    it("not in log lines at full verbosity, errors, or the client's Lua values", function()
      local tf = dir .. "/token-log"
      transport_harness.write_file(tf, "stale")
      local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(dir, srv, "    tokenFile: " .. tf), log = captured.log })
      transport_harness.write_file(tf, transport_harness.TOKEN)
      local cms = c:resource("v1", "configmaps")
      cms:get("cozy-system", "settings")                                   -- 401 then retry
      srv:faults { { method = "GET", times = 2, status = { code = 503 } } }
      cms:get("cozy-system", "settings")                                   -- retries logged
      local _, e1 = pcall(cms.get, cms, "cozy-system", "absent")
      srv:faults { { method = "GET", times = 1, reset = true } }
      cms:get("cozy-system", "settings")
      srv:faults { { method = "GET", times = 10, status = { code = 401 } } }
      local _, e2 = pcall(cms.get, cms, "cozy-system", "settings")
      assert.equal(401, e2.code)
      -- the 503s, the reset and the two 401s of the re-read token all met their rules
      assert.same({ "status", "status", "reset", "status", "status" }, srv:fired())
      local text = captured.text() .. tostring(e1) .. tostring(e2)
      assert.is_true(#captured.lines >= 4)
      assert.is_nil(text:find(transport_harness.TOKEN, 1, true))
      assert.same({}, scan(c, nil, {}))
      assert.same({}, scan(e2, nil, {}))
      c:close()
    end)

    it("not in the process output of a verbose run", function()
      local code, out, err = transport_harness.run("", ([[lua -e '
        local kube = require "cozy.kube"
        local log = require("cozy.log").new{ format = "text", verbosity = 3, stream = io.stderr }
        local c = kube.connect{ kubeconfig = %q, log = log, retry = { base_delay = 0.01 } }
        local cms = c:resource("v1", "configmaps")
        print(cms:get("cozy-system", "settings").data.mode)
        print(pcall(cms.get, cms, "cozy-system", "absent"))
        local bad = kube.connect{ kubeconfig = %q, log = log }
        print(pcall(bad.resource(bad, "v1", "configmaps").get, bad:resource("v1", "configmaps"), "cozy-system", "settings"))
        error(select(2, pcall(cms.get, cms, "nope", "nope")))']]):format(srv.kubeconfig,
        kubeconfig(dir, srv, "    token: " .. transport_harness.TOKEN .. "-wrong")))
      assert.are_not.equal(0, code)
      assert.matches("prod", out)
      assert.matches("Unauthorized", out)
      assert.is_nil((out .. err):find(transport_harness.TOKEN, 1, true))
      -- and the commands of the CLI at -v -v -v, whatever they answer here
      for _, cmd in ipairs { "status", "check", "plan" } do
        local _, o2, e2 = transport_harness.run("", ("%s -v -v -v --kubeconfig %s"):format(cmd, srv.kubeconfig))
        assert.is_nil((o2 .. e2):find(transport_harness.TOKEN, 1, true), cmd)
      end
    end)
  end)
end)
