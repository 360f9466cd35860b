-- No output path prints a secret (issue 35, class 2): the -v=8/9 trace in
-- both log formats, check's findings (text and JSON), a plan's and a dry
-- run's writes, status, the history, the Events and the termination
-- message. The carriers: a Secret's data and stringData, the annotations
-- that hold a copy of them (kubectl apply's last-applied-configuration,
-- kapp's original), and the user-info of a URL whose password holds a '/',
-- a quote or an '@' (a kubeconfig's proxy-url, $HTTPS_PROXY, a server URL).
-- Each case failed on the binary before the fix.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local json = require "cozy.json"

local TOKEN = "tok-output-secrets-5e1d"
local APPLIED_B64 = "YXBwbGllZC1zZWNyZXQtdmFsdWU=" -- "applied-secret-value"
local APPLIED_PLAIN = "applied-string-data-3b7"
local KAPP_B64 = "a2FwcC1vcmlnaW5hbC1zZWNyZXQ=" -- "kapp-original-secret"
local WRITTEN = "written-by-a-walk-51c"
local PATCHED = "patched-annotation-8e2"

-- The annotation `kubectl apply` leaves on what it applied: the object as
-- the manifest gave it, data and stringData included, and a newline.
local function applied(name, data, string_data)
  return json.encode { apiVersion = "v1", kind = "Secret", type = "Opaque", data = data, stringData = string_data,
    metadata = { annotations = {}, name = name, namespace = "other" } } .. "\n"
end

local LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

local function cluster()
  return cli.fixture(1, {
    { apiVersion = "v1", kind = "Namespace", metadata = { name = "other" } },
    { apiVersion = "v1", kind = "Secret", type = "Opaque",
      metadata = { name = "applied", namespace = "other", annotations = {
        [LAST_APPLIED] = applied("applied", { password = APPLIED_B64 }, { token = APPLIED_PLAIN }),
        ["kapp.k14s.io/original"] = json.encode { apiVersion = "v1", kind = "Secret",
          metadata = { name = "applied" }, data = { k = KAPP_B64 } },
        ["example.com/owner"] = "team-a",
      } },
      data = { password = APPLIED_B64, token = "YXBwbGllZC1zdHJpbmctZGF0YS0zYjc=" } },
  })
end

local LEAKS = { APPLIED_B64, "applied-secret-value", APPLIED_PLAIN, KAPP_B64, "kapp-original-secret", WRITTEN, PATCHED,
  TOKEN }

local function assert_no_leak(text, what)
  for _, leaked in ipairs(LEAKS) do
    assert(not text:find(leaked, 1, true), ("%s shows %q:\n%s"):format(what, leaked, text))
  end
end

-- A run that reads the Secret, lists the namespace's Secrets and patches
-- the Secret as `kubectl apply` would (its annotation with it).
local READER = [[
return {
  description = "reads a Secret kubectl applied, and applies it again",
  permissions = {
    { verb = "get", group = "", resource = "secrets" },
    { verb = "list", group = "", resource = "secrets" },
    { verb = "patch", group = "", resource = "secrets" },
  },
  run = function(ctx)
    local secrets = ctx.kube:resource("v1", "secrets")
    local s = secrets:get("other", "applied")
    assert(s.metadata.annotations["example.com/owner"] == "team-a")
    secrets:list { namespace = "other" }
    secrets:merge_patch("other", "applied", { metadata = { annotations = { [%q] = %q } },
      stringData = { token = %q } })
  end,
}
]]

-- A walk writing Secrets: check reports each write it would make.
local WRITER = [[
return {
  description = "writes Secrets",
  permissions = {
    { verb = "create", group = "", resource = "secrets" },
    { verb = "patch", group = "", resource = "secrets" },
  },
  walk = function(ctx)
    local secrets = ctx.kube:resource("v1", "secrets")
    secrets:create({ apiVersion = "v1", kind = "Secret", metadata = { name = "new", namespace = "other" },
      stringData = { password = %q } })
    secrets:merge_patch("other", "applied", { metadata = { annotations = { [%q] = %q } } })
    secrets:json_patch("other", "applied", { { op = "add", path = "/data/extra", value = %q } })
  end,
}
]]

describe("output paths and secrets", function()
  local srv, dir
  setup(function() srv = fake.start { fixtures = { cluster() }, tls = true, token = TOKEN } end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function()
    srv:reset { cluster() }
    dir = cli.tmpdir()
  end)
  after_each(function() files.rm_rf(dir) end)

  it("-v=8 and -v=9, text and JSON: no Secret's data, nor its last-applied-configuration or kapp original", function()
    files.write(dir .. "/1-reader.lua", READER:format(LAST_APPLIED,
      applied("applied", { password = APPLIED_B64 }, { token = PATCHED }), PATCHED))
    for _, format in ipairs { "text", "json" } do
      for _, v in ipairs { "8", "9" } do
        srv:reset { cluster() }
        local r = cli.run { "-v=" .. v, "--log-format", format, "--kubeconfig", srv.kubeconfig, "--no-builtin",
          "--migrations", dir, "run" }
        assert.equal(0, r.code, r.stderr)
        -- the migration did read and write the Secret, and the trace shows
        -- its bodies: the annotations' keys and a plain one, values redacted
        assert.matches(PATCHED, srv:object("Secret", "other", "applied").metadata.annotations[LAST_APPLIED], 1, true)
        assert.matches("response_body", r.stderr, 1, true)
        assert.matches("last-applied-configuration", r.stderr, 1, true)
        assert.matches("team-a", r.stderr, 1, true)
        assert.matches("<redacted>", r.stderr, 1, true)
        assert_no_leak(r.stderr, ("-v=%s --log-format %s"):format(v, format))
      end
    end
  end)

  it("check, plan and run --dry-run show a walk's Secret writes without their values", function()
    files.write(dir .. "/1-writer.lua", WRITER:format(WRITTEN, LAST_APPLIED,
      applied("applied", nil, { token = PATCHED }), "d3JpdHRlbg=="))
    LEAKS[#LEAKS + 1] = "d3JpdHRlbg=="
    finally(function() LEAKS[#LEAKS] = nil end)
    for _, args in ipairs {
      { "check" }, { "check", "-o", "json" }, { "plan" }, { "plan", "--log-format", "json" },
      { "run", "--dry-run" }, { "run", "--dry-run", "--log-format", "json" },
    } do
      local r = cli.run(cli.args(srv, dir, table.unpack(args)))
      local what = table.concat(args, " ")
      assert.equal(0, r.code, what .. ": " .. r.stderr)
      assert.matches("secrets", r.stdout, 1, true)
      assert.matches("<redacted>", r.stdout, 1, true)
      assert_no_leak(r.stdout .. r.stderr, what)
    end
    assert.is_nil(srv:object("Secret", "other", "new"))
  end)

  -- A kubeconfig of srv whose cluster has `extra` lines (a proxy-url) or
  -- whose server is `server`.
  local function kubeconfig(extra, server)
    local text = assert(files.read(srv.kubeconfig))
    if server then text = text:gsub("\n    server: [^\n]*", "\n    server: " .. server, 1) end
    if extra then text = text:gsub("\n    server: [^\n]*", "%0\n" .. extra, 1) end
    local path = dir .. "/kubeconfig"
    files.write(path, text)
    return path
  end

  local PASSWORDS = { 'pa/ss"wd@x', "s3cr/et@p@ss" }

  it("check's findings, its JSON and its termination message: a proxy password with '/', a quote or '@'", function()
    for _, password in ipairs(PASSWORDS) do
      for _, via in ipairs { "proxy-url", "HTTPS_PROXY" } do
        local url = "http://user:" .. password .. "@127.0.0.1:9"
        -- a server no proxy is skipped for (a loopback one is, as Go skips it)
        local path = kubeconfig(via == "proxy-url" and ("    proxy-url: '" .. url .. "'") or nil,
          "https://cluster.example.invalid:6443")
        local env = { COZY_MIGRATE_TERMINATION_LOG = dir .. "/termination", HTTPS_PROXY = false, https_proxy = false,
          NO_PROXY = false, no_proxy = false }
        if via == "HTTPS_PROXY" then env.HTTPS_PROXY = url end
        for _, output in ipairs { "text", "json" } do
          files.write(dir .. "/termination", "")
          local r = cli.run({ "--kubeconfig", path, "--no-builtin", "--target", "2", "check", "-o", output }, env)
          local what = via .. " " .. output .. " " .. password
          assert.equal(1, r.code, what .. ": " .. r.stdout .. r.stderr)
          assert.matches("API server not reachable", r.stdout, 1, true, what)
          local all = r.stdout .. r.stderr .. (files.read(dir .. "/termination") or "")
          assert.matches("check blocked", all, 1, true)
          assert.matches("http://***@127.0.0.1:9", r.stdout, 1, true, what) -- the URL quoted, its user-info blanked
          for _, part in ipairs { password, password:sub(1, 4), "user:" } do
            assert(not all:find(part, 1, true), ("%s shows %q:\n%s"):format(what, part, all))
          end
        end
      end
    end
  end)

  it("a server URL with credentials is never shown, at -v=9 too", function()
    for _, password in ipairs(PASSWORDS) do
      local server = srv.url:gsub("^https://", "https://admin:" .. password .. "@")
      local path = kubeconfig(nil, "'" .. server .. "'")
      for _, format in ipairs { "text", "json" } do
        local r = cli.run { "-v=9", "--log-format", format, "--kubeconfig", path, "--no-builtin", "--target", "2", "status" }
        assert.matches("connected", r.stderr, 1, true)
        for _, part in ipairs { password, password:sub(1, 4), "admin:" } do
          assert(not r.stderr:find(part, 1, true), ("%s shows %q:\n%s"):format(format, part, r.stderr))
        end
      end
    end
  end)

  it("a failure quoting a URL with a password: the history, status, the Events and the termination message", function()
    local url = "https://robot:" .. PASSWORDS[1] .. "@registry.example.com/v2"
    files.write(dir .. "/1-fails.lua", ([[
return {
  description = "fails, quoting a URL with its password",
  run = function(ctx)
    ctx.log:warn(%q)
    error(%q)
  end,
}
]]):format("registry " .. url .. " was slow", "could not pull from " .. url))
    local env = { COZY_MIGRATE_TERMINATION_LOG = dir .. "/termination", POD_NAME = "migrate-pod" }
    files.write(dir .. "/termination", "")
    local r = cli.run(cli.args(srv, dir, "run"), env)
    assert.equal(1, r.code, r.stderr)
    local _, cm = cli.version(srv)
    local history = cm.data.history
    assert.matches("could not pull from https://***@registry.example.com/v2", history, 1, true)
    local st = cli.run(cli.args(srv, dir, "status"))
    local st_json = cli.run(cli.args(srv, dir, "status", "-o", "json"))
    local events = srv:request("GET", "/apis/events.k8s.io/v1/namespaces/cozy-system/events").body
    assert.matches("could not pull", events, 1, true)
    local all = table.concat({ r.stdout, r.stderr, history, st.stdout, st.stderr, st_json.stdout, events,
      files.read(dir .. "/termination") or "" }, "\n")
    for _, part in ipairs { PASSWORDS[1], PASSWORDS[1]:sub(1, 4), "robot:" } do
      assert(not all:find(part, 1, true), ("an output shows %q:\n%s"):format(part, all))
    end
  end)
end)
