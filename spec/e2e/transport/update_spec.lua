-- The conflict-aware update loop: a concurrent writer never loses its change
-- and ours is applied exactly once, after a re-read and a recompute. On the
-- fake and on the real server (COZY_SPEC_SERVER=real): the concurrent writer
-- is another client writing between the engine's read and its write, so the
-- conflict is the server's own answer; the cases that need a fault rule of the
-- fake (a 409 answer, a dropped connection) are tagged #fakeonly.
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local kube = require "cozy.kube"

local PATH = "/api/v1/namespaces/team%-a/configmaps/cm%-01$"
-- the User-Agent of the spec's own concurrent writes, left out of the trail
local WRITER = "spec-concurrent-writer"

describe("cozy.kube update", function()
  local srv, client, cms, captured
  transport_harness.fresh_server(function(s)
    srv = s
    captured = harness.capture_log(1)
    client = transport_harness.connect(srv, { log = captured.log })
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  -- the client's requests for cm-01 (the spec's concurrent writes left out)
  local function trail()
    local out = {}
    for _, e in ipairs(transport_harness.api_requests(srv, nil, PATH)) do
      if e.user_agent ~= WRITER then out[#out + 1] = e.method .. " " .. e.status end
    end
    return out
  end

  -- Another client's write of cm-01 (a merge patch); returns its status.
  local function write_concurrently(merge)
    return srv:request("PATCH", "/api/v1/namespaces/team-a/configmaps/cm-01", { body = merge,
      content_type = "application/merge-patch+json", headers = { ["User-Agent"] = WRITER } }).status
  end

  -- counts calls; appends "+1" to data.i, computed from the object it is given.
  -- concurrent(n), when given, is called on the n-th call, after the read
  -- and before the write: what another client does meanwhile.
  local function incrementer(calls, concurrent)
    return function(obj)
      calls[#calls + 1] = obj.metadata.resourceVersion
      if concurrent then concurrent(#calls) end
      return { { op = "replace", path = "/data/i", value = tostring(tonumber(obj.data.i) + 1) } }
    end
  end

  it("GETs, mutates and sends one test-guarded JSON patch", function()
    local calls = {}
    local obj, changed = cms:update("team-a", "cm-01", incrementer(calls))
    assert.is_true(changed)
    assert.equal("2", obj.data.i)
    assert.same({ "GET 200", "PATCH 200" }, trail())
    local patch = transport_harness.api_requests(srv, "PATCH", PATH)[1]
    assert.equal("application/json-patch+json", patch.content_type)
    local ops = transport_harness.fake.json.decode(patch.body)
    assert.same({ op = "test", path = "/metadata/resourceVersion", value = calls[1] }, ops[1])
  end)

  it("recomputes after a concurrent write, losing nothing and applying once", function()
    local wrote = {}
    local calls = {}
    local obj, changed = cms:update("team-a", "cm-01", incrementer(calls, function(n)
      if n == 1 then wrote[#wrote + 1] = write_concurrently { data = { i = "10", other = "theirs" } } end
    end))
    assert.is_true(changed)
    assert.equal(2, #calls)
    assert.are_not.equal(calls[1], calls[2])
    assert.equal("11", obj.data.i) -- computed from their value, not from the stale one
    local stored = transport_harness.object(srv, "team-a", "cm-01")
    assert.same({ i = "11", other = "theirs" }, stored.data)
    assert.same({ "GET 200", "PATCH 422", "GET 200", "PATCH 200" }, trail())
    assert.same({ 200 }, wrote)
    assert.equal(1, client.stats.conflicts)
    assert.equal(1, captured.count("debug", "conflict"))
  end)

  -- a real server answers the failed test of a stale resourceVersion with 422;
  -- a 409 to a JSON patch that does not set the resourceVersion is a fault's
  it("recomputes after a 409 Conflict #fakeonly", function()
    srv:faults { { method = "PATCH", path = "configmaps/cm-01", times = 1, status = { code = 409 } } }
    local calls = {}
    local obj = cms:update("team-a", "cm-01", incrementer(calls))
    assert.equal("2", obj.data.i)
    assert.same({ "GET 200", "PATCH 409", "GET 200", "PATCH 200" }, trail())
    assert.same({ "status" }, srv:fired())
    assert.equal(1, client.stats.conflicts)
  end)

  it("starts from an object already held: no GET unless it conflicts", function()
    local held
    for o in cms:list { namespace = "team-a" } do
      if o.metadata.name == "cm-01" then held = o end
    end
    srv:clear_requests()
    local obj = cms:update(held, incrementer({}))
    assert.equal("2", obj.data.i)
    assert.same({ "PATCH 200" }, trail())
  end)

  it("with a stale held object, costs one extra read", function()
    local held = cms:get("team-a", "cm-01")
    cms:merge_patch("team-a", "cm-01", { data = { i = "5" } })
    srv:clear_requests()
    local obj = cms:update(held, incrementer({}))
    assert.equal("6", obj.data.i)
    assert.same({ "PATCH 422", "GET 200", "PATCH 200" }, trail())
  end)

  it("returns obj, false and writes nothing when mutate returns nil or {}", function()
    local obj, changed = cms:update("team-a", "cm-01", function() return nil end)
    assert.is_false(changed)
    assert.equal("1", obj.data.i)
    local _, changed2 = cms:update("team-a", "cm-01", function() return {} end)
    assert.is_false(changed2)
    assert.equal(0, #transport_harness.api_requests(srv, "PATCH"))
  end)

  it("raises mutate's own failing test without looping", function()
    local ok, err = pcall(cms.update, cms, "team-a", "cm-01", function()
      return { { op = "test", path = "/data/i", value = "999" } }
    end)
    assert.is_false(ok)
    assert.equal(422, err.code)
    assert.equal(0, client.stats.conflicts)
    assert.same({ "GET 200", "PATCH 422", "GET 200" }, trail())
  end)

  it("gives up after the bounded number of attempts with a Conflict", function()
    client:close()
    client = transport_harness.connect(srv, { log = captured.log, update = { max_attempts = 3, base_delay = 0.001 } })
    cms = client:resource("v1", "configmaps")
    -- another client writes between every read and write of ours
    local wrote = {}
    local ok, err = pcall(cms.update, cms, "team-a", "cm-01", incrementer({}, function(n)
      wrote[#wrote + 1] = write_concurrently { metadata = { annotations = { bumped = tostring(n) } } }
    end))
    assert.is_false(ok)
    assert.is_true(kube.is_error(err))
    assert.equal(422, err.code)
    assert.matches("gave up after 3", err.message)
    assert.equal(3, client.stats.conflicts)
    assert.same({ "GET 200", "PATCH 422", "GET 200", "PATCH 422", "GET 200", "PATCH 422", "GET 200" }, trail())
    assert.same({ 200, 200, 200 }, wrote)
    assert.equal("1", transport_harness.object(srv, "team-a", "cm-01").data.i)
  end)

  it("raises NotFound for an absent object", function()
    local ok, err = pcall(cms.update, cms, "team-a", "ghost", incrementer({}))
    assert.is_false(ok)
    assert.equal("object", err.absent)
  end)

  it("a reset test-guarded update is retried and applied once #fakeonly", function()
    srv:faults { { method = "PATCH", path = "configmaps/cm-01", times = 1, reset = true } }
    local obj, changed = cms:update("team-a", "cm-01", incrementer({}))
    assert.is_true(changed)
    assert.equal("2", obj.data.i)
    assert.equal("2", transport_harness.object(srv, "team-a", "cm-01").data.i)
    assert.same({ "GET 200", "PATCH 0", "PATCH 200" }, trail())
    assert.same({ "reset" }, srv:fired())
  end)
end)
