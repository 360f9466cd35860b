-- Dry runs: "server" sends every write with dryRun=All (nothing stored);
-- "client" sends no write at all, records it and returns the local result.
local transport_harness = require("spec.helpers").transport
local json = require "cozy.json"

describe("cozy.kube dry runs", function()
  local srv
  setup(function() srv = transport_harness.start() end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function()
    srv:reset { transport_harness.FIXTURE }
    if not srv.real then srv:clear_faults() end
    srv:clear_requests()
  end)

  local function writes()
    local out = {}
    for _, e in ipairs(srv:requests()) do
      if e.method ~= "GET" and not tostring(e.path):find("^/_fake") then out[#out + 1] = e end
    end
    return out
  end

  local function exercise(cms)
    local created = cms:create { metadata = { name = "dry", namespace = "team-a" }, data = { a = "1" } }
    local merged = cms:merge_patch("team-a", "cm-01", { data = { i = json.null, m = "x" } })
    local patched = cms:json_patch("team-a", "cm-02", { { op = "add", path = "/data/j", value = "y" } })
    local updated, changed = cms:update("team-a", "cm-03", function(o)
      return { { op = "replace", path = "/data/i", value = o.data.i .. "0" } }
    end)
    cms:delete("team-a", "cm-04")
    return created, merged, patched, updated, changed
  end

  it("server: every write carries dryRun=All and nothing changes", function()
    local before = srv:objects()
    local shown = {}
    local c = transport_harness.connect(srv, { dry_run = "server", record = function(w) shown[#shown + 1] = w end })
    local created, merged, patched, updated, changed = exercise(c:resource("v1", "configmaps"))
    assert.equal("1", created.data.a)
    assert.same({ m = "x" }, merged.data)
    assert.equal("y", patched.data.j)
    assert.is_true(changed)
    assert.equal("30", updated.data.i)
    local w = writes()
    assert.equal(5, #w)
    for _, e in ipairs(w) do assert.matches("dryRun=All", e.query, nil, true) end
    -- each write is also handed to `record` on its way out, as sent
    assert.equal(#w, #shown)
    for i, e in ipairs(w) do
      assert.equal(e.method, shown[i].method)
      assert.equal("All", shown[i].query.dryRun)
    end
    assert.equal("application/json-patch+json", shown[4].content_type)
    assert.equal("test", shown[4].body[1].op)
    assert.equal(0, c.stats.recorded) -- recorded counts only the writes a client dry run keeps back
    assert.same(before, srv:objects())
    c:close()
  end)

  it("client: no write is sent; each is recorded; local results are returned", function()
    local recorded = {}
    local c = transport_harness.connect(srv, { dry_run = "client", record = function(w) recorded[#recorded + 1] = w end })
    local created, merged, patched, updated, changed = exercise(c:resource("v1", "configmaps"))
    assert.equal(0, #writes())
    assert.equal("1", created.data.a)
    assert.same({ m = "x" }, merged.data)
    assert.same({ i = "2", j = "y" }, patched.data)
    assert.is_true(changed)
    assert.equal("30", updated.data.i)
    assert.equal(5, #recorded)
    assert.equal(5, c.stats.recorded)
    assert.equal(0, c.stats.writes)
    local methods = {}
    for i, w in ipairs(recorded) do methods[i] = w.method .. " " .. w.path end
    assert.same({
      "POST /api/v1/namespaces/team-a/configmaps",
      "PATCH /api/v1/namespaces/team-a/configmaps/cm-01",
      "PATCH /api/v1/namespaces/team-a/configmaps/cm-02",
      "PATCH /api/v1/namespaces/team-a/configmaps/cm-03",
      "DELETE /api/v1/namespaces/team-a/configmaps/cm-04",
    }, methods)
    assert.equal("application/json-patch+json", recorded[4].content_type)
    assert.equal("test", recorded[4].body[1].op)
    assert.equal("application/merge-patch+json", recorded[2].content_type)
    assert.equal("1", srv:object("ConfigMap", "team-a", "cm-01").data.i)
    c:close()
  end)

  it("client: a delete or patch of an absent object still raises", function()
    local c = transport_harness.connect(srv, { dry_run = "client", record = function() end })
    local cms = c:resource("v1", "configmaps")
    local ok, err = pcall(cms.delete, cms, "team-a", "ghost")
    assert.is_false(ok)
    assert.equal("object", err.absent)
    local ok2, err2 = pcall(cms.json_patch, cms, "team-a", "cm-01", { { op = "remove", path = "/data/nope" } })
    assert.is_false(ok2)
    assert.equal(422, err2.code)
    c:close()
  end)
end)
