-- A plan of a step whose changes go out as a batch (update_each at
-- --concurrency 8): each object's live original is read beside the other
-- writes in flight (cozy.kube.rehearsal.before_read), and the plan shows
-- the same as when each was read before its write: a diff per object
-- changed, and "no diff" with the server's reason for one it may not read.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local N = 12

local MIGRATION = [[
return {
  description = "labels every ConfigMap named item-*",
  permissions = { { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" }, { verb = "patch", group = "", resource = "configmaps" } },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = {}
    for cm in cms:list { namespace = ctx.namespace } do
      if cm.metadata.name:match("^item%-") then items[#items + 1] = cm end
    end
    cms:update_each(items, function(cm)
      cm.metadata.labels = cm.metadata.labels or {}
      cm.metadata.labels.touched = "yes"
      cm.data.v = "new-" .. cm.metadata.name
    end, { label = "items", concurrency = 8 })
  end,
}
]]

local function fixture()
  local cms = {}
  for i = 1, N do
    cms[#cms + 1] = cli.configmap(("item-%02d"):format(i), { v = "old", keep = "same" })
  end
  return cli.fixture(1, cms)
end

local function block(stdout, header)
  local out, inside = {}, false
  for _, l in ipairs(cli.lines(stdout)) do
    if l == header then inside = true
    elseif inside and (l:match("^object ") or l:match("^plan:")) then break end
    if inside then out[#out + 1] = l end
  end
  return out
end

describe("a plan of batched changes", function()
  local h = harness.fake { fixtures = { fixture() } }
  local dir = cli.migration_dir { ["1-items.lua"] = MIGRATION }

  it("shows each object's diff against its live original, every write admitted", function()
    local r = h:cli(cli.args(h.srv, dir, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches(("writes %d admitted, 0 refused, 0 not validated; objects 0 created, %d changed, 0 deleted")
      :format(N + 1, N + 1), r.stdout)
    for i = 1, N do
      local name = ("item-%02d"):format(i)
      assert.same({ "object changed: ConfigMap cozy-system/" .. name,
        "--- live/v1.ConfigMap.cozy-system." .. name, "+++ planned/v1.ConfigMap.cozy-system." .. name,
        "@@ -1,8 +1,10 @@", " apiVersion: v1", " data:", "   keep: same", "-  v: old", "+  v: new-" .. name,
        " kind: ConfigMap", " metadata:", "+  labels:", "+    touched: \"yes\"", "   name: " .. name,
        "   namespace: cozy-system" }, block(r.stdout, "object changed: ConfigMap cozy-system/" .. name))
    end
    -- one live read of each object before its first write, nothing written
    local reads, writes = 0, 0
    for _, e in ipairs(h:requests()) do
      if e.method == "GET" and e.path:match("/configmaps/item%-%d+$") then reads = reads + 1 end
      if cli.is_write(e) and not (e.query or ""):match("dryRun=All") then writes = writes + 1 end
    end
    assert.equal(N, reads)
    assert.equal(0, writes)
  end)

  it("no diff, and the server's reason, for the one object whose live original it may not read #fakeonly", function()
    h:faults { { method = "GET", path = "^/api/v1/namespaces/cozy-system/configmaps/item-07$", status = {
      code = 403, reason = "Forbidden", message = "configmaps \"item-07\" is forbidden: no get" } } }
    local r = h:cli(cli.args(h.srv, dir, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    assert.same({ "object changed: ConfigMap cozy-system/item-07",
      '  no diff: the live object could not be read: configmaps "item-07" is forbidden: no get' },
      block(r.stdout, "object changed: ConfigMap cozy-system/item-07"))
    assert.equal(15, #block(r.stdout, "object changed: ConfigMap cozy-system/item-06"))
    local doc = json.decode(h:cli(cli.args(h.srv, dir, "plan", "-o", "json")).stdout)
    assert.equal(N + 1, doc.summary.rehearsal.changed)
  end)
end)
