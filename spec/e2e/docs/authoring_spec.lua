-- docs/authoring.md's examples run: the migration under "The file" and the
-- spec under "Test it with busted", as the guide prints them, in a temporary
-- tree with the harness, against a fixture of the objects they name. A guide
-- whose example no longer passes fails here.
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

  it("the migration and its spec pass as printed", function()
    local guide = assert(files.read(GUIDE))
    files.write(tree .. "/migrations/60-label-tenants.lua", example(guide, "The file"))
    files.write(tree .. "/spec/migrations/60-label-tenants_spec.lua", example(guide, "Test it with busted"))
    files.write(tree .. "/spec/fixtures/60-label-tenants/cluster.json", FIXTURE)
    local r = cli.busted_in(tree, "spec/migrations/60-label-tenants_spec.lua")
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("5 successes / 0 failures / 0 errors", r.stdout, 1, true)
  end)
end)
