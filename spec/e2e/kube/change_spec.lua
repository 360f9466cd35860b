-- change and update_each against the API server (the fake, or the real one
-- under COZY_SPEC_SERVER=real), through the step executor: the difference is
-- sent once, re-edited after a conflict, a deleted object is skipped only when
-- the migration says so, plan sends nothing.
local fake = require("spec.helpers").server
local runner = require "cozy.runner"
local sandbox = require "cozy.sandbox"
local cli = require("spec.helpers").cli
local harness = require "spec.helpers"

-- Another client of the API server, writing while the engine works: the
-- migrations of this spec call it (`require "spec.concurrent"`, a module the
-- sandbox offers them while this spec runs) from their edit functions, that is
-- between the engine's read of an object and its write, and it changes or
-- deletes the object there with its own requests (curl, its own User-Agent),
-- as a controller would. A conflict is then the server's own answer, on the
-- fake and on a real server alike. What it does is set per test in
-- `concurrently`: name -> { times = n (-1: every time), merge = a merge patch,
-- or a function of the count of its writes returning one, or true: a new
-- annotation each time; or delete = true }; `wrote` lists what it sent,
-- "PATCH cm-2 200". A write must change the object: one that changes nothing
-- is no write (no new resourceVersion) on either server.
local WRITER = "spec-concurrent-writer"
local srv -- the server of the running describe block
local concurrently, wrote = {}, {}

