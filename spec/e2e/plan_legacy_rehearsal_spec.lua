-- A legacy script in a rehearsal (docs/operations.md, "Rehearsals"): it runs
-- in a network namespace of its own whose only address is the engine's
-- overlay endpoint, so its kubectl sees the overlay, its writes are judged
-- by the server with dryRun=All and listed with the step's, its stamp
-- decides the next step as in a run, and it can reach nothing real.
-- Runs on both servers.
local fake = require "spec.support.fake"
local files = require "spec.helpers.files"
local harness = require "spec.helpers"
local json = require "cozy.json"
local support = require "spec.helpers.cli"

local DIR = "spec/fixtures/plan_legacy_rehearsal/"
local q = files.quote

-- the scripts' kubectl: the one the kubectl specs use, first in PATH
local KUBECTL_DIR = fake.kubectl_path:match("^(.*)/[^/]+$")
local PATH = (KUBECTL_DIR and (KUBECTL_DIR .. ":") or "") .. os.getenv("PATH")

local function fixture(version)
  return support.fixture(version or 1, {
    support.configmap("old", { original = "yes" }),
  })
end

-- every object's identity and resourceVersion: "nothing written" is that none changed, came or went
local function state(h)
  local out = {}
  for _, o in ipairs(h:objects()) do
    out[#out + 1] = ("%s %s/%s %s"):format(o.kind, o.metadata.namespace or "", o.metadata.name,
      o.metadata.resourceVersion)
  end
  table.sort(out)
  return out
end

local function events(stdout)
  local out = {}
  for _, line in ipairs(support.lines(stdout)) do out[#out + 1] = json.decode(line) end
  return out
end

local function of_type(evs, t)
  local out = {}
  for _, e in ipairs(evs) do if e.type == t then out[#out + 1] = e end end
  return out
end

local function plan(h, dir, env, ...)
  local e = { PATH = PATH }
  for k, v in pairs(env or {}) do e[k] = v end
  return h:cli(support.args(h.srv, dir, "plan", ...), e)
end

-- nothing stored: every request a read or a dryRun=All write, no object changed, came or went
local function nothing_written(h, before)
  for _, req in ipairs(h:requests()) do
    if req.method ~= "GET" then assert.equal("dryRun=All", req.query, req.method .. " " .. req.path) end
  end
  assert.same(before, state(h))
end

describe("plan rehearses a legacy script", function()
  local h = harness.fake { fixtures = { fixture() } }

  it("serves its kubectl from the overlay: its writes listed and judged, the next step sees them", function()
    local before = state(h)
    h:mark()
    local r = plan(h, DIR .. "writes", nil, "--log-format", "json")
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local evs = events(r.stdout)
    local legacy = of_type(evs, "legacy")[1]
    assert.is_true(legacy.rehearsal)
    local writes = {}
    for _, w in ipairs(of_type(evs, "write")) do
      assert.equal("admitted", w.verdict, json.encode(w))
      writes[#writes + 1] = ("%d %s %s"):format(w.step, w.method, w.path)
    end
    print(r.stdout, r.stderr)
    nothing_written(h, before)
  end)
end)
