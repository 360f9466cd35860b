-- Impersonation (issue 35, class 4): a kubeconfig user's `as`, `as-uid`,
-- `as-groups` and `as-user-extra` are sent on every request as client-go
-- sends them (Impersonate-User, Impersonate-Uid, one Impersonate-Group per
-- group, one Impersonate-Extra-<key> per value, the key percent-encoded),
-- so the server acts as that user: the stamp's history records it, and a
-- legacy script's kubectl gets the same fields. uid, groups or extra
-- without `as` is an error, as client-go's validation makes it. Before, all
-- four were ignored: requests went out as the base credentials. On both
-- servers; under RBAC on the real one: spec/real/impersonation_spec.lua.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files
local json = require "cozy.json"

-- The impersonated user is in system:masters, so that the real server's
-- RBAC lets it do what the admin token may.
local AS = {
  "    as: migrator-alice",
  "    as-uid: uid-42",
  "    as-groups: [system:masters, team-a]",
  "    as-user-extra:",
  "      acme.com/Scopes: [read, write]",
  "      reason: ['upgrade 1.2']",
}

describe("kubeconfig impersonation", function()
  local srv, dir
  setup(function() srv = fake.start { fixtures = { cli.fixture(1) }, tls = true, token = "tok-impersonation-1" } end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function()
    srv:reset { cli.fixture(1) }
    dir = cli.tmpdir()
  end)
  after_each(function() files.rm_rf(dir) end)

  -- srv's kubeconfig with `lines` added to its user (named USER)
  local USER
  local function kubeconfig(lines)
    local text = assert(files.read(srv.kubeconfig))
    USER = assert(text:match("\nusers:%s*\n%- name: ([^\n]+)"), text)
    local out, n = text:gsub("\n(    token: [^\n]*)", "\n%1\n" .. table.concat(lines, "\n"), 1)
    assert(n == 1, "the server's kubeconfig has no token line: " .. text)
    local path = dir .. "/kubeconfig"
    files.write(path, out)
    return path
  end

  -- The SelfSubjectReview's userInfo, asked through the engine's transport
  local function who(path)
    local r = cli.run { "lua", "-e", [[
      local json = require "cozy.json"
      local kube = require "cozy.kube"
      local c = kube.connect { kubeconfig = arg[1] }
      local res = c:resource("authentication.k8s.io/v1", "selfsubjectreviews", { namespaced = false })
        :create { apiVersion = "authentication.k8s.io/v1", kind = "SelfSubjectReview", metadata = {} }
      io.write(json.encode(res.status.userInfo))
    ]], path }
    assert.equal(0, r.code, r.stderr)
    return json.decode(r.stdout)
  end

  it("asks as the kubeconfig's `as`, with its uid, groups and extra (the key percent-encoded)", function()
    local info = who(kubeconfig(AS))
    assert.equal("migrator-alice", info.username)
    assert.equal("uid-42", info.uid)
    assert.same({ "system:masters", "team-a", "system:authenticated" }, info.groups)
    -- the server lowercases and unescapes the key client-go escaped
    assert.same({ ["acme.com/scopes"] = { "read", "write" }, reason = { "upgrade 1.2" } }, info.extra)
  end)

  it("stamp records the impersonated user in the history, not the base credentials'", function()
    local r = cli.run { "--kubeconfig", kubeconfig(AS), "--no-builtin", "stamp", "2",
      "--reason", "baseline" }
    assert.equal(0, r.code, r.stderr)
    local version, cm = cli.version(srv)
    assert.equal(2, version)
    local history = cli.history(cm)
    assert.equal("migrator-alice", history[#history].user)
    assert.matches("by migrator-alice", r.stdout, 1, true)
  end)

  it("every request of a run carries the headers: the steps', the lock thread's and the Events' #fakeonly", function()
    local mdir = cli.migration_dir { ["1-noop.lua"] = "return { description = 'noop', run = function() end }" }
    finally(function() files.rm_rf(mdir) end)
    srv:clear_requests()
    local r = cli.run { "--kubeconfig", kubeconfig(AS), "--no-builtin", "--migrations", mdir, "run" }
    assert.equal(0, r.code, r.stderr)
    local requests = srv:requests()
    assert.is_true(#requests >= 5)
    local paths = {}
    for _, e in ipairs(requests) do
      paths[e.path:match("^/apis?/[^/]+/?[^/]*/namespaces/[^/]+/([^/]+)") or e.path] = true
      assert.same({ user = "migrator-alice", uid = "uid-42", groups = { "system:masters", "team-a" },
        extra = { ["acme.com/scopes"] = { "read", "write" }, reason = { "upgrade 1.2" } } }, e.impersonate,
        e.method .. " " .. e.path)
    end
    assert.is_true(paths.leases and paths.configmaps and paths.events, json.encode(paths))
  end)

  it("gives a legacy script's kubectl the same impersonation", function()
    -- kubectl auth whoami's SelfSubjectReview, in JSON (the fake reads no protobuf)
    local mdir = cli.migration_dir { ["1-whoami"] = "#!/bin/sh\nset -e\n"
      .. "echo '{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}' >review.json\n"
      .. "kubectl create --raw /apis/authentication.k8s.io/v1/selfsubjectreviews -f review.json >\"$WHO_OUT\"\n"
      .. "kubectl config view --raw -o json >\"$CONFIG_OUT\"\n"
      .. "kubectl -n cozy-system patch configmap cozystack-version --type merge -p '{\"data\":{\"version\":\"2\"}}'\n" }
    finally(function() files.rm_rf(mdir) end)
    os.execute(("chmod +x '%s/1-whoami'"):format(mdir))
    local r = cli.run({ "--kubeconfig", kubeconfig(AS), "--no-builtin", "--migrations", mdir, "run" },
      { WHO_OUT = dir .. "/who.json", CONFIG_OUT = dir .. "/config.json", PATH = os.getenv("PATH") })
    assert.equal(0, r.code, r.stderr)
    local whoami = json.decode(assert(files.read(dir .. "/who.json")))
    assert.equal("migrator-alice", whoami.status.userInfo.username)
    assert.equal("uid-42", whoami.status.userInfo.uid)
    local user = json.decode(assert(files.read(dir .. "/config.json"))).users[1].user
    assert.equal("migrator-alice", user.as)
    assert.equal("uid-42", user["as-uid"])
    assert.same({ "system:masters", "team-a" }, user["as-groups"])
    assert.same({ ["acme.com/Scopes"] = { "read", "write" }, reason = { "upgrade 1.2" } }, user["as-user-extra"])
  end)

  it("refuses uid, groups or extra without `as`, as client-go does, and sends nothing", function()
    for _, lines in ipairs {
      { "    as-groups: [system:masters]" },
      { "    as-uid: uid-42" },
      { "    as-user-extra: {scopes: [read]}" },
    } do
      srv:clear_requests()
      local r = cli.run { "--kubeconfig", kubeconfig(lines), "--no-builtin", "--target", "2", "status" }
      assert.equal(2, r.code, r.stderr)
      assert.matches(("requesting uid, groups or user-extra for user \"%s\" without impersonating a user (set "
        .. "users[%s].user.as)"):format(USER, USER), r.stderr, 1, true)
      assert.same({}, srv:requests())
    end
  end)

  it("refuses a value that would inject a header, and one of the wrong shape", function()
    for _, case in ipairs {
      { { '    as: "alice\\r\\nX-Evil: 1"' }, "users[fake].user.as contains a control character" },
      { { "    as: alice", '    as-groups: ["a\\nX-Evil: 1"]' }, "users[fake].user.as-groups contains a control character" },
      { { "    as: alice", '    as-user-extra: {k: ["v\\r\\nX: 1"]}' }, "users[fake].user.as-user-extra.k contains a control" },
      { { "    as: alice", "    as-groups: team-a" }, "users[fake].user.as-groups must be a list of strings" },
      { { "    as: alice", "    as-user-extra: {k: v}" }, "users[fake].user.as-user-extra.k must be a list of strings" },
      { { "    as: alice", "    as-user-extra: [k]" }, "users[fake].user.as-user-extra must be a mapping" },
    } do
      srv:clear_requests()
      local r = cli.run { "--kubeconfig", kubeconfig(case[1]), "--no-builtin", "--target", "2", "status" }
      assert.equal(2, r.code, r.stderr)
      assert.matches((case[2]:gsub("%[fake%]", "[" .. USER .. "]")), r.stderr, 1, true)
      assert.same({}, srv:requests())
    end
  end)
end)
