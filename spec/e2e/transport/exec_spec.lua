-- Exec credential plugins (issue 26, item 2), run for real: the plugin is
-- spec/fixtures/exec/plugin.sh, told by its kubeconfig env what to be (a
-- token issuer, an expiring one, one that hangs, prints garbage, floods,
-- fails, or needs a terminal). Before exec plugins, every kubeconfig here
-- was refused with "exec credential plugins are not supported".
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local json = require "cozy.json"

local PLUGIN = os.getenv("PWD") .. "/spec/fixtures/exec/plugin.sh"
local SETTINGS = "/api/v1/namespaces/cozy%-system/configmaps/settings$"
local V1 = "client.authentication.k8s.io/v1"

local function lines_in(path)
  local n = 0
  for _ in (transport_harness.read_file(path) or ""):gmatch("[^\n]+") do n = n + 1 end
  return n
end

local function statuses(entries)
  local out = {}
  for i, e in ipairs(entries) do out[i] = e.status end
  return out
end

describe("exec credential plugins", function()
  local srv, dir, captured, seq = nil, nil, nil, 0
  setup(function()
    srv = transport_harness.start()
    dir = transport_harness.tmpdir()
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)
  before_each(function()
    srv:clear_faults()
    srv:clear_requests()
    captured = harness.capture_log(1)
  end)

  -- A kubeconfig whose user runs the plugin with env (a table) and the
  -- exec fields in `exec` (YAML lines, indented 6).
  local function kubeconfig(server, env, exec)
    seq = seq + 1
    local path = ("%s/kubeconfig-%d"):format(dir, seq)
    local e = {}
    for k, v in pairs(env) do e[#e + 1] = ("      - {name: %s, value: '%s'}"):format(k, v) end
    table.sort(e)
    transport_harness.write_file(path, table.concat({
      "apiVersion: v1", "kind: Config", "current-context: c",
      "contexts:", "- name: c", "  context: {cluster: k, user: u}",
      "clusters:", "- name: k", "  cluster:", "    server: " .. server.url,
      "    certificate-authority: " .. server.ca,
      "users:", "- name: u", "  user:", "    exec:",
      "      command: " .. PLUGIN,
      exec or ("      apiVersion: " .. V1 .. "\n      interactiveMode: Never"),
      "      env:", table.concat(e, "\n"), "",
    }, "\n"))
    return path
  end

  local function token_file(value)
    seq = seq + 1
    local path = ("%s/token-%d"):format(dir, seq)
    transport_harness.write_file(path, value .. "\n")
    return path
  end

  local function connect_err(path, extra)
    local opts = { kubeconfig = path, log = captured.log }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local ok, err = pcall(transport_harness.connect, srv, opts)
    assert.is_false(ok, "the connection was expected to fail")
    assert.equal("ConfigError", err.reason)
    return err
  end

  it("authenticates with the plugin's token, runs it once while the token is valid, and tells it the cluster", function()
    local runs, info = dir .. "/runs-cached", dir .. "/info-cached"
    local path = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN), RUNS = runs, EXPIRES = 3600,
      INFO_OUT = info }, "      apiVersion: " .. V1 .. "\n      interactiveMode: IfAvailable\n" ..
      "      provideClusterInfo: true\n      args: [--region, eu-1]")
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.equal("exec", c.info.auth)
    local cms = c:resource("v1", "configmaps")
    for _ = 1, 3 do assert.equal("prod", cms:get("cozy-system", "settings").data.mode) end
    assert.same({ 200, 200, 200 }, statuses(transport_harness.api_requests(srv, "GET", SETTINGS)))
    assert.equal(1, lines_in(runs))
    local sent = json.decode(transport_harness.read_file(info))
    assert.equal("ExecCredential", sent.kind)
    assert.equal(V1, sent.apiVersion)
    assert.is_false(sent.spec.interactive) -- busted's stdin is no terminal
    assert.equal(srv.url, sent.spec.cluster.server)
    local b64 = io.popen("base64 -w0 '" .. srv.ca .. "'")
    assert.equal(b64:read("a"), sent.spec.cluster["certificate-authority-data"])
    b64:close()
    c:close()
  end)

  it("runs the plugin again before each request once its expirationTimestamp has passed", function()
    local runs = dir .. "/runs-expired"
    local path = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN), RUNS = runs, EXPIRES = -60 })
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.equal(1, lines_in(runs))
    local cms = c:resource("v1", "configmaps")
    for _ = 1, 3 do assert.equal("prod", cms:get("cozy-system", "settings").data.mode) end
    assert.equal(4, lines_in(runs))
    c:close()
  end)

  it("after a 401, runs the plugin again and replays the request with the new token", function()
    local own = transport_harness.start()
    local tf = token_file(transport_harness.TOKEN)
    local runs = dir .. "/runs-401"
    local ok, err = pcall(function()
      local c = transport_harness.connect(own, { kubeconfig = kubeconfig(own, { TOKEN_FILE = tf, RUNS = runs }),
        log = captured.log })
      local cms = c:resource("v1", "configmaps")
      assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
      -- the server revokes the token and the plugin's source now holds the new one
      own:faults { { method = "GET", path = "configmaps/settings", rotate_token = { token = "rotated-tok", file = tf } } }
      assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
      assert.same({ "rotate_token" }, own:fired())
      assert.same({ 200, 401, 200 }, statuses(transport_harness.api_requests(own, "GET", SETTINGS)))
      assert.equal(2, lines_in(runs))
      c:close()
    end)
    own:stop()
    assert(ok, err)
  end)

  it("clients of one process share the plugin's credential, renewed once after a 401 (client-go's cache)", function()
    local tf, runs = token_file(transport_harness.TOKEN), dir .. "/runs-shared"
    local path = kubeconfig(srv, { TOKEN_FILE = tf, RUNS = runs, EXPIRES = 3600 })
    local a = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    local b = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.equal(1, lines_in(runs))
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, status = { code = 401 } } }
    assert.equal("prod", a:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.same({ "status" }, srv:fired())
    assert.equal(2, lines_in(runs)) -- the 401 renewed it
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.equal("prod", c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.equal("prod", b:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    assert.equal(2, lines_in(runs)) -- the renewed one is shared; b keeps the one it holds
    a:close()
    b:close()
    c:close()
  end)

  it("after a 401, a plugin that fails leaves the 401 final, with its reason", function()
    local fail_if = dir .. "/fail-now"
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN),
      FAIL_IF = fail_if }), log = captured.log })
    local cms = c:resource("v1", "configmaps")
    assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
    transport_harness.write_file(fail_if, "")
    srv:faults { { method = "GET", path = "configmaps/settings", times = 1, status = { code = 401 } } }
    local ok, err = pcall(cms.get, cms, "cozy-system", "settings")
    assert.is_false(ok)
    assert.equal(401, err.code)
    assert.same({ "status" }, srv:fired())
    assert.equal(1, #err.attempts) -- no replay with the credential it could not renew
    assert.matches("exec plugin .*plugin%.sh: exited with status 3", err.attempts[1].credential_error)
    assert.matches("credential not renewed: .*exited with status 3", tostring(err))
    c:close()
  end)

  -- the same rule in the batch driver (core/transport_multi.c), which an
  -- update's PATCH goes through: the judge asks for the refresh, the driver
  -- runs the plugin and ends the request with its reason
  it("after a 401 to a batch's write, a plugin that fails leaves the 401 final, with its reason", function()
    local fail_if = dir .. "/fail-batch"
    local c = transport_harness.connect(srv, { kubeconfig = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN),
      FAIL_IF = fail_if }), log = captured.log })
    local cms = c:resource("v1", "configmaps")
    local base = cms:get("cozy-system", "settings")
    transport_harness.write_file(fail_if, "")
    srv:faults { { method = "PATCH", path = "configmaps/settings", times = 1, status = { code = 401 } } }
    local ok, err = pcall(cms.update, cms, base, function(o)
      o.data.mode = "batch"
      return o
    end)
    assert.is_false(ok)
    assert.equal(401, err.code)
    assert.same({ "status" }, srv:fired())
    assert.equal(1, #err.attempts) -- no replay with the credential it could not renew
    assert.matches("exec plugin .*plugin%.sh: exited with status 3", err.attempts[1].credential_error)
    assert.equal("prod", cms:get("cozy-system", "settings").data.mode)
    c:close()
  end)

  it("kills a plugin that hangs, its children too, at exec_timeout", function()
    local pids = dir .. "/pids-hang"
    local err = connect_err(kubeconfig(srv, { MODE = "hang", PIDS = pids }), { exec_timeout = 0.5 })
    assert.matches("exec plugin .*plugin%.sh: did not finish within 0%.5 s %(killed%)", err.message)
    assert.equal("users[u].user.exec", err.field)
    local got = transport_harness.read_file(pids)
    assert.truthy(got and got:match("%d+\n%d+"), "the plugin did not start its child")
    -- SIGKILL to the group is delivered asynchronously and the orphaned child
    -- is reaped by init: poll until neither runs (a zombie runs no more)
    local function running(pid)
      local stat = transport_harness.read_file("/proc/" .. pid .. "/stat")
      return stat ~= nil and stat:match("^%d+ %b() (%a)") ~= "Z"
    end
    for pid in got:gmatch("%d+") do
      assert.is_truthy(transport_harness.fake.poll(10, function() return not running(pid) end, 0.02),
        "process " .. pid .. " survived")
    end
  end)

  it("refuses garbage, and a plugin that prints without end, naming neither's output", function()
    local err = connect_err(kubeconfig(srv, { MODE = "garbage" }))
    assert.matches("its output is not an ExecCredential", err.message)
    assert.is_nil(err.message:find("example.invalid", 1, true))
    err = connect_err(kubeconfig(srv, { MODE = "flood" }))
    assert.matches("printed more than 1048576 bytes, the limit for an ExecCredential %(killed%)", err.message)
  end)

  it("a plugin that fails: its exit status, its stderr passed to the operator", function()
    local path = kubeconfig(srv, { MODE = "fail" })
    local code, out, stderr = transport_harness.run("", ("lua -e 'require(\"cozy.kube\").connect{ kubeconfig = %q }'")
      :format(path))
    assert.are_not.equal(0, code, out)
    assert.matches("exec%-plugin: the refresh token has expired, run: login", stderr)
    assert.matches("exec plugin .*plugin%.sh: exited with status 3", stderr)
  end)

  it("interactiveMode Always needs a terminal; with one, the plugin gets it", function()
    local always = "      apiVersion: " .. V1 .. "\n      interactiveMode: Always"
    local path = kubeconfig(srv, { MODE = "tty", TOKEN_FILE = token_file(transport_harness.TOKEN) }, always)
    local err = connect_err(path)
    assert.matches("needs an interactive terminal %(interactiveMode: Always%) and standard input is not one",
      err.message)
    -- under script(1) stdin is a pseudo-terminal: the plugin reads it and answers
    local cmd = ([[lua -e 'local c = require("cozy.kube").connect{ kubeconfig = "%s" }
      print(c.info.auth, c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)']]):format(path)
    local r = io.popen(("script -qec %q /dev/null </dev/null 2>&1"):format(
      ("%s %s"):format(os.getenv("COZY_MIGRATE_BIN"), cmd:gsub("\n", " "))))
    local text = r:read("a")
    r:close()
    assert.matches("exec\tprod", text)
  end)

  it("never shows the plugin's token: not in the log at the highest verbosity, not in info", function()
    local path = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN) })
    local code, out, stderr = transport_harness.run("", ([[lua -e 'local log = require("cozy.log").new{ verbosity = 9 }
      local c = require("cozy.kube").connect{ kubeconfig = "%s", log = log }
      for k, v in pairs(c.info) do print(k, v) end
      print(c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)']]):format(path))
    assert.equal(0, code, stderr)
    assert.matches("prod", out)
    assert.is_nil((out .. stderr):find(transport_harness.TOKEN, 1, true))
  end)

  it("checks the exec stanza as client-go does", function()
    local function stanza(lines) return connect_err(kubeconfig(srv, {}, lines)) end
    local err = stanza("      apiVersion: " .. V1)
    assert.equal("users[u].user.exec.interactiveMode", err.field)
    assert.matches("must be specified for client.authentication.k8s.io/v1", err.message)
    err = stanza("      apiVersion: client.authentication.k8s.io/v1alpha1\n      interactiveMode: Never")
    assert.equal("users[u].user.exec.apiVersion", err.field)
    assert.matches("v1alpha1 was removed", err.message)
    err = stanza("      apiVersion: " .. V1 .. "\n      interactiveMode: Sometimes")
    assert.matches("must be Never, IfAvailable or Always", err.message)
    -- the plugin answering another version than the one asked
    err = connect_err(kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN),
      API = "client.authentication.k8s.io/v1beta1" }))
    assert.matches("is configured to use API version client.authentication.k8s.io/v1, the plugin returned " ..
      "client.authentication.k8s.io/v1beta1", err.message)
  end)

  it("v1beta1, interactiveMode defaulting to IfAvailable", function()
    local path = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN), API = "client.authentication.k8s.io/v1beta1" },
      "      apiVersion: client.authentication.k8s.io/v1beta1")
    local c = transport_harness.connect(srv, { kubeconfig = path, log = captured.log })
    assert.equal("prod", c:resource("v1", "configmaps"):get("cozy-system", "settings").data.mode)
    c:close()
  end)

  -- Where a plugin comes from (issue 35): Go's exec.LookPath, which
  -- client-go runs a bare command through, refuses since Go 1.19 a command
  -- found through an empty PATH element (the current directory) or a
  -- relative one (exec.ErrDot). The runner runs from the directory it was
  -- started in, which may hold anything.
  describe("a bare command looked up in PATH", function()
    local cwd
    before_each(function()
      cwd = transport_harness.tmpdir()
      os.execute(("mkdir -p '%s/bin' '%s/abs'"):format(cwd, cwd))
      for _, d in ipairs { cwd, cwd .. "/bin", cwd .. "/abs" } do
        transport_harness.write_file(d .. "/cozy-dot-plugin", ('#!/bin/sh\nexec %s "$@"\n'):format(PLUGIN))
        os.execute(("chmod +x '%s/cozy-dot-plugin'"):format(d))
      end
    end)
    after_each(function() os.execute("rm -rf '" .. cwd .. "'") end)

    -- cozy-migrate status from cwd with PATH, its plugin the bare cozy-dot-plugin
    local function status_with(path_env)
      local runs = cwd .. "/runs"
      os.remove(runs)
      local kc = kubeconfig(srv, { TOKEN_FILE = token_file(transport_harness.TOKEN), RUNS = runs })
      transport_harness.write_file(kc, transport_harness.read_file(kc):gsub("command: [^\n]+", "command: cozy-dot-plugin"))
      local r = require("spec.helpers").cli.shell(("cd '%s' && exec env PATH='%s' %s --kubeconfig '%s' --no-builtin "
        .. "--target 2 status"):format(cwd, path_env, require("spec.helpers").cli.bin, kc))
      return r, lines_in(runs)
    end

    it("refuses one found through an empty or relative element (exec.ErrDot), and never runs it", function()
      for _, path_env in ipairs { ":/usr/bin:/bin", "/usr/bin::/bin", "/usr/bin:/bin:", ".:/usr/bin:/bin",
          "bin:/usr/bin:/bin" } do
        local r, runs = status_with(path_env)
        assert.equal(2, r.code, path_env .. ": " .. r.stderr)
        local found = path_env:sub(1, 3) == "bin" and "bin/cozy-dot-plugin" or "./cozy-dot-plugin"
        assert.matches("exec plugin cozy-dot-plugin: found in PATH as " .. found .. ", relative to the current "
          .. "directory (an empty or relative PATH element): not run, as client-go refuses it (exec.ErrDot)",
          r.stderr, 1, true)
        assert.equal(0, runs, path_env .. ": the plugin ran")
      end
    end)

    it("runs the one an absolute element finds first, an empty element after it", function()
      local r, runs = status_with(cwd .. "/abs::/usr/bin:/bin")
      assert.equal(0, r.code, r.stderr)
      assert.equal(1, runs)
    end)
  end)

  it("a command that is not installed: the installHint", function()
    local path = kubeconfig(srv, {}, "      apiVersion: " .. V1 .. "\n      interactiveMode: Never\n" ..
      "      installHint: 'install it with: apt install nothing'")
    local text = transport_harness.read_file(path):gsub("command: [^\n]+", "command: cozy-no-such-plugin")
    transport_harness.write_file(path, text)
    local err = connect_err(path)
    assert.matches("exec plugin cozy%-no%-such%-plugin: not found in PATH; install it with: apt install nothing",
      err.message)
  end)
end)
