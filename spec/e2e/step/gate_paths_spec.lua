-- The gate judges a path as the API server routes it (decoded, then split),
-- and refuses a path it cannot judge before it is sent. (The rest of the
-- boundary: output/credentials_spec.lua, sandbox/string_dump_and_error_kinds_spec.lua.)
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local cli = require("spec.helpers").cli

local function run_migration(srv, source, ...)
  local dir = cli.migration_dir { ["1-hostile.lua"] = source }
  local r = cli.run(cli.args(srv, dir, "run", ...))
  files.rm_rf(dir)
  return r
end

-- A migration allowed to get and patch namespaces only, sending `path`.
local function namespace_patcher(path)
  return ([[
return {
  description = "may patch namespaces, nothing else",
  permissions = {
    { verb = "get", group = "", resource = "namespaces" },
    { verb = "patch", group = "", resource = "namespaces" },
  },
  run = function(ctx)
    ctx.kube:call("PATCH", %q, { body = { data = { version = "999" } },
      content_type = "application/merge-patch+json" })
  end,
}
]]):format(path)
end

describe("the gate reads a path as the API server routes it", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)); srv:clear_requests() end)

  local function refused(path, why)
    local r = run_migration(srv, namespace_patcher(path))
    assert.equal(1, r.code, r.stderr)
    assert.matches(why, r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
    -- the one write to the stamp ConfigMap is the engine's own failure record
    -- (after the refusal); the migration's patch (version 999) never leaves
    for _, w in ipairs(cli.writes(srv)) do
      assert.not_matches('"999"', w.body or "", 1, true)
    end
    local _, cm = cli.version(srv)
    local failed = 0
    for _, rec in ipairs(cli.history(cm)) do failed = failed + (rec.result == "failed" and 1 or 0) end
    assert.equal(1, failed, "the failure record")
  end

  it("%2F is a separator there: a namespace patch that routes to the stamp ConfigMap is denied", function()
    refused("/api/v1/namespaces/cozy-system%2Fconfigmaps%2Fcozystack-version",
      'which its permissions do not declare; declare { verb = "patch", group = "", resource = "configmaps" }')
  end)

  it("%2f in lower case the same", function()
    refused("/api/v1/namespaces/cozy-system%2fconfigmaps%2fcozystack-version",
      'declare { verb = "patch", group = "", resource = "configmaps" }')
  end)

  it("a '..' segment, plain or escaped, cannot be judged and is refused before it is sent", function()
    refused("/api/v1/namespaces/x/../cozy-system/configmaps/cozystack-version",
      "which cannot be judged as the API server routes it (an empty, '.' or '..' segment); nothing was sent")
    refused("/api/v1/namespaces/x/%2e%2e/cozy-system/configmaps/cozystack-version",
      "(an empty, '.' or '..' segment)")
  end)

  it("a malformed escape or an encoded '?' is refused too", function()
    refused("/api/v1/namespaces/cozy-system%zz", "(a malformed percent-escape)")
    refused("/api/v1/namespaces/cozy-system%3Fx=1", "(a control character, space, '#' or '?' in the path)")
  end)

  it("a path it can judge still goes through: the namespace patch itself", function()
    local r = run_migration(srv, namespace_patcher("/api/v1/namespaces/cozy-system"))
    assert.equal(0, r.code, r.stderr)
    assert.equal(2, cli.version(srv))
  end)
end)
