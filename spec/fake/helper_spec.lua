-- The Lua helper itself: every e2e spec of the project leans on it.
local fake = require("spec.helpers").server

local BASIC = "spec/fixtures/fake/basic.json"

local alive = fake.running   -- a reaped-or-zombie process counts as stopped

local function exists(path)
  return os.execute("test -e '" .. path .. "'") == true
end

describe("spec.support.fake", function()
  it("starts a plain server with a usable kubeconfig and stops it, twice safely", function()
    local srv = fake.start{ fixtures = { BASIC } }
    finally(function() srv:stop() end)
    assert.truthy(srv.url:match("^http://127%.0%.0%.1:%d+$"))
    assert.is_nil(srv.ca)
    local kc = io.open(srv.kubeconfig):read("a")
    assert.truthy(kc:find('server: "' .. srv.url .. '"', 1, true))
    assert.is_nil(kc:find("token", 1, true))
    assert.is_nil(kc:find("certificate-authority-data", 1, true))
    local res = srv:kubectl("get", "cm", "-n", "cozy-system", "-o", "name")
    assert.equal("configmap/cozystack-version\n", res.stdout)
    local pid, dir = srv.pid, srv.dir
    assert.is_true(alive(pid))
    srv:stop()
    assert.is_false(alive(pid))
    assert.is_false(exists(dir))
    srv:stop()
  end)

  it("accepts fixtures given as Lua tables", function()
    local srv = fake.start{ fixtures = {
      { { apiVersion = "v1", kind = "Namespace", metadata = { name = "t" } },
        { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "c", namespace = "t" }, data = { a = "b" } } },
    } }
    finally(function() srv:stop() end)
    assert.same({ a = "b" }, srv:object("ConfigMap", "t", "c").data)
    assert.is_not_nil(srv:object("Namespace", nil, "t"))
    srv:reset{ { apiVersion = "v1", kind = "Namespace", metadata = { name = "u" } } }
    assert.is_nil(srv:object("Namespace", nil, "t"))
    assert.is_not_nil(srv:object("Namespace", nil, "u"))
  end)

  it("raises with the server's stderr when the server cannot start", function()
    local ok, err = pcall(fake.start, { fixtures = { { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "orphan", namespace = "default" } } } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown type kubevirt.io/v1 VirtualMachine", 1, true), err)
  end)

  it("stops a server bound with <close> when the scope ends", function()
    local pid
    do
      local srv <close> = fake.start{}
      pid = srv.pid
      assert.is_true(alive(pid))
    end
    assert.is_false(alive(pid))
  end)

  it("raises when a control call fails", function()
    local srv = fake.start{}
    finally(function() srv:stop() end)
    assert.error_matches(function() srv:faults("not json") end,
      "fake: POST /_fake/faults answered 400: fault rules must be a JSON array of rules or one rule object", nil, true)
    assert.has_error(function() srv:faults { { method = "GET", path = "x" } } end,
      "fake: POST /_fake/faults answered 400: fault rule 0 of this request: no action: give one of "
      .. "status, reset, bump, delete, respond, continue, rotate_token (or delay_ms, await); no rule of it was added ")
    assert.same({}, srv:control("GET", "/_fake/faults"))
  end)
end)
