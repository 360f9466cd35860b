-- `plan` rehearses the pending range over an overlay of the live cluster:
-- each step sees what the earlier ones wrote, every write is judged by the
-- server with dryRun=All, nothing is written (docs/operations.md,
-- "Rehearsals"). Runs on both servers.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local DIR = "spec/fixtures/plan_rehearsal/"

local function fixture()
  return cli.fixture(1, {
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "old", namespace = "cozy-system" },
      data = { original = "yes" } },
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "other", namespace = "cozy-system",
      labels = { app = "else" } }, data = { original = "yes" } },
  })
end

describe("plan rehearses the pending range", function()
  local h = harness.fake { fixtures = { fixture() } }

  it("shows step 2 what step 1 created, deleted and re-created, and writes nothing", function()
    local before = cli.stored_versions(h)
    h:mark()
    local r = h:cli(cli.args(h.srv, DIR .. "range", "plan", "--log-format", "json"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local evs = cli.json_lines(r.stdout)
    -- step 2 found both objects step 1 made (the new namespace's and the re-created one) by their label
    local writes = cli.of_type(evs, "write")
    local labelled = {}
    for _, w in ipairs(writes) do
      assert.equal("admitted", w.verdict, json.encode(w))
      if w.step == 2 and w.path:match("configmaps/[^/]+$") and not w.path:match("cozystack%-version") then
        labelled[#labelled + 1] = w.path
      end
    end
    table.sort(labelled)
    assert.same({ "/api/v1/namespaces/cozy-system/configmaps/old",
      "/api/v1/namespaces/rehearsal-made/configmaps/made" }, labelled)
    local rehearsed = cli.of_type(evs, "rehearsed")
    assert.equal(2, #rehearsed)
    -- the configmap of a namespace only the rehearsal holds is validated in a stand-in namespace: said so
    assert.is_false(rehearsed[1].exact)
    assert.matches("validated in namespace cozy%-system", rehearsed[1].why[1])
    local summary = cli.of_type(evs, "summary")[1]
    assert.same({ steps_exact = 0, steps_inexact = 2, steps_not_rehearsed = 0, writes_admitted = #writes,
      writes_refused = 0, writes_not_validated = 0, created = 2, changed = 2, deleted = 0 }, summary.rehearsal)
    -- nothing written: every request a read or a dryRun=All write, no object changed, came or went
    for _, req in ipairs(h:requests()) do
      if req.method ~= "GET" then assert.equal("dryRun=All", req.query, req.method .. " " .. req.path) end
    end
    assert.same(before, cli.stored_versions(h))
  end)

  it("stamps each step in the overlay: step 2's stamp tests the version step 1's stamp made", function()
    local r = h:cli(cli.args(h.srv, DIR .. "range", "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("rehearsal: steps 0 exact, 2 inexact, 0 not rehearsed; writes %d+ admitted, 0 refused, "
      .. "0 not validated; objects 2 created, 2 changed, 0 deleted", r.stdout)
    -- the second stamp is applied to the first one's result and validated as a PUT of it
    assert.matches('"value":"rehearsal%-%d+"', r.stdout)
    assert.matches("validated as PUT /api/v1/namespaces/cozy%-system/configmaps/cozystack%-version", r.stdout)
    assert.equal(1, (cli.version(h.srv)))
  end)

  it("fails a JSON patch whose test names a resourceVersion an earlier write replaced", function()
    local r = h:cli(cli.args(h.srv, DIR .. "stale", "plan"))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 %(1%-stale%) would fail: PATCH [^\n]*configmaps/old[^\n]*Invalid %(422%)", r.stdout)
    assert.matches("refused by the server: the server rejected our request due to an error in our request "
      .. "%(judged on the rehearsal's version%)", r.stdout)
    assert.matches("writes 1 admitted, 1 refused", r.stdout)
  end)

  it("exits 1 naming the step and the server's message when the server refuses a write", function()
    local before = cli.stored_versions(h)
    local r = h:cli(cli.args(h.srv, DIR .. "refused", "plan"))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 %(1%-refused%) would fail: POST /api/v1/namespaces/cozy%-system/configmaps%?dryRun=All: "
      .. "Invalid %(422%)", r.stdout)
    assert.matches("\n    refused by the server: [^\n]+", r.stdout)
    assert.matches("step 2: 2%-after %(lua%): not rehearsed: step 1%-refused would fail", r.stdout)
    assert.matches("steps 0 exact, 0 inexact, 1 not rehearsed; writes 0 admitted, 1 refused", r.stdout)
    assert.same(before, cli.stored_versions(h))
  end)

  it("exits 1 naming the server's refusal of a fault rule #fakeonly", function()
    h:faults { { method = "POST", path = "^/api/v1/namespaces\\?dryRun=All$", status = { code = 422,
      reason = "Invalid", message = "denied by policy no-made" } } }
    local r = h:cli(cli.args(h.srv, DIR .. "range", "plan"))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    assert.matches("step 1 %(1%-create%) would fail: [^\n]*denied by policy no%-made", r.stdout)
    assert.matches("step 2: 2%-label %(lua%): not rehearsed", r.stdout)
  end)

  it("applies a write the credentials may not dry-run locally, said not validated #fakeonly", function()
    h:deny { { verb = "patch", group = "", resource = "configmaps" } }
    local r = h:cli(cli.args(h.srv, DIR .. "stale", "plan"))
    -- the first patch is applied here, and so the stale test fails as in the run
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("not validated by the server: the dry%-run write was refused %(403%)", r.stdout)
    assert.matches("writes 0 admitted, 1 refused, 1 not validated", r.stdout)
  end)
end)
