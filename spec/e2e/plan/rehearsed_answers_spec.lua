-- A rehearsed write's answer (cozy.kube.rehearsal, take): it comes as
-- text, which the overlay keeps as it came where the overlay holds nothing
-- of the object yet, and is decoded for the step with the step's own
-- projection. The step gets exactly what a run's answer would give it;
-- the overlay answers later reads with the whole object under its own
-- resourceVersion, and selects on labels the step never asked for. An
-- answer that is not JSON is an InvalidResponse, as a run's is. Runs on
-- both servers.
local transport_harness = require("spec.helpers").transport
local json = require "cozy.json"
local kube = require "cozy.kube"
local projection = require "cozy.kube.projection"

describe("a rehearsed write's answer", function()
  local srv, client, cms
  transport_harness.fresh_server(function(s)
    srv = s
    client = transport_harness.connect(srv, { dry_run = "rehearse" })
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  local LEAN = projection.new { "data.i" }

  -- cm-00 (labels fleet=yes, parity=even) given data.added, its answer decoded with LEAN
  local function patch_lean()
    local live = cms:get("team-a", "cm-00")
    return cms:_json_patch("team-a", "cm-00", {
      { op = "test", path = "/metadata/resourceVersion", value = live.metadata.resourceVersion },
      { op = "add", path = "/data/added", value = "yes" } }, nil, LEAN), live
  end

  it("gives the step its projection only, and the overlay the whole object", function()
    local answer, live = patch_lean()
    -- what a run's answer gives: the projection, no more (labels and data.added left out)
    assert.same({ i = "0" }, setmetatable(answer.data, nil))
    assert.is_nil(answer.metadata.labels)
    assert.equal("cm-00", answer.metadata.name)
    -- the overlay's version: its own resourceVersion, in the answer and in a later read
    local rv = answer.metadata.resourceVersion
    assert.matches("^rehearsal%-%d+$", rv)
    local read = cms:get("team-a", "cm-00")
    assert.equal(rv, read.metadata.resourceVersion)
    assert.same({ i = "0", added = "yes" }, setmetatable(read.data, nil))
    assert.same({ fleet = "yes", parity = "even" }, setmetatable(read.metadata.labels, nil))
    -- a test of the live version the write replaced fails, as in a run (a failed JSON patch op)
    local ok, err = pcall(cms._json_patch, cms, "team-a", "cm-00", {
      { op = "test", path = "/metadata/resourceVersion", value = live.metadata.resourceVersion },
      { op = "add", path = "/data/again", value = "no" } })
    assert.is_false(ok)
    assert.is_true(kube.is_error(err), tostring(err))
    assert.equal(422, err.code)
    -- nothing stored: the live server still holds the object as it was
    assert.is_nil(transport_harness.object(srv, "team-a", "cm-00").data.added)
  end)

  it("is listed by the labels the step never asked for, with what the write changed", function()
    patch_lean()
    local found = {}
    for cm in cms:list { namespace = "team-a", label_selector = "parity=even" } do
      found[cm.metadata.name] = cm.data.added or "no"
    end
    assert.equal("yes", found["cm-00"])
    assert.equal("no", found["cm-02"])
  end)

  it("is an InvalidResponse when it is not JSON, and nothing enters the overlay #fakeonly", function()
    srv:faults { { method = "PATCH", path = "configmaps/cm-00", respond = { body = "ok" } } }
    local ok, err = pcall(patch_lean)
    assert.is_false(ok)
    assert.is_true(kube.is_error(err), tostring(err))
    assert.equal("InvalidResponse", err.reason)
    assert.equal(200, err.code)
    assert.matches("the server's answer is not JSON: cozy.json: ", err.message, 1, true)
    assert.same({ "respond" }, srv:fired())
    assert.is_nil(cms:get("team-a", "cm-00").data.added)
    assert.is_nil(next(client.rehearsal.overlay._entries))
  end)

  it("decodes whole for a step that asked for the whole object", function()
    local live = cms:get("team-a", "cm-01")
    local answer = cms:_json_patch("team-a", "cm-01", {
      { op = "test", path = "/metadata/resourceVersion", value = live.metadata.resourceVersion },
      { op = "add", path = "/data/added", value = "yes" } })
    assert.same({ fleet = "yes", parity = "odd" }, setmetatable(answer.metadata.labels, nil))
    assert.equal(json.encode(answer), json.encode(cms:get("team-a", "cm-01")))
  end)
end)
