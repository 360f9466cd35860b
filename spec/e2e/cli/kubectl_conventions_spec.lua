-- kubectl's conventions (issue 26, item 1): options before or after the
-- command, -n/-o shorthands, -v=6 request tracing, -v=8 bodies with Secret
-- data redacted, Go durations, COMMAND --help. Where kubectl has the same
-- convention, the real kubectl runs beside us on the same kubeconfig and the
-- API server's request log says both did the same thing.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local TOKEN = "tok-never-logged-7f3a"
local SECRET_B64 = "c2VjcmV0LXZhbHVl" -- "secret-value"

local function stamp(ns, version)
  return { apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = "cozystack-version", namespace = ns }, data = { version = tostring(version) } }
end

local function cluster()
  return {
    { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
    { apiVersion = "v1", kind = "Namespace", metadata = { name = "other" } },
    stamp("cozy-system", 1), stamp("other", 1),
    { apiVersion = "v1", kind = "Secret", metadata = { name = "s", namespace = "other" },
      data = { password = SECRET_B64 } },
  }
end

-- Our trace lines: { method, path, status } of each "API request" line.
local function our_trace(stderr)
  local out = {}
  for line in stderr:gmatch("[^\n]+") do
    if line:find(" API request ", 1, true) then
      -- a value holding "=" is quoted (cozy.log's text format)
      local path = line:match(' path="([^"]*)"') or line:match(" path=(%S+)")
      out[#out + 1] = { line:match(" method=(%S+)"), path, line:match(" status=(%d+)") }
    end
  end
  return out
end

-- kubectl's -v=6 lines (both of its formats): spec/support/fake.lua.
local kubectl_trace = fake.kubectl_requests

-- What the server saw: { method, path with query, status }.
local function served(srv)
  local out = {}
  for _, e in ipairs(srv:requests()) do
    local q = e.query and e.query ~= "" and ("?" .. e.query) or ""
    out[#out + 1] = { e.method, e.path .. q, tostring(e.status) }
  end
  return out
end

-- As sorted "METHOD path status" strings: kubectl sends its discovery
-- requests in parallel, in no fixed order.
local function as_set(list)
  local out = {}
  for i, t in ipairs(list) do out[i] = table.concat(t, " ") end
  table.sort(out)
  return out
end

-- The gcloud SDK's kubectl is a dispatcher: it asks GET /version?timeout=5s
-- itself (to pick a kubectl for the server) before kubectl proper runs, and
-- that request is not kubectl's to trace.
local function kubectls_own(list)
  local out = {}
  for _, t in ipairs(list) do
    if t[2] ~= "/version?timeout=5s" then out[#out + 1] = t end
  end
  return out
end

describe("kubectl's conventions", function()
  local srv
  setup(function() srv = fake.start{ fixtures = { cluster() }, tls = true, token = TOKEN } end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function() srv:reset{ cluster() } end)

  local function ours(...)
    return cli.run({ "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", "spec/fixtures/runner/two", ... })
  end

  -- -n forms before and after the command, against kubectl's same forms
  for _, form in ipairs({ { "-n", "other" }, { "-nother" }, { "-n=other" }, { "--namespace=other" },
      { "--namespace", "other" } }) do
    local shown = table.concat(form, " ")
    it("reads the stamp of the namespace given as " .. shown .. ", before or after the command, as kubectl", function()
      local stamp_path = "/api/v1/namespaces/other/configmaps/cozystack-version"
      for _, before in ipairs({ true, false }) do
        local args = { "-v=6" }
        if before then table.move(form, 1, #form, #args + 1, args) end
        args[#args + 1] = "status"
        if not before then table.move(form, 1, #form, #args + 1, args) end
        srv:clear_requests()
        local r = ours(table.unpack(args))
        assert.equal(0, r.code, r.stderr)
        assert.matches("version:%s+1\n", r.stdout)
        assert.equal(1, #srv:requests{ method = "GET", path = "^" .. stamp_path:gsub("%-", "%%-") .. "$" })
        assert.same(served(srv), our_trace(r.stderr))

        local k = { "-v=6" }
        if before then table.move(form, 1, #form, #k + 1, k) end
        table.move({ "get", "configmap", "cozystack-version" }, 1, 3, #k + 1, k)
        if not before then table.move(form, 1, #form, #k + 1, k) end
        srv:clear_requests()
        local kr = srv:kubectl(k)
        assert(kr.ok, "kubectl failed: " .. kr.stderr)
        local seen = kubectls_own(served(srv))
        assert.same(as_set(seen), as_set(kubectl_trace(kr.stderr)))
        local found = false
        for _, s in ipairs(seen) do found = found or s[2] == stamp_path end
        assert.is_true(found, "kubectl read " .. stamp_path)
      end
    end)
  end

  for _, form in ipairs({ { "-o", "json" }, { "-ojson" }, { "-o=json" }, { "--output", "json" }, { "--output=json" } }) do
    it("takes the output format as " .. table.concat(form, " ") .. ", before or after the command, as kubectl", function()
      for _, before in ipairs({ true, false }) do
        local function place(cmd)
          local args = {}
          if before then table.move(form, 1, #form, 1, args) end
          table.move(cmd, 1, #cmd, #args + 1, args)
          if not before then table.move(form, 1, #form, #args + 1, args) end
          return args
        end
        local r = ours(table.unpack(place({ "status" })))
        assert.equal(0, r.code, r.stderr)
        assert.equal(1, fake.json.decode(r.stdout).current)
        local kr = srv:kubectl(place({ "get", "configmap", "cozystack-version", "-n", "cozy-system" }))
        assert(kr.ok, kr.stderr)
        assert.equal("1", fake.json.decode(kr.stdout).data.version)
      end
    end)
  end

  for _, form in ipairs({ { "-v", "6" }, { "-v=6" }, { "-v6" }, { "--v=6" }, { "--v", "6" } }) do
    it("takes the level as " .. table.concat(form, " ") .. " and traces requests, as kubectl", function()
      local args = table.move(form, 1, #form, 1, {})
      args[#args + 1] = "status"
      local r = ours(table.unpack(args))
      assert.equal(0, r.code, r.stderr)
      assert.is_true(#our_trace(r.stderr) > 0)
      local k = table.move(form, 1, #form, 1, {})
      table.move({ "get", "configmap", "cozystack-version", "-n", "cozy-system" }, 1, 5, #k + 1, k)
      local kr = srv:kubectl(k)
      assert(kr.ok, kr.stderr)
      assert.is_true(#kubectl_trace(kr.stderr) > 0)
    end)
  end

  it("traces nothing below -v=6, as kubectl", function()
    for _, v in ipairs({ "-v=5", "-v" }) do
      srv:clear_requests()
      local r = ours(v, "status")
      assert.equal(0, r.code, r.stderr)
      assert.is_true(#srv:requests() > 0)
      assert.same({}, our_trace(r.stderr))
      assert.matches(" DEBUG ", r.stderr, 1, true) -- a bare -v is still debug
      local kr = srv:kubectl({ "-v=5", "get", "configmap", "cozystack-version", "-n", "cozy-system" })
      assert(kr.ok, kr.stderr)
      assert.same({}, kubectl_trace(kr.stderr))
    end
  end)

  it("-v=6 traces each request's duration, and never the token", function()
    local r = ours("status", "--v=6")
    assert.equal(0, r.code, r.stderr)
    for line in r.stderr:gmatch("[^\n]*API request[^\n]*") do
      assert.matches(" ms=%d+", line)
    end
    assert.not_matches(TOKEN, r.stderr, 1, true)
  end)

  describe("-v=8 bodies", function()
    local dir
    before_each(function()
      dir = cli.tmpdir()
      files.write(dir .. "/1-secret.lua", [[
return {
  description = "reads and patches a Secret",
  permissions = {
    { verb = "get", group = "", resource = "secrets" },
    { verb = "patch", group = "", resource = "secrets" },
  },
  run = function(ctx)
    local secrets = ctx.kube:resource("v1", "secrets")
    local s = secrets:get("other", "s")
    secrets:merge_patch("other", "s", { data = { password = s.data.password .. "QQ==" },
      stringData = { extra = "plain-secret-text" } })
  end,
}
]])
    end)
    after_each(function() files.rm_rf(dir) end)

    it("shows request and answer bodies, with a Secret's data redacted and the token never", function()
      local r = cli.run({ "-v=9", "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir, "run" })
      assert.equal(0, r.code, r.stderr)
      -- the migration did read and write the Secret
      assert.equal(SECRET_B64 .. "QQ==", srv:object("Secret", "other", "s").data.password)
      local secret_lines = 0
      for line in r.stderr:gmatch("[^\n]*API request[^\n]*") do
        if line:find("/secrets/s", 1, true) then
          secret_lines = secret_lines + 1
          assert.matches("<redacted>", line, 1, true)
        end
      end
      assert.equal(2, secret_lines) -- the GET and the PATCH
      assert.matches("response_body=", r.stderr, 1, true)
      assert.matches("request_body=", r.stderr, 1, true)
      assert.matches("cozystack-version", r.stderr, 1, true) -- bodies that hold no secret are shown
      for _, leaked in ipairs({ SECRET_B64, "secret-value", "plain-secret-text", TOKEN }) do
        assert.not_matches(leaked, r.stderr, 1, true)
      end
    end)

    it("a refused Secret write whose message quotes the data is logged without it, at any verbosity", function()
      -- what the real kube-apiserver answers a Secret write it refuses: the
      -- object it was sent, data included, quoted in the Status message
      srv:faults { { method = "PATCH", path = "/secrets/s$", times = 2, respond = { status = 422, body = {
        apiVersion = "v1", kind = "Status", status = "Failure", reason = "Invalid", code = 422,
        message = 'Secret "s" is invalid: stringData: Invalid value: {"extra":"plain-secret-text"}' } } } }
      finally(function() srv:clear_faults() end)
      for _, v in ipairs({ "0", "9" }) do
        local r = cli.run({ "-v=" .. v, "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir, "run" })
        assert.equal(1, r.code, r.stderr)
        assert.matches("Invalid (422): the server's message is not shown: on a secrets path it may quote the "
          .. "Secret's data (HTTP 422)", r.stderr, 1, true)
        assert.not_matches("plain-secret-text", r.stderr, 1, true)
      end
      assert.same({ "respond", "respond" }, srv:fired { method = "PATCH" })
    end)
  end)

  it("-v=6 traces every request a run sends, the batch's parallel writes and the lease thread's included", function()
    local items = cluster()
    for i = 1, 6 do
      items[#items + 1] = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cm-" .. i, namespace = "other" },
        data = { n = tostring(i) } }
    end
    srv:reset{ items }
    local dir = cli.tmpdir()
    files.write(dir .. "/1-label.lua", [[
return {
  description = "labels other's ConfigMaps in one batch",
  permissions = {
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
  },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:update_each(cms:list{ namespace = "other" }, function(cm)
      cm.metadata.labels = { traced = "yes" }
      return cm
    end, { concurrency = 4 })
  end,
}
]])
    srv:clear_requests()
    local r = cli.run({ "-v=6", "--kubeconfig", srv.kubeconfig, "--no-builtin", "--migrations", dir, "run" })
    files.rm_rf(dir)
    assert.equal(0, r.code, r.stderr)
    local seen = served(srv)
    assert.equal(6, #srv:requests{ method = "PATCH", path = "^/api/v1/namespaces/other/configmaps/cm%-" })
    assert.is_true(#srv:requests{ path = "/leases" } >= 2) -- taken and released
    assert.same(as_set(seen), as_set(our_trace(r.stderr)))
  end)

  it("cuts bodies at 1 KiB at -v=8, as kubectl", function()
    local big = { version = "1" }
    for i = 1, 200 do big["k" .. i] = ("v"):rep(20) end
    local items = cluster()
    items[3].data = big -- the stamp of cozy-system
    srv:reset{ items }
    local r = ours("-v", "8", "status")
    assert.equal(0, r.code, r.stderr)
    local body = r.stderr:match("configmaps/cozystack%-version response_body=\"({.-) %[truncated (%d+) chars%]\"")
    assert.truthy(body, r.stderr)
    assert.equal(1024, #body:gsub("\\(.)", "%1"))
  end)

  it("takes durations as kubectl's --request-timeout does", function()
    for _, d in ipairs({ "5s", "1m30s", "500ms", "12" }) do
      local r = ours("--request-timeout", d, "status")
      assert.equal(0, r.code, d .. ": " .. r.stderr)
      local kr = srv:kubectl({ "--request-timeout", d, "get", "configmap", "cozystack-version", "-n", "cozy-system" })
      assert(kr.ok, d .. ": " .. kr.stderr)
    end
    -- both refuse a unit neither knows; kubectl exits 1, we keep our usage status 2
    local r = ours("--request-timeout", "5x", "status")
    assert.equal(2, r.code)
    assert.equal("cozy-migrate: --request-timeout expects a duration (5s, 1m30s, 500ms) or plain seconds, got \"5x\"",
      r.stderr:match("^[^\n]*"))
    local kr = srv:kubectl({ "--request-timeout", "5x", "get", "configmap", "cozystack-version" })
    assert.equal(1, kr.code)
    assert.matches("[Ii]nvalid timeout value", kr.stderr)
  end)

  it("answers COMMAND --help and help COMMAND on stdout with exit 0, as kubectl", function()
    for _, form in ipairs({ { "get", "--help" }, { "help", "get" } }) do
      local kr = srv:kubectl(form)
      assert.equal(0, kr.code)
      assert.equal("", kr.stderr)
      assert.matches("Usage:", kr.stdout, 1, true)
    end
    for _, form in ipairs({ { "status", "--help" }, { "help", "status" }, { "-n", "x", "status", "-h" } }) do
      local r = cli.run(form)
      assert.equal(0, r.code, r.stderr)
      assert.equal("", r.stderr)
      assert.matches("^Usage: cozy%-migrate status ", r.stdout)
    end
  end)
end)
