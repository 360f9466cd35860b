-- docs/engine-api.md's examples run as printed: each ```lua block under the
-- sections below, in a migration's sandbox (sandbox.env), so that what the
-- guide shows is both true and reachable from a migration; the migration
-- under "Resources by kubectl name" runs against a server (the fake, or the
-- real one with COZY_SPEC_SERVER=real). An example whose assert no longer
-- holds fails here.
local cli = require "spec.helpers.cli"
local fake = require "spec.support.fake"
local files = require "spec.helpers.files"
local harness = require "spec.helpers"
local runner = require "cozy.runner"
local sandbox = require "cozy.sandbox"

local DOC = "docs/engine-api.md"

-- The first ```lua block after the heading line `heading`.
local function example(text, heading)
  local at = assert(text:find("\n" .. heading .. "\n", 1, true), "no section " .. heading)
  return assert(text:match("```lua\n(.-)```", at), "no lua example under " .. heading)
end

local function pvc(name)
  return { apiVersion = "v1", kind = "PersistentVolumeClaim", metadata = { name = name, namespace = "tenant-a" },
           spec = { accessModes = { "ReadWriteOnce" }, resources = { requests = { storage = "1Gi" } } } }
end

describe("docs/engine-api.md's examples", function()
  local doc = assert(files.read(DOC))

  for _, heading in ipairs { "### Labels and annotations", "### Matching names" } do
    it(heading:sub(5) .. " runs in a migration's sandbox as printed", function()
      local code = example(doc, heading)
      local chunk = assert(load(code, "=" .. heading, "t", sandbox.env()))
      chunk()
    end)
  end

  it("Resources by kubectl name: the migration runs as printed and labels only the PVCs it names", function()
    local srv <close> = fake.start { tls = true, token = "t", fixtures = { {
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
      { apiVersion = "v1", kind = "Namespace", metadata = { name = "tenant-a" } },
      pvc("data-0"), pvc("vmstorage-1"), pvc("other-0"),
    } } }
    local dir = cli.migration_dir { ["1-example.lua"] = example(doc, "### Resources by kubectl name") }
    local m = runner.load_file(dir .. "/1-example.lua")
    files.rm_rf(dir)
    local captured = harness.capture_log()
    runner.run_migration(m, { kubeconfig = srv.kubeconfig, mode = "run", log = captured.log })
    local label = "apps.cozystack.io/application.name"
    local function labels(name) return srv:object("PersistentVolumeClaim", "tenant-a", name).metadata.labels or {} end
    assert.equal("tenant-a", labels("data-0")[label])
    assert.equal("tenant-a", labels("vmstorage-1")[label])
    assert.is_nil(labels("other-0")[label])
    assert.equal(1, captured.count("info", 'no Velero: API group "velero.io" is not served'))
  end)
end)
