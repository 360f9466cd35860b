-- docs/engine-api.md's examples run as printed: each ```lua block under the
-- sections below, in a migration's sandbox (sandbox.env), so that what the
-- guide shows is both true and reachable from a migration; the migration
-- under "Resources by kubectl name" runs against a server (the fake, or the
-- real one with COZY_SPEC_SERVER=real). An example whose assert no longer
-- holds fails here.
local cli = require("spec.helpers").cli
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
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

  for _, heading in ipairs { "### Labels and annotations", "### Matching names", "### Base64: a Secret's data" } do
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

  -- The Recipes example (a cozy.recipe delete), in run mode twice: the object
  -- goes, its sibling stays, then there is nothing to do; a CRD not served and
  -- a short name are answers too, the first logged, the second refused at load.
  describe("Recipes", function()
    local function cm(name)
      return { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, namespace = "tenant-a" }, data = { a = "1" } }
    end
    local function load(source)
      local dir = cli.migration_dir { ["1-example.lua"] = source }
      local ok, m = pcall(runner.load_file, dir .. "/1-example.lua")
      files.rm_rf(dir)
      return ok, m
    end

    it("the delete runs as printed: present, deleted; then absent, nothing to do", function()
      local srv <close> = fake.start { tls = true, token = "t", fixtures = { {
        { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
        { apiVersion = "v1", kind = "Namespace", metadata = { name = "tenant-a" } },
        cm("old-settings"), cm("settings"),
      } } }
      local ok, m = load(example(doc, "### Recipes: a whole migration from a description"))
      assert(ok, tostring(m))
      assert.same({ { verb = "get", group = "", resource = "configmaps", namespace = "tenant-a" },
        { verb = "delete", group = "", resource = "configmaps", namespace = "tenant-a" } }, m.definition.permissions)
      local first = harness.capture_log()
      runner.run_migration(m, { kubeconfig = srv.kubeconfig, mode = "run", log = first.log })
      assert.equal(1, first.count("info", "^Deleting ConfigMap tenant%-a/old%-settings$"))
      assert.is_nil(srv:object("ConfigMap", "tenant-a", "old-settings"))
      assert.is_not_nil(srv:object("ConfigMap", "tenant-a", "settings"))
      local again = harness.capture_log()
      runner.run_migration(m, { kubeconfig = srv.kubeconfig, mode = "run", log = again.log })
      assert.equal(1, again.count("info", "ConfigMap tenant%-a/old%-settings absent: nothing to delete"))
    end)

    it("a CRD the server does not serve is nothing to delete, logged", function()
      local srv <close> = fake.start { tls = true, token = "t", fixtures = { {
        { apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-system" } },
      } } }
      local ok, m = load([[return require("cozy.recipe").delete { "backups.velero.io", namespace = "velero",
        name = "b", description = "x" }]])
      assert(ok, tostring(m))
      local captured = harness.capture_log()
      runner.run_migration(m, { kubeconfig = srv.kubeconfig, mode = "run", log = captured.log })
      assert.equal(1, captured.count("info", 'backups.velero.io: API group "velero.io" is not served: nothing to delete'))
    end)

    for _, name in ipairs { "pvc", "deployments.v1.apps", "Deployment" } do
      it(("refuses %q when the file loads, naming the form to use"):format(name), function()
        local ok, err = load(([[return require("cozy.recipe").delete { %q, namespace = "a", name = "b",
          description = "x" }]]):format(name))
        assert.is_false(ok)
        assert.equal("invalid", err.kind)
        assert.matches(('cozy.recipe: resource "%s"'):format(name), err.message, 1, true)
      end)
    end
  end)
end)