local function concurrent(cm)
  local name = cm.metadata.name
  local rule = concurrently[name]
  if rule == nil or rule.times == 0 then return end
  rule.times, rule.n = rule.times - 1, (rule.n or 0) + 1
  local path = ("/api/v1/namespaces/%s/configmaps/%s"):format(cm.metadata.namespace, name)
  local headers = { ["User-Agent"] = WRITER }
  local method, opts = "DELETE", { headers = headers }
  if not rule.delete then
    local merge = rule.merge
    if merge == true then merge = { metadata = { annotations = { bumped = tostring(rule.n) } } } end
    if type(merge) == "function" then merge = merge(rule.n) end
    method, opts.body, opts.content_type = "PATCH", merge, "application/merge-patch+json"
  end
  wrote[#wrote + 1] = ("%s %s %d"):format(method, name, srv:request(method, path, opts).status)
end

setup(function() sandbox.modules["spec.concurrent"] = function() return concurrent end end)
teardown(function() sandbox.modules["spec.concurrent"] = nil end)

-- The engine's requests (the concurrent writer's left out), filtered as
-- srv:requests filters.
local function engine_requests(filter)
  local out = {}
  for _, e in ipairs(srv:requests(filter)) do
    if e.user_agent ~= WRITER then out[#out + 1] = e end
  end
  return out
end

-- A server that refuses every change of ConfigMap cozy-system/`name` with 403
-- Forbidden, until the returned function is called: on the fake a fault rule,
-- on a real server a ValidatingAdmissionPolicy (reason Forbidden), waited for
-- until it takes effect (a dry-run PATCH, refused) and, when lifted, until it
-- no longer does (deleting a policy takes effect a moment later, so a reset
-- alone would leave it to refuse the next test's writes).
local function refuse(name)
  local path = "/api/v1/namespaces/cozy-system/configmaps/" .. name
  local headers = { ["User-Agent"] = WRITER }
  if not srv.real then
    srv:faults { { method = "PATCH", path = "/configmaps/" .. name .. "$", times = 1, status = 403 } }
    return function() end
  end
  local api = "/apis/admissionregistration.k8s.io/v1/"
  local policy = "spec-refuse-" .. name
  local function create(resource, spec)
    local res = srv:request("POST", api .. resource, { headers = headers, body = {
      apiVersion = "admissionregistration.k8s.io/v1", metadata = { name = policy }, spec = spec } })
    assert(res.status == 201, res.body)
  end
  create("validatingadmissionpolicies", { failurePolicy = "Fail",
    matchConstraints = { resourceRules = { { apiGroups = { "" }, apiVersions = { "v1" }, operations = { "UPDATE" },
      resources = { "configmaps" } } } },
    validations = { { expression = ("object.metadata.name != '%s'"):format(name), reason = "Forbidden",
      message = "the spec refuses it" } } })
  create("validatingadmissionpolicybindings", { policyName = policy, validationActions = { "Deny" } })
  local function refused()
    return srv:request("PATCH", path .. "?dryRun=All", { headers = headers, content_type = "application/merge-patch+json",
      body = { metadata = { annotations = { probe = "x" } } } }).status == 403
  end
  assert(fake.poll(30, refused, 0.1), "the admission policy did not take effect")
  return function()
    for _, resource in ipairs { "validatingadmissionpolicybindings", "validatingadmissionpolicies" } do
      srv:request("DELETE", api .. resource .. "/" .. policy, { headers = headers })
    end
    assert(fake.poll(30, function() return not refused() end, 0.1), "the admission policy was not lifted")
  end
end

-- The statuses of the engine's PATCHes of ConfigMap `name`, in order.
local function patch_statuses(name)
  local out = {}
  for i, e in ipairs(engine_requests { method = "PATCH", path = "/configmaps/" .. name:gsub("%-", "%%-") .. "$" }) do
    out[i] = e.status
  end
  return out
end

-- The ConfigMaps of cozy-system the server holds, by name: one read of its
-- objects (on a real server, a list of every resource) for all of them.
local function stored()
  local out = {}
  for _, o in ipairs(srv:objects()) do
    if o.kind == "ConfigMap" and o.metadata.namespace == "cozy-system" then out[o.metadata.name] = o end
  end
  return out
end

-- The server for a describe block: its own, reset before each test with the
-- concurrent writer idle.
local function server()
  setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)
  before_each(function()
    concurrently, wrote = {}, {}
  end)
end

local PERMISSIONS = [[
  permissions = {
    { verb = "list", group = "", resource = "configmaps" },
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
    { verb = "delete", group = "", resource = "configmaps" },
  },
]]

-- Runs a migration whose run is `body` through the spec harness; returns ok,
-- err or result, and the log lines.
local function run(target, body, mode)
  local dir = cli.migration_dir { ["1-probe.lua"] =
    ("local obj = require 'cozy.obj'\nlocal concurrent = require 'spec.concurrent'\nreturn { description = 'probe',\n%s  run = function(ctx)\n%s\n  end }\n")
      :format(PERMISSIONS, body) }
  local m = runner.load_file(dir .. "/1-probe.lua")
  os.execute("rm -rf " .. cli.quote(dir))
  local captured = harness.capture_log()
  local ok, res = pcall(runner.run_migration, m, { kubeconfig = target.kubeconfig, mode = mode, log = captured.log })
  local lines = {}
  for i, line in ipairs(captured.lines) do lines[i] = line.message end
  return ok, res, lines
end

local function fixture(n)
  local extra = {}
  for i = 1, n do extra[i] = cli.configmap(("cm-%d"):format(i), { keep = "me" }) end
  return cli.fixture(1, extra)
end

local EACH = [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = cms:list{ namespace = "cozy-system", label_selector = nil, project = { "data" } }:collect()
    local picked = {}
    for _, cm in ipairs(items) do if cm.metadata.name:find("^cm%%-") then picked[#picked + 1] = cm end end
    local counts = cms:update_each(picked, function(cm)
      concurrent(cm)
      if cm.data.done then return nil end
      cm.data.done = "yes"
      return cm.metadata.name
    end, { label = "ConfigMaps", absent = %s, on_change = function(_, name) ctx.log:change("%%s {done|would be done}", name) end })
    ctx:outcome(counts)
]]

describe("update_each", function()
  server()
  before_each(function()
    srv:reset(fixture(3))
    if not srv.real then srv:clear_faults() end
    srv:clear_requests()
  end)

  it("sends one patch per object with only the difference, and counts", function()
    local ok, res, lines = run(srv, EACH:format('"skip"'))
    assert.is_true(ok, tostring(res))
    assert.same({ total = 3, changed = 3, unchanged = 0, absent = 0 }, res.outcome.counts)
    local patches = srv:requests { method = "PATCH" }
    assert.equal(3, #patches)
    assert.matches('^%[{"op":"test","path":"/metadata/resourceVersion","value":"%d+"},', patches[1].body)
    assert.matches('{"op":"add","path":"/data/done","value":"yes"}]$', patches[1].body)
    local held = stored()
    for i = 1, 3 do assert.equal("yes", held["cm-" .. i].data.done) end
    -- one line per change, in the order they ended (in parallel: any)
    local changed = { lines[1], lines[2], lines[3] }
    table.sort(changed)
    assert.same({ "cm-1 done", "cm-2 done", "cm-3 done" }, changed)
    assert.equal("ConfigMaps: 3 changed, 0 unchanged, 0 deleted since the list", lines[#lines])
    -- a second run finds nothing to do and sends nothing
    srv:clear_requests()
    ok, res = run(srv, EACH:format('"skip"'))
    assert.is_true(ok, tostring(res))
    assert.same({}, cli.writes(srv))
    assert.equal(3, res.outcome.counts.unchanged)
  end)

  it("re-reads and edits again after a conflict, sending the change once", function()
    concurrently["cm-2"] = { times = 1, merge = { data = { done = "by-another" } } }
    local ok, res = run(srv, EACH:format('"skip"'))
    assert.is_true(ok, tostring(res))
    assert.same({ "PATCH cm-2 200" }, wrote)
    -- its PATCH met the other write (a failed test of the resourceVersion),
    -- the re-read saw it done: no second PATCH
    assert.same({ 422 }, patch_statuses("cm-2"))
    assert.equal("by-another", srv:object("ConfigMap", "cozy-system", "cm-2").data.done)
    assert.same({ total = 3, changed = 2, unchanged = 1, absent = 0 }, res.outcome.counts)
  end)

  it("skips an object deleted since the list when told, and fails on it otherwise", function()
    concurrently["cm-3"] = { times = 1, delete = true }
    local ok, res, lines = run(srv, EACH:format('"skip"'))
    assert.is_true(ok, tostring(res))
    assert.same({ "DELETE cm-3 200" }, wrote)
    assert.equal(1, res.outcome.counts.absent)
    assert.truthy(table.concat(lines, "\n"):find("ConfigMap cozy-system/cm-3: deleted since the list, skipped", 1, true))
    srv:reset(fixture(3))
    concurrently["cm-3"], wrote = { times = 1, delete = true }, {}
    ok, res = run(srv, EACH:format("nil"))
    assert.is_false(ok)
    assert.equal(404, res.code)
    assert.same({ "DELETE cm-3 200" }, wrote)
  end)

  it("stops at the first other failure (one at a time: nothing after it)", function()
    local lift = refuse("cm-2")
    finally(lift)
    srv:clear_requests()
    local ok, res = run(srv, (EACH:format('"skip"'):gsub("absent = ", "concurrency = 1, absent = ")))
    assert.is_false(ok)
    assert.equal(403, res.code)
    assert.same({ 403 }, patch_statuses("cm-2"))
    assert.same({}, patch_statuses("cm-3"))
    assert.is_nil(srv:object("ConfigMap", "cozy-system", "cm-3").data.done)
  end)

  it("in parallel, starts no change after the first failure, lets those in flight end, and raises it", function()
    srv:reset(fixture(40))
    local lift = refuse("cm-1")
    finally(lift)
    srv:clear_requests()
    local ok, res = run(srv, (EACH:format('"skip"'):gsub("absent = ", "concurrency = 2, absent = ")))
    assert.is_false(ok)
    assert.equal(403, res.code)
    assert.same({ 403 }, patch_statuses("cm-1"))
    if not srv.real then assert.same({ "status" }, srv:fired()) end
    local patched = #engine_requests { method = "PATCH" }
    -- never the 40: at most the pipe (twice the concurrency), plus one more for
    -- each change that ended before the failure was read
    assert.is_true(patched <= 8, patched .. " patches")
    local done, held = 0, stored()
    for i = 1, 40 do
      if held["cm-" .. i].data.done then done = done + 1 end
    end
    assert.equal(patched - 1, done)
  end)

  -- the 5xx answers are the fake's faults; the conflicts, the concurrent
  -- writer's, on either server
  for _, faulty in ipairs { false, true } do
    it(("in parallel, ends in exactly the state one at a time does, under conflicts%s")
        :format(faulty and " and 5xx #fakeonly" or ""), function()
      local function final()
        local out, held = {}, stored()
        for i = 1, 12 do out[i] = held["cm-" .. i].data end
        return out
      end
      local results = {}
      for _, n in ipairs({ 1, 4 }) do
        srv:reset(fixture(12))
        srv:clear_requests()
        concurrently, wrote = {
          ["cm-3"] = { times = 2, merge = function(k) return { data = { other = "x" .. k } } end },
          ["cm-7"] = { times = 1, merge = { data = { done = "by-another" } } },
        }, {}
        if faulty then srv:faults { { method = "PATCH", path = "/configmaps/cm-5$", times = 2, status = 503 } } end
        local ok, res = run(srv, (EACH:format('"skip"'):gsub("absent = ", ("concurrency = %d, absent = "):format(n))))
        assert.is_true(ok, tostring(res))
        table.sort(wrote)
        assert.same({ "PATCH cm-3 200", "PATCH cm-3 200", "PATCH cm-7 200" }, wrote)
        if faulty then assert.same({ "status", "status" }, srv:fired()) end
        results[n] = { counts = res.outcome.counts, state = final() }
      end
      assert.same(results[1], results[4])
      assert.same({ total = 12, changed = 11, unchanged = 1, absent = 0 }, results[4].counts)
    end)
  end

  for _, n in ipairs({ 1, 4 }) do
    it(("gives up on an object that never stops changing after the bounded attempts (concurrency %d)"):format(n), function()
      concurrently["cm-2"] = { times = -1, merge = true }
      local ok, res = run(srv, (EACH:format('"skip"'):gsub("absent = ", ("concurrency = %d, absent = "):format(n))))
      assert.is_false(ok)
      assert.equal(422, res.code)
      assert.matches("gave up after 8 conflicting attempts", res.message)
      local attempts = engine_requests { method = "PATCH", path = "/configmaps/cm%-2$" }
      assert.equal(8, #attempts)
      for _, e in ipairs(attempts) do assert.equal(422, e.status) end
      assert.equal(#attempts, #wrote) -- every attempt met a concurrent writer
      for _, w in ipairs(wrote) do assert.equal("PATCH cm-2 200", w) end
      assert.is_nil(srv:object("ConfigMap", "cozy-system", "cm-2").data.done)
    end)
  end

  for _, n in ipairs({ 1, 4 }) do
    it(("with project, edits lean copies, re-reads lean after a conflict and hands on_change the lean answer"
        .. " (concurrency %d)"):format(n), function()
      concurrently["cm-2"] = { times = 1, merge = { data = { other = "x" } } }
      local ok, res = run(srv, ([[
    -- what of an object is outside the lean shape: identity and data
    local function extra(o)
      local out = {}
      for k in pairs(o) do if k ~= "apiVersion" and k ~= "kind" and k ~= "metadata" and k ~= "data" then out[#out + 1] = k end end
      for k in pairs(o.metadata) do
        if k ~= "name" and k ~= "namespace" and k ~= "uid" and k ~= "resourceVersion" then out[#out + 1] = "metadata." .. k end
      end
      return #out
    end
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = {}
    for cm in cms:list{ namespace = "cozy-system", project = { "data" } } do
      if cm.metadata.name:find("^cm%%-") then items[#items + 1] = cm end
    end
    local seen = { edits = 0, extra = 0, answers = 0, answered_extra = 0, other = 0 }
    local counts = cms:update_each(items, function(cm)
      concurrent(cm)
      seen.edits, seen.extra = seen.edits + 1, seen.extra + extra(cm)
      if cm.data.other then seen.other = seen.other + 1 end -- the re-read after the bump
      cm.data.done = "yes"
    end, { concurrency = %d, project = { "data" }, on_change = function(_, _, after)
      seen.answers, seen.answered_extra = seen.answers + 1, seen.answered_extra + extra(after)
      assert(after.data.done == "yes")
    end })
    ctx:outcome { changed = counts.changed, edits = seen.edits, extra = seen.extra, answers = seen.answers,
      answered_extra = seen.answered_extra, other = seen.other }
]]):format(n))
      assert.is_true(ok, tostring(res))
      assert.same({ "PATCH cm-2 200" }, wrote)
      -- 3 edits and one more after the conflict, all lean; the fresh read saw the other writer
      assert.same({ changed = 3, edits = 4, extra = 0, answers = 3, answered_extra = 0, other = 1 }, res.outcome.counts)
      local held = stored()
      assert.equal("x", held["cm-2"].data.other)
      assert.equal("yes", held["cm-2"].data.done)
      -- the objects the server holds are whole: creationTimestamp is there, lean copies lack it
      assert.is_string(held["cm-1"].metadata.creationTimestamp)
    end)
  end

  for _, n in ipairs({ 1, 2 }) do
    it(("takes items from a function only as the batch has room (concurrency %d)"):format(n), function()
      srv:reset(fixture(9))
      local ok, res = run(srv, ([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local texts = {}
    for cm in cms:list{ namespace = "cozy-system", project = { "data" } } do
      if cm.metadata.name:find("^cm%%-") then texts[#texts + 1] = require("cozy.json").encode(cm) end
    end
    local pulled, ended, ahead = 0, 0, 0
    local counts = cms:update_each(function()
      ahead = math.max(ahead, pulled - ended)
      pulled = pulled + 1
      return texts[pulled] and require("cozy.json").decode(texts[pulled])
    end, function(cm) cm.data.done = "yes" end, { concurrency = %d, on_change = function() ended = ended + 1 end })
    ctx:outcome { total = counts.total, changed = counts.changed, ahead = ahead, pulled = pulled }
]]):format(n))
      assert.is_true(ok, tostring(res))
      -- 9 items and the nil that ends them; never more than twice the concurrency ahead of the changes ended
      assert.same({ total = 9, changed = 9, pulled = 10 }, { total = res.outcome.counts.total,
        changed = res.outcome.counts.changed, pulled = res.outcome.counts.pulled })
      assert.is_true(res.outcome.counts.ahead <= 2 * n, tostring(res.outcome.counts.ahead))
      local held = stored()
      for i = 1, 9 do assert.equal("yes", held["cm-" .. i].data.done) end
    end)
  end

  for _, n in ipairs({ 1, 4 }) do
    it(("takes a list as it is read, page by page (concurrency %d)"):format(n), function()
      srv:reset(fixture(12))
      srv:clear_requests()
      local ok, res = run(srv, ([[
    local cms = ctx.kube:resource("v1", "configmaps")
    local counts = cms:update_each(cms:list{ namespace = "cozy-system", limit = 5, project = { "data" } }, function(cm)
      if cm.metadata.name:find("^cm%%-") then cm.data.done = "yes" end
    end, { concurrency = %d, project = { "data" } })
    ctx:outcome(counts)
]]):format(n))
      assert.is_true(ok, tostring(res))
      -- 12 of ours and the version ConfigMap, 5 a page
      assert.same({ total = 13, changed = 12, unchanged = 1, absent = 0 }, res.outcome.counts)
      assert.equal(3, #srv:requests { method = "GET", path = "^/api/v1/namespaces/cozy%-system/configmaps$" })
      local held = stored()
      for i = 1, 12 do assert.equal("yes", held["cm-" .. i].data.done) end
    end)

    it(("refuses items that are not objects naming themselves, and a table that is not an array (concurrency %d)")
        :format(n), function()
      local ok, res = run(srv, ([[
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:update_each({ "cm-1", "cm-2" }, function(cm) cm.data.done = "yes" end, { concurrency = %d })
]]):format(n))
      assert.is_false(ok)
      assert.matches("an item is not an object whose metadata names it %(got string%)", tostring(res.message or res))
      ok, res = run(srv, ([[
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:update_each({ a = 1 }, function(cm) cm.data.done = "yes" end, { concurrency = %d })
]]):format(n))
      assert.is_false(ok)
      assert.matches("items must be an array, a list or a function", tostring(res.message or res))
      assert.same({}, cli.writes(srv))
    end)
  end

  it("changes each object of a list read in several pages once", function()
    srv:reset(fixture(23))
    srv:clear_requests()
    local ok, res = run(srv, (EACH:format('"skip"'):gsub('label_selector = nil', 'limit = 5')))
    assert.is_true(ok, tostring(res))
    local pages = #srv:requests { method = "GET", path = "^/api/v1/namespaces/cozy%-system/configmaps$" }
    assert.equal(5, pages) -- 23 of ours plus the version ConfigMap, 5 a page
    assert.same({ total = 23, changed = 23, unchanged = 0, absent = 0 }, res.outcome.counts)
    assert.equal(23, #srv:requests { method = "PATCH" })
    local held = stored()
    for i = 1, 23 do assert.equal("yes", held["cm-" .. i].data.done) end
  end)

  it("in plan mode, records each change and sends none", function()
    local ok, res, lines = run(srv, EACH:format('"skip"'), "plan")
    assert.is_true(ok, tostring(res))
    assert.same({}, cli.writes(srv))
    assert.equal(3, res.outcome.counts.changed)
    assert.equal("cm-1 would be done", lines[1])
  end)
end)

-- A value carried with each item through update_each: items from a function
-- returning (object, value); edit, on_change and on_absent get the value.
local CARRY = [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local items = {}
    for cm in cms:list{ namespace = "cozy-system", project = { "data" } } do
      if cm.metadata.name:find("^cm%%-") then items[#items + 1] = cm end
    end
    local i = 0
    local seen = {}
    local counts = cms:update_each(function()
      i = i + 1
      if items[i] == nil then return nil end
      return items[i], { tag = "carried-" .. items[i].metadata.name }
    end, function(cm, listed, value)
      concurrent(cm)
      assert(listed.metadata.name == cm.metadata.name)
      cm.data.carried = value.tag
    end, { concurrency = %d, absent = "skip", project = { "data" },
      on_change = function(cm, _, _, value) seen["changed " .. cm.metadata.name] = value.tag end,
      on_absent = function(cm, value) seen["absent " .. cm.metadata.name] = value.tag end })
    seen.changed = counts.changed
    seen.absent = counts.absent
    ctx:outcome(seen)
]]

describe("update_each with carried values", function()
  server()
  before_each(function()
    srv:reset(fixture(4))
    if not srv.real then srv:clear_faults() end
    srv:clear_requests()
  end)

  for _, case in ipairs({ { "in parallel", 4 }, { "one at a time", 1 }, { "in plan mode", 4, "plan" } }) do
    it(("hands each item's value to edit, on_change and on_absent (%s)"):format(case[1]), function()
      concurrently["cm-4"] = case[3] == nil and { times = 1, delete = true } or nil
      local ok, res = run(srv, CARRY:format(case[2]), case[3])
      assert.is_true(ok, tostring(res))
      local want = { changed = 3, absent = 1, ["changed cm-1"] = "carried-cm-1", ["changed cm-2"] = "carried-cm-2",
        ["changed cm-3"] = "carried-cm-3", ["absent cm-4"] = "carried-cm-4" }
      if case[3] == "plan" then
        -- nothing deleted in a plan: all four change, on paper
        want.changed, want.absent, want["absent cm-4"], want["changed cm-4"] = 4, 0, nil, "carried-cm-4"
        assert.same({}, cli.writes(srv))
      else
        local held = stored()
        for n = 1, 3 do assert.equal("carried-cm-" .. n, held["cm-" .. n].data.carried) end
      end
      assert.same(want, res.outcome.counts)
    end)
  end
end)

describe("single writes with absent = \"skip\", and read_back", function()
  server()
  before_each(function()
    srv:reset(fixture(1))
    srv:clear_requests()
  end)

  for _, mode in ipairs({ "run", "plan" }) do
    it(("return nil for an absent object when told, and raise its 404 otherwise (%s)"):format(mode), function()
      local ok, res = run(srv, [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local skip = { absent = "skip" }
    local got = {}
    local function count(name, ...) got[name] = select("#", ...) == 1 and (...) == nil and "nil" or "value" end
    count("get", cms:get("cozy-system", "none", skip))
    count("merge_patch", cms:merge_patch("cozy-system", "none", { data = { a = "1" } }, skip))
    count("json_patch", cms:json_patch("cozy-system", "none", { { op = "add", path = "/data/a", value = "1" } }, skip))
    count("update", cms:update("cozy-system", "none", function() return { { op = "add", path = "/data/a", value = "1" } } end, skip))
    count("change", cms:change("cozy-system", "none", function(cm) cm.data.a = "1" end, skip))
    count("delete", cms:delete("cozy-system", "none", skip))
    count("present", cms:merge_patch("cozy-system", "cm-1", { data = { a = "1" } }, skip))
    for _, call in ipairs({ "get", "merge_patch", "delete" }) do
      local ok2, err = pcall(cms[call], cms, "cozy-system", "none", call == "merge_patch" and { data = {} } or nil)
      got["raises " .. call] = not ok2 and err.code == 404 and err.absent == "object"
    end
    local ok3, err3 = pcall(cms.delete, cms, "cozy-system", "none", { absent = "maybe" })
    got.bad_opts = not ok3 and tostring(err3):match("opts must be a table whose absent is") ~= nil
    ctx:outcome(got)
]], mode ~= "run" and mode or nil)
      assert.is_true(ok, tostring(res))
      assert.same({ get = "nil", merge_patch = "nil", json_patch = "nil", update = "nil", change = "nil", delete = "nil",
        present = "value", ["raises get"] = true, ["raises merge_patch"] = true, ["raises delete"] = true, bad_opts = true },
        res.outcome.counts)
    end)
  end

  it("read_back reads the object as stored in a run, nil when it is gone since", function()
    concurrently["cm-1"] = { times = 1, delete = true }
    local ok, res = run(srv, [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local written = cms:merge_patch("cozy-system", "cm-1", { data = { a = "1" } })
    local back = cms:read_back(written)
    local out = { a = back.data.a, same_rv = back.metadata.resourceVersion == written.metadata.resourceVersion }
    concurrent(written)
    out.gone = cms:read_back(written) == nil
    ctx:outcome(out)
]])
    assert.is_true(ok, tostring(res))
    assert.same({ a = "1", same_rv = true, gone = true }, res.outcome.counts)
    -- each read_back was a GET of the object
    assert.equal(2, #engine_requests { method = "GET", path = "^/api/v1/namespaces/cozy%-system/configmaps/cm%-1$" })
  end)

  it("read_back in a plan returns what the write would have produced, and reads nothing", function()
    local ok, res = run(srv, [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local written = cms:merge_patch("cozy-system", "cm-1", { data = { a = "1" } })
    local back = cms:read_back(written)
    ctx:outcome { a = back.data.a, same = back == written }
]], "plan")
    assert.is_true(ok, tostring(res))
    assert.same({ a = "1", same = true }, res.outcome.counts)
    assert.same({}, cli.writes(srv))
    -- the merge patch's simulation read the object once; read_back read nothing more
    assert.equal(1, #engine_requests { method = "GET", path = "^/api/v1/namespaces/cozy%-system/configmaps/cm%-1$" })
    assert.is_nil(stored()["cm-1"].data.a)
  end)
end)

describe("change", function()
  server()

  it("sends nothing when the edit changes nothing, and returns what edit returned", function()
    srv:reset(fixture(1))
    srv:clear_requests()
    local ok, res = run(srv, [[
    local cms = ctx.kube:resource("v1", "configmaps")
    local _, changed = cms:change("cozy-system", "cm-1", function(cm) cm.data.keep = "me" end)
    assert(changed == false)
    local after, changed2, info = cms:change("cozy-system", "cm-1", function(cm) cm.data.keep = nil; cm.data.new = "1"; return "edited" end)
    assert(changed2 == true and info == "edited" and after.data.new == "1" and after.data.keep == nil)
]])
    assert.is_true(ok, tostring(res))
    assert.equal(1, #srv:requests { method = "PATCH" })
  end)
end)
