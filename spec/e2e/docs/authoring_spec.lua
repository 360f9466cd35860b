-- docs/authoring.md's examples run: the migration under "The file" and the
-- spec under "Test it with busted", as the guide prints them, in a temporary
-- tree with the harness, against a fixture of the objects they name; the
-- migration under "Waiting, parameters and files" by `cozy-migrate run` and
-- `plan`, on either server (COZY_SPEC_SERVER=real). A guide whose example no
-- longer passes fails here.
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local GUIDE = "docs/authoring.md"


-- The first ```lua block after the heading `heading`.
local function example(text, heading)
  local at = assert(text:find("\n## " .. heading .. "\n", 1, true), "no section " .. heading)
  local code = text:match("```lua\n(.-)```", at)
  return assert(code, "no lua example under " .. heading)
end

local FIXTURE = [[
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cozy-system"}},
  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-a", "labels": {"tenant": "a"}}},
  {"apiVersion": "v1", "kind": "Namespace",
   "metadata": {"name": "tenant-b", "labels": {"tenant": "b", "tier": "gold"}}},
  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}
]}
]]

describe("docs/authoring.md's examples", function()
  local tree
  before_each(function()
    tree = cli.spec_tree()
    assert.equal(0, files.sh("mkdir -p " .. files.quote(tree .. "/spec/fixtures/60-label-tenants")))
  end)
  after_each(function() files.rm_rf(tree) end)

  -- the guide's spec plays fake faults and allow-lists: the fake's alone
  it("the migration and its spec pass as printed #fakeonly", function()
    local guide = assert(files.read(GUIDE))
    files.write(tree .. "/migrations/60-label-tenants.lua", example(guide, "The file"))
    files.write(tree .. "/spec/migrations/60-label-tenants_spec.lua", example(guide, "Test it with busted"))
    files.write(tree .. "/spec/fixtures/60-label-tenants/cluster.json", FIXTURE)
    local r = cli.busted_in(tree, "spec/migrations/60-label-tenants_spec.lua")
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("5 successes / 0 failures / 0 errors", r.stdout, 1, true)
  end)
end)

describe("docs/authoring.md's waiting, parameters and files example", function()
  local fake = require("spec.helpers").server
  local json = require "cozy.json"
  local srv, crds
  setup(function()
    srv = fake.start { fixtures = {}, tls = true, token = "t" }
    crds = files.tmpdir("cozy-doc-crds")
    files.write(crds .. "/widgets.json", json.encode {
      apiVersion = "apiextensions.k8s.io/v1", kind = "CustomResourceDefinition",
      metadata = { name = "widgets.example.cozystack.io" },
      spec = { group = "example.cozystack.io", scope = "Namespaced",
        names = { plural = "widgets", singular = "widget", kind = "Widget", listKind = "WidgetList" },
        versions = { { name = "v1", served = true, storage = true,
          schema = { openAPIV3Schema = { type = "object", ["x-kubernetes-preserve-unknown-fields"] = true } } } } } })
  end)
  teardown(function()
    srv:stop()
    files.rm_rf(crds)
  end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function run(...)
    local dir = cli.migration_dir { ["1-example-crds.lua"] = example(assert(files.read(GUIDE)),
      "Waiting, parameters and files") }
    finally(function() files.rm_rf(dir) end)
    return cli.run(cli.args(srv, dir, ...), { EXAMPLE_CRD_DIR = crds })
  end

  it("applies the directory's CRD and waits until the API server establishes it", function()
    local r = run("run")
    assert.equal(0, r.code, r.stderr)
    assert.matches("widgets.example.cozystack.io: created", r.stderr, 1, true)
    assert.matches("waited [%d.]+s for CustomResourceDefinition widgets%.example%.cozystack%.io "
      .. "condition Established=True", r.stderr)
    assert.truthy(srv:object("CustomResourceDefinition", nil, "widgets.example.cozystack.io"))
    assert.equal(2, cli.version(srv))
  end)

  it("in a plan, reads the new CRD once: established in the server's dry-run answer, or marked as a "
    .. "controller's work", function()
    local r = run("plan", "-o", "json")
    assert.equal(0, r.code, r.stderr)
    local rehearsed = json.decode(r.stdout).steps[1].rehearsed
    -- the fake's dry-run create answers an established CRD; kube-apiserver's
    -- has no status yet, which only its controller adds
    if rehearsed.exact then
      assert.matches("wait for CustomResourceDefinition widgets.example.cozystack.io condition Established=True: "
        .. "met already", r.stderr, 1, true)
    else
      assert.same({ "waited on a controller's work: CustomResourceDefinition widgets.example.cozystack.io "
        .. "condition Established=True (no condition Established yet)" }, rehearsed.why)
    end
    for _, e in ipairs(srv:requests { method = "GET", path = "customresourcedefinitions" }) do
      assert.not_matches("watch=true", tostring(e.query), 1, true)
    end
    assert.is_nil(srv:object("CustomResourceDefinition", nil, "widgets.example.cozystack.io"))
  end)
end)
