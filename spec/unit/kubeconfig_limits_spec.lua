-- Bounded configuration (issue 13): files a kubeconfig points at are read up
-- to a limit (a path to /dev/zero fails at once, naming the file and the
-- limit), a kubeconfig has a bounded size and YAML depth, and a token that
-- would inject HTTP headers (CR, LF, NUL, other control characters) is
-- refused when it is loaded. Every case is an error of kind "config" (exit 2).
local kube = require "cozy.kube"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local function tmpdir()
  return files.tmpdir("cozy-kubeconfig")
end

local function write(path, data)
  files.write(path, data)
  return path
end

-- A kubeconfig with one cluster and user; `cluster` and `user` are the
-- lines of their mappings (indented by the caller).
local function config(t)
  return table.concat({
    "apiVersion: v1",
    "kind: Config",
    "current-context: main",
    "contexts:",
    "- name: main",
    "  context: {cluster: k, user: u}",
    "clusters:",
    "- name: k",
    "  cluster:",
    "    server: https://127.0.0.1:6443",
    t.cluster or "",
    "users:",
    "- name: u",
    "  user:",
    t.user or "    token: abc",
    t.extra or "",
    "",
  }, "\n")
end

local function connect_err(path)
  local ok, err = pcall(kube.connect, { kubeconfig = path })
  assert.is_false(ok, "expected a configuration error")
  assert.equal("config", err.kind, tostring(err))
  return err
end

local function run(env, code)
  -- the host's cluster settings must not leak into what is tested
  local r = cli.shell(("env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST -u KUBERNETES_SERVICE_PORT %s %s %s")
    :format(env, files.quote(cli.bin), code))
  return r.code, r.stdout, r.stderr
end

