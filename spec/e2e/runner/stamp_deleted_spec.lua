-- The stamp cannot be lost: a ConfigMap deleted where a Lease shows
-- migrations have run is an error for an operator, never a fresh install.
-- What a step reports for the history: runner/history_record_spec.lua.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local NOOP = [[return { description = "step %d", run = function(ctx) end }]]

describe("a stamp ConfigMap deleted during a run", function()
  local srv, dir
  setup(function()
    srv = fake.start { fixtures = {} }
    -- 1 -> 4; step 2 deletes the stamp, as an operator or a stray script would
    dir = cli.migration_dir {
      ["1-one.lua"] = NOOP:format(1),
      ["2-deletes-the-stamp.lua"] = [[
return { description = "deletes the stamp",
  permissions = { { verb = "delete", group = "", resource = "configmaps" } },
  run = function(ctx) ctx.kube:resource("v1", "configmaps"):delete("cozy-system", "cozystack-version") end }
]],
      ["3-three.lua"] = NOOP:format(3),
    }
  end)
  teardown(function() srv:stop(); files.rm_rf(dir) end)

  it("fails that run naming the ConfigMap, and every rerun refuses to bootstrap over it", function()
    srv:reset(cli.fixture(1))
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(1, r.code, r.stderr)
    assert.matches("the version ConfigMap cozy-system/cozystack-version was deleted during the run (it was at version 2)",
      r.stderr, 1, true)
    assert.equal("", cli.lease_holder(srv))
    for _, command in ipairs({ "run", "plan" }) do
      local again = cli.run(cli.args(srv, dir, command))
      assert.equal(1, again.code, command .. ": " .. again.stderr)
      assert.matches("the version ConfigMap cozy-system/cozystack-version is missing, but the Lease "
        .. "cozy-system/cozystack-migrations shows that migrations have run here", again.stderr, 1, true)
      assert.is_nil(cli.version(srv), command .. " created a stamp")
    end
    local st = cli.run(cli.args(srv, dir, "status", "--output", "json"))
    assert.equal(0, st.code, st.stderr)
    local status = json.decode(st.stdout)
    assert.matches("^stamp missing", status.state)
    assert.matches("is missing but the Lease cozystack-migrations exists", table.concat(status.warnings, "\n"), 1, true)
  end)

  it("a cluster without a Lease and without a stamp is still a fresh install", function()
    srv:reset(cli.fixture(nil))
    local r = cli.run(cli.args(srv, dir, "run"))
    assert.equal(0, r.code, r.stderr)
    assert.equal(4, cli.version(srv))
  end)
end)
