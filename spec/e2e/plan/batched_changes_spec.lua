-- A plan of a step whose changes go out as a batch (update_each at
-- --concurrency 8): no object is read before its write; once the steps
-- are done the rehearsal reads each changed object's live original at the
-- resourceVersion its write was applied to (cozy.kube.rehearsal.
-- read_befores): one by one for a few, in a list for a namespace's many.
-- Either way the plan shows a diff per object changed, "no diff" with the
-- server's reason for one it may not read, and "no diff" for one that
-- changed on the live server after its write.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local N, MANY = 12, 60

local MIGRATION = [[
return {
  description = "labels the first ConfigMaps named item-*",
  permissions = { { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" }, { verb = "patch", group = "", resource = "configmaps" },
    { verb = "delete", group = "", resource = "configmaps" } },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = {}
    for _, ns in ipairs { ctx.namespace, NAMESPACES } do
      for cm in cms:list { namespace = ns } do
        local n = tonumber(cm.metadata.name:match("^item%-(%d+)$"))
        if n and n >= FIRST and n <= LAST then items[#items + 1] = cm end
      end
    end
    cms:update_each(items, function(cm)
      cm.metadata.labels = cm.metadata.labels or {}
      cm.metadata.labels.touched = "yes"
      cm.data.v = "new-" .. cm.metadata.name
    end, { label = "items", concurrency = 8 })
    THEN
  end,
}
]]

-- labels item-<first> .. item-<last> of cozy-system, and of the other
-- namespaces named (quoted, comma-separated), then runs `after` (Lua)
local function migration(first, last, others, after)
  return cli.migration_dir { ["1-items.lua"] = (MIGRATION:gsub("FIRST", tostring(first))
    :gsub("LAST", tostring(last)):gsub("NAMESPACES", others or ""):gsub("THEN", after or "")) }
end

-- MANY ConfigMaps item-NN in cozy-system and in tenant-b
local function fixture()
  local objs = { { apiVersion = "v1", kind = "Namespace", metadata = { name = "tenant-b" } } }
  for _, ns in ipairs { "cozy-system", "tenant-b" } do
    for i = 1, MANY do
      local cm = cli.configmap(("item-%02d"):format(i), { v = "old", keep = "same" })
      cm.metadata.namespace = ns
      objs[#objs + 1] = cm
    end
  end
  return cli.fixture(1, objs)
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

-- item-NN's diff as the plan shows it (in cozy-system unless ns says)
local function labelled(name, ns)
  ns = ns or "cozy-system"
  return { "object changed: ConfigMap " .. ns .. "/" .. name,
    "--- live/v1.ConfigMap." .. ns .. "." .. name, "+++ planned/v1.ConfigMap." .. ns .. "." .. name,
    "@@ -1,8 +1,10 @@", " apiVersion: v1", " data:", "   keep: same", "-  v: old", "+  v: new-" .. name,
    " kind: ConfigMap", " metadata:", "+  labels:", "+    touched: \"yes\"", "   name: " .. name,
    "   namespace: " .. ns }
end

-- each of item-<first> .. item-<last> (of cozy-system unless ns says) shown with its own diff
local function assert_labelled(stdout, first, last, ns)
  ns = ns or "cozy-system"
  for i = first, last do
    local name = ("item-%02d"):format(i)
    assert.same(labelled(name, ns), block(stdout, ("object changed: ConfigMap %s/%s"):format(ns, name)))
  end
end

-- The plan's requests: reads of one item by name, reads of the collection
-- (lists), the index of the last dry-run write, and writes not dry-run.
local function requests(h)
  local c = { item_reads = {}, lists = {}, other_lists = {}, last_write = 0, real_writes = 0 }
  for i, e in ipairs(h:requests()) do
    if e.method == "GET" and e.path:match("/configmaps/item%-%d+$") then
      c.item_reads[#c.item_reads + 1] = i
    elseif e.method == "GET" and e.path == "/api/v1/namespaces/cozy-system/configmaps" then
      c.lists[#c.lists + 1] = i
    elseif e.method == "GET" and e.path == "/api/v1/namespaces/tenant-b/configmaps" then
      c.other_lists[#c.other_lists + 1] = i
    elseif cli.is_write(e) then
      if (e.query or ""):match("dryRun=All") then c.last_write = i else c.real_writes = c.real_writes + 1 end
    end
  end
  return c
end

describe("a plan of batched changes", function()
  local h = harness.fake { fixtures = { fixture() } }
  local few, many = migration(1, N), migration(1, MANY)

  it("reads a few objects' live originals one by one once the step is done, and diffs each", function()
    h:mark()
    local r = h:cli(cli.args(h.srv, few, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches(("writes %d admitted, 0 refused, 0 not validated; objects 0 created, %d changed, 0 deleted")
      :format(N + 1, N + 1), r.stdout)
    assert_labelled(r.stdout, 1, N)
    -- one live read of each object, after the last write; nothing written
    local c = requests(h)
    assert.equal(N, #c.item_reads)
    assert.is_true(c.item_reads[1] > c.last_write, "an object was read before the last write")
    assert.equal(0, c.real_writes)
  end)

  it("reads a namespace's many live originals in a list, not one by one", function()
    h:mark()
    local r = h:cli(cli.args(h.srv, many, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches(("objects 0 created, %d changed, 0 deleted"):format(MANY + 1), r.stdout)
    assert_labelled(r.stdout, 1, MANY)
    -- the step's own list, then after the last write the rehearsal's; no object read by name
    local c = requests(h)
    assert.equal(0, #c.item_reads)
    assert.equal(2, #c.lists)
    assert.is_true(c.lists[2] > c.last_write, "the befores were listed before the last write")
    assert.equal(0, c.real_writes)
  end)

  it("lists each namespace's many live originals, each object diffed against its own", function()
    h:mark()
    local r = h:cli(cli.args(h.srv, migration(1, MANY, '"tenant-b"'), "plan", "--concurrency", "8"),
      { COZY_MIGRATE_PAGE_LIMIT = "8" })
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches(("objects 0 created, %d changed, 0 deleted"):format(2 * MANY + 1), r.stdout)
    for _, ns in ipairs { "cozy-system", "tenant-b" } do
      assert_labelled(r.stdout, 1, MANY, ns)
    end
    -- each namespace's 8 pages twice: the step's, then after the last write the rehearsal's
    local c = requests(h)
    assert.equal(0, #c.item_reads)
    assert.equal(16, #c.lists)
    assert.equal(16, #c.other_lists)
    assert.is_true(c.lists[9] > c.last_write and c.other_lists[9] > c.last_write)
  end)

  it("no diff for an object that changed on the live server after its write", function()
    -- a concurrent writer changes item-05 as the rehearsal reads it for the diff: the version its
    -- write was applied to is gone, and the plan says so rather than show the newer one as its before
    h:faults { { method = "GET", path = "^/api/v1/namespaces/cozy-system/configmaps/item-05$",
      bump = { merge = { data = { keep = "changed meanwhile" } } } } }
    local r = h:cli(cli.args(h.srv, few, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    local shown = block(r.stdout, "object changed: ConfigMap cozy-system/item-05")
    assert.equal(2, #shown, table.concat(shown, "\n"))
    assert.matches("^  no diff: the live object changed during the rehearsal %(resourceVersion %d+ when "
      .. "written, %d+ when read for the diff%)$", shown[2])
    assert.same(labelled("item-06"), block(r.stdout, "object changed: ConfigMap cozy-system/item-06"))
  end)

  it("no diff, and the server's reason, for the one object whose live original it may not read #fakeonly", function()
    h:faults { { method = "GET", path = "^/api/v1/namespaces/cozy-system/configmaps/item-07$", status = {
      code = 403, reason = "Forbidden", message = "configmaps \"item-07\" is forbidden: no get" } } }
    local r = h:cli(cli.args(h.srv, few, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    assert.same({ "object changed: ConfigMap cozy-system/item-07",
      '  no diff: the live object could not be read: configmaps "item-07" is forbidden: no get' },
      block(r.stdout, "object changed: ConfigMap cozy-system/item-07"))
    assert.same(labelled("item-06"), block(r.stdout, "object changed: ConfigMap cozy-system/item-06"))
    local doc = json.decode(h:cli(cli.args(h.srv, few, "plan", "-o", "json")).stdout)
    assert.equal(N + 1, doc.summary.rehearsal.changed)
  end)

  it("stops listing where few of a page are awaited, and reads the rest one by one", function()
    -- 37 awaited (item-25 .. item-60 and the version ConfigMap), pages of 8: the third page leaves
    -- 2 found in 24 listed, less than one in 16, and the rest are read one by one
    h:mark()
    local r = h:cli(cli.args(h.srv, migration(25, MANY), "plan", "--concurrency", "8"),
      { COZY_MIGRATE_PAGE_LIMIT = "8" })
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert_labelled(r.stdout, 25, MANY)
    local c, after = requests(h), 0
    for _, i in ipairs(c.lists) do
      if i > c.last_write then after = after + 1 end
    end
    assert.equal(3, after)
    assert.equal(MANY - 24, #c.item_reads)
    assert.is_true(c.item_reads[1] > c.last_write, "an object was read before the last write")
  end)

  it("shows the live original of an object it patched and then deleted, found by its namespace's list", function()
    local dir = migration(1, MANY, nil, 'cms:delete(ctx.namespace, "item-05")')
    h:mark()
    local r = h:cli(cli.args(h.srv, dir, "plan", "--concurrency", "8"), { COZY_MIGRATE_PAGE_LIMIT = "8" })
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches(("objects 0 created, %d changed, 1 deleted"):format(MANY), r.stdout)
    -- its before is the live original the patch was applied to, not the patched one
    assert.same({ "object deleted: ConfigMap cozy-system/item-05",
      "--- live/v1.ConfigMap.cozy-system.item-05", "+++ planned/v1.ConfigMap.cozy-system.item-05",
      "@@ -1,8 +0,0 @@", "-apiVersion: v1", "-data:", "-  keep: same", "-  v: old", "-kind: ConfigMap",
      "-metadata:", "-  name: item-05", "-  namespace: cozy-system" },
      block(r.stdout, "object deleted: ConfigMap cozy-system/item-05"))
    assert.same(labelled("item-06"), block(r.stdout, "object changed: ConfigMap cozy-system/item-06"))
    -- found in the list read for the others: no read of it by itself
    assert.equal(0, #requests(h).item_reads)
  end)

  it("reads more objects one by one than it reads ahead, each diffed against its own", function()
    -- at --concurrency 2 it reads 4 ahead of the report: 12 to read
    h:mark()
    local r = h:cli(cli.args(h.srv, few, "plan", "--concurrency", "2"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert_labelled(r.stdout, 1, N)
    assert.equal(N, #requests(h).item_reads)
  end)

  it("reads the many one by one when the list of them is refused #fakeonly", function()
    -- the step's own list passes (skip), the rehearsal's is refused
    h:faults { { method = "GET", path = "^/api/v1/namespaces/cozy-system/configmaps([?]|$)", skip = 1,
      status = { code = 403, reason = "Forbidden", message = "configmaps is forbidden: no list" } } }
    h:mark()
    local r = h:cli(cli.args(h.srv, many, "plan", "--concurrency", "8"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    assert_labelled(r.stdout, 1, MANY)
    assert.equal(MANY, #requests(h).item_reads)
  end)
end)