describe("kubeconfig limits", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() files.rm_rf(dir) end)
  local n = 0
  local function file(text)
    n = n + 1
    return write(("%s/config-%d"):format(dir, n), text)
  end

  describe("files a kubeconfig points at, read up to a limit", function()
    it("a tokenFile at /dev/zero fails at once, naming the file and the 64 KiB limit", function()
      local err = connect_err(file(config { user = "    tokenFile: /dev/zero" }))
      assert.equal("users[u].user.tokenFile", err.field)
      assert.matches("token file /dev/zero is larger than 65536 bytes, the limit for token file", err.message, 1, true)
    end)

    it("a certificate-authority at /dev/zero fails, naming the file and the 4 MiB limit", function()
      local err = connect_err(file(config { cluster = "    certificate-authority: /dev/zero" }))
      assert.equal("clusters[k].cluster.certificate-authority", err.field)
      assert.matches("/dev/zero is larger than 4194304 bytes", err.message, 1, true)
    end)

    it("a client certificate or key at /dev/zero fails the same way", function()
      local pem = write(dir .. "/cert.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
      local err = connect_err(file(config { user = "    client-certificate: /dev/zero\n    client-key: " .. pem }))
      assert.equal("users[u].user.client-certificate", err.field)
      assert.matches("/dev/zero is larger than 4194304 bytes", err.message, 1, true)
      err = connect_err(file(config { user = "    client-certificate: " .. pem .. "\n    client-key: /dev/zero" }))
      assert.equal("users[u].user.client-key", err.field)
      assert.matches("/dev/zero is larger than 4194304 bytes", err.message, 1, true)
    end)

    it("a token file of exactly 64 KiB is read; one byte more is refused", function()
      local tok = dir .. "/token"
      write(tok, ("t"):rep(65536))
      local ok, c = pcall(kube.connect, { kubeconfig = file(config { user = "    tokenFile: " .. tok }) })
      assert.is_true(ok, tostring(c))
      assert.equal("token-file", c.info.auth)
      c:close()
      write(tok, ("t"):rep(65537))
      local err = connect_err(file(config { user = "    tokenFile: " .. tok }))
      assert.matches("is larger than 65536 bytes", err.message, 1, true)
    end)

    it("the kubeconfig itself at /dev/zero fails, naming the 16 MiB limit", function()
      local err = connect_err("/dev/zero")
      assert.equal("/dev/zero", err.file)
      assert.matches("the kubeconfig is larger than 16777216 bytes", err.message, 1, true)
    end)

    it("in-cluster: a token or CA at /dev/zero fails the same way (child process)", function()
      local sa = dir .. "/sa"
      os.execute("mkdir -p '" .. sa .. "'")
      os.execute("ln -sf /dev/zero '" .. sa .. "/token'")
      write(sa .. "/ca.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
      local env = ("KUBERNETES_SERVICE_HOST=10.0.0.1 KUBERNETES_SERVICE_PORT=443 COZY_MIGRATE_SERVICEACCOUNT_DIR=%s"):format(sa)
      local code, _, err = run(env, "lua -e 'require(\"cozy.kube\").connect{}'")
      assert.equal(1, code) -- a raised error in `lua -e`: what matters is the message
      assert.matches("in-cluster configuration: token file " .. sa .. "/token is larger than 65536 bytes", err, 1, true)
      os.execute("rm -f '" .. sa .. "/token'")
      write(sa .. "/token", "sa-token\n")
      os.execute("ln -sf /dev/zero '" .. sa .. "/ca.crt'")
      code, _, err = run(env, "lua -e 'require(\"cozy.kube\").connect{}'")
      assert.equal(1, code)
      assert.matches("CA file " .. sa .. "/ca.crt is larger than 4194304 bytes", err, 1, true)
    end)
  end)

  describe("YAML depth", function()
    it("a 100,000-deep flow sequence fails at once with the depth limit and line", function()
      local path = file(config { extra = "preferences: " .. ("["):rep(100000) .. ("]"):rep(100000) })
      local err = connect_err(path)
      assert.equal(path, err.file)
      assert.matches("YAML nested deeper than 64 levels at line 16 (the limit for a kubeconfig)", err.message, 1, true)
    end)

    it("a 100,000-deep block structure and flow mapping fail the same way", function()
      -- "- - - - ...": one line, each "- " opens a sequence
      local err = connect_err(file(config { extra = "preferences:\n  " .. ("- "):rep(100000) .. "x" }))
      assert.matches("YAML nested deeper than 64 levels", err.message, 1, true)
      err = connect_err(file(config { extra = "preferences: " .. ("{a: "):rep(100000) .. "b" .. ("}"):rep(100000) }))
      assert.matches("YAML nested deeper than 64 levels", err.message, 1, true)
    end)

    it("accepts nesting up to the limit", function()
      -- the root mapping is level 1, preferences' value level 2
      local ok, c = pcall(kube.connect, { kubeconfig = file(config { extra = "preferences: " .. ("["):rep(63) .. ("]"):rep(63) }) })
      assert.is_true(ok, tostring(c))
      c:close()
      local err = connect_err(file(config { extra = "preferences: " .. ("["):rep(64) .. ("]"):rep(64) }))
      assert.matches("deeper than 64 levels", err.message, 1, true)
    end)

    it("is a configuration error of the CLI: exit 2 with the message", function()
      local path = file(config { extra = "preferences: " .. ("["):rep(100000) .. ("]"):rep(100000) })
      local code, _, err = run("NAMESPACE=cozy-system", "status --kubeconfig '" .. path .. "'")
      assert.equal(2, code, err)
      assert.matches("YAML nested deeper than 64 levels", err, 1, true)
    end)
  end)

  describe("tokens that would inject headers", function()
    local function assert_refused(err, field)
      assert.equal(field, err.field)
      assert.matches("contains a CR, LF, NUL or other control character", err.message, 1, true)
      assert.not_matches("X%-Evil", err.message) -- never the value
    end

    it("a kubeconfig token with CR LF, LF, NUL or TAB is refused at load", function()
      for _, tok in ipairs { [["abc\r\nX-Evil: 1"]], [["abc\nX-Evil: 1"]], [["abc\0X-Evil"]], [["abc\tX-Evil"]] } do
        assert_refused(connect_err(file(config { user = "    token: " .. tok })), "users[u].user.token")
      end
    end)

    it("a token file with a line break inside is refused; a trailing newline is not", function()
      local tok = dir .. "/token-crlf"
      write(tok, "abc\r\nX-Evil: 1\n")
      assert_refused(connect_err(file(config { user = "    tokenFile: " .. tok })), "users[u].user.tokenFile")
      write(tok, "abc\0X-Evil\n")
      assert_refused(connect_err(file(config { user = "    tokenFile: " .. tok })), "users[u].user.tokenFile")
      write(tok, "good-token\r\n")
      local ok, c = pcall(kube.connect, { kubeconfig = file(config { user = "    tokenFile: " .. tok }) })
      assert.is_true(ok, tostring(c))
      c:close()
    end)

    it("an in-cluster token with a line break inside is refused (child process)", function()
      local sa = dir .. "/sa-crlf"
      os.execute("mkdir -p '" .. sa .. "'")
      write(sa .. "/token", "abc\nX-Evil: 1\n")
      write(sa .. "/ca.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
      local env = ("KUBERNETES_SERVICE_HOST=10.0.0.1 KUBERNETES_SERVICE_PORT=443 COZY_MIGRATE_SERVICEACCOUNT_DIR=%s"):format(sa)
      local code, _, err = run(env, "lua -e 'require(\"cozy.kube\").connect{}'")
      assert.equal(1, code)
      assert.matches("in-cluster configuration: the token contains a CR, LF, NUL", err, 1, true)
      assert.not_matches("X%-Evil", err)
    end)
  end)
end)
