-- What a rule declares instead of writing it in its walk (docs/engine-api.md,
-- "Rules"): a selection's `where` (which listed objects are its own) and
-- `refused` (an edit that refuses an object), `skip` and a join that ends the
-- walk when a side is not served, rule.delete's `unless` guard and declared
-- lines, and rule.orphan (suspend, drop finalizers, read back, delete). Each
-- case runs a migration written for it through the step executor against the
-- server and asserts on the stored objects, the request log and the lines.
local harness = require "spec.helpers"
local files = require("spec.helpers").files

local NS = "cozy-system"
local function cm(name, fields)
  local o = { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, namespace = NS },
    data = { tier = "none" } }
  for k, v in pairs(fields or {}) do o[k] = v end
  return o
end
local FIXTURE = {
  { apiVersion = "v1", kind = "Namespace", metadata = { name = NS } },
  cm("tenant-a", { metadata = { name = "tenant-a", namespace = NS, labels = { team = "blue" } } }),
  cm("tenant-b", { metadata = { name = "tenant-b", namespace = NS, labels = { team = "red" } } }),
  cm("tenant-c", { metadata = { name = "tenant-c", namespace = NS, labels = { team = "green" } } }),
  cm("other"),
}

local dir = files.tmpdir("cozy-rule-declarations")
local n = 0
-- A migration file holding source; returns its path.
local function migration(source)
  n = n + 1
  local path = ("%s/%d-case.lua"):format(dir, n)
  files.write(path, source)
  return path
end

local function messages(res, level)
  local out = {}
  for _, l in ipairs(res.lines) do
    if level == nil or l.level == level then out[#out + 1] = l.message end
  end
  return out
end
local function patched(h)
  local out = {}
  for _, w in ipairs(h:writes()) do out[#out + 1] = w.method .. " " .. w.path:match("[^/]+$") end
  table.sort(out)
  return out
end

describe("a rule's declarations", function()
  local h = harness.fake { fixtures = { FIXTURE } }

  describe("where", function()
    it("edits only the objects whose path matches a glob, in a lean list that reads that path", function()
      local m = migration [[
local obj = require "cozy.obj"
return require("cozy.rule") {
  description = "label tenant configmaps",
  select = { cms = { "configmaps", namespace = "cozy-system", edit = true, project = { "data" },
    where = { ["metadata.name"] = "tenant-*" } } },
  walk = function(_, s) s.cms:each(function(c) c.data.tier = "standard" return true end) end,
}]]
      local res = h:migrate(m)
      assert.same({ "PATCH tenant-a", "PATCH tenant-b", "PATCH tenant-c" }, patched(h))
      assert.equal("none", h:object("ConfigMap", NS, "other").data.tier)
      assert.equal("standard", h:object("ConfigMap", NS, "tenant-b").data.tier)
      assert.equal(3, res.outcome.counts.changed)
    end)

    it("matches one element of an array value, one of several globs, or a function's verdict", function()
      local function run(where)
        h:reset { FIXTURE }
        local m = migration(([[
return require("cozy.rule") {
  description = "read",
  select = { cms = { "configmaps", namespace = "cozy-system", where = %s } },
  walk = function(ctx, s) s.cms:each(function(c) ctx.log:info("saw " .. c.metadata.name) end) end,
}]]):format(where))
        local saw = {}
        for _, line in ipairs(messages(h:migrate(m), "info")) do
          saw[#saw + 1] = line:match("^saw (.*)")
        end
        table.sort(saw)
        return saw
      end
      assert.same({ "other", "tenant-c" }, run('{ ["metadata.name"] = { "other", "*-c" } }'))
      assert.same({ "tenant-a" }, run('{ ["metadata.labels.team"] = "blue" }'))
      assert.same({ "tenant-b" }, run('function(c) return c.metadata.name == "tenant-b" end'))
      assert.same({}, run('{ ["data.tier"] = "std*" }'))
    end)

    it("is checked at load time: a glob that does not parse, a value that is no glob", function()
      local rule = require "cozy.rule"
      for _, case in ipairs {
        { { ["metadata.name"] = "[a" }, 'select.x.where["metadata.name"]' },
        { { ["metadata.name"] = 3 }, 'select.x.where["metadata.name"] must be a glob or an array of globs' },
        { "tenant-*", "select.x.where must be a table or a function" },
      } do
        local ok, err = pcall(rule, { description = "d", walk = function() end,
          select = { x = { "configmaps", where = case[1] } } })
        assert.is_false(ok)
        assert.matches(case[2], tostring(err), 1, true)
      end
    end)
  end)

  describe("finding", function()
    local FLAG = [[
return require("cozy.rule") {
  description = "flag red teams",
  select = { red = { "configmaps", namespace = "cozy-system", check_only = %s,
    where = { ["metadata.labels.team"] = "red" }, finding = { "warn", "ConfigMap {key} is red" } } },
  walk = function(ctx) ctx:finding("info", "walked") end,
}]]
    it("each object the selection selects is the declared finding, after the walk", function()
      h:reset { FIXTURE }
      local res = h:migrate(migration(FLAG:format("false")), { mode = "check" })
      local got = {}
      for i, f in ipairs(res.findings) do got[i] = f.severity .. " " .. f.message end
      assert.same({ "info walked", "warn ConfigMap cozy-system/tenant-b is red" }, got)
      assert.equal("tenant-b", res.findings[2].fields.name)
      assert.same({}, h:writes())
      -- in a run, a warning line
      assert.same({ "finding: ConfigMap cozy-system/tenant-b is red" },
        messages(h:migrate(migration(FLAG:format("false"))), "warn"))
    end)

    it("check_only: said in check alone", function()
      h:reset { FIXTURE }
      local m = migration(FLAG:format("true"))
      assert.equal(2, #h:migrate(m, { mode = "check" }).findings)
      assert.same({}, messages(h:migrate(m), "warn"))
    end)

    it("is checked at load time: its severity, its text, and never on a selection that edits", function()
      local rule = require "cozy.rule"
      for _, case in ipairs {
        { { finding = { "fatal", "x" } }, "select.x.finding[1]" },
        { { finding = { "warn" } }, "select.x.finding[2] must be" },
        { { edit = true, finding = { "warn", "x" } }, "select.x: a selection that edits declares no finding" },
      } do
        local decl = { "configmaps" }
        for k, v in pairs(case[1]) do decl[k] = v end
        local ok, err = pcall(rule, { description = "d", walk = function() end, select = { x = decl } })
        assert.is_false(ok)
        assert.matches(case[2], tostring(err), 1, true)
      end
    end)
  end)

  describe("what the edits landed", function()
    it("counts:sum adds a field of each: an array by its length, a number as it is", function()
      h:reset { FIXTURE }
      local m = migration [[
return require("cozy.rule") {
  description = "tier",
  select = { cms = { "configmaps", namespace = "cozy-system", edit = true,
    where = { ["metadata.name"] = "tenant-*" } } },
  walk = function(ctx, s)
    local done = s.cms:each(function(c)
      if c.metadata.name == "tenant-c" then return nil end
      c.data.tier = "standard"
      return { names = { c.metadata.name, "x" }, weight = 3 }
    end)
    ctx.log:info(("sum %d %d %d"):format(done:sum("names"), done:sum("weight"), done:sum("none")))
  end,
}]]
      assert.same({ "sum 4 6 0" }, (function()
        local out = {}
        for _, l in ipairs(messages(h:migrate(m), "info")) do
          if l:find("^sum ") then out[#out + 1] = l end
        end
        return out
      end)())
    end)
  end)

  describe("refused", function()
    it("an edit returning false and why: one warning from the template, nothing sent, the others edited", function()
      local m = migration [[
local obj = require "cozy.obj"
return require("cozy.rule") {
  description = "label",
  select = { cms = { "configmaps", namespace = "cozy-system", edit = true,
    where = { ["metadata.name"] = "tenant-*" }, refused = "configmap %s not labelled: %s" } },
  walk = function(_, s)
    s.cms:each(function(c)
      local key = c.metadata.name == "tenant-b" and "x/bad-" or "x/good"
      return obj.set_labels(c, { [key] = "", ["x/also"] = "" })
    end)
  end,
}]]
      local res = h:migrate(m)
      assert.same({ "PATCH tenant-a", "PATCH tenant-c" }, patched(h))
      local warns = messages(res, "warn")
      assert.equal(1, #warns)
      assert.matches('^configmap cozy%-system/tenant%-b not labelled: "x/bad%-": name part must', warns[1])
      assert.same({ team = "red" }, h:object("ConfigMap", NS, "tenant-b").metadata.labels)
      assert.same({ team = "blue", ["x/good"] = "", ["x/also"] = "" }, h:object("ConfigMap", NS, "tenant-a").metadata.labels)
    end)
  end)

  describe("say", function()
    it("a template of what the edit returned: each {field}, an array of named items by their names", function()
      local m = migration [[
return require("cozy.rule") {
  description = "tier",
  select = { cms = { "configmaps", namespace = "cozy-system", edit = true, where = { ["metadata.name"] = "tenant-a" },
    say = "{setting|would set} {keys} ({n}, {missing})" } },
  walk = function(_, s)
    s.cms:each(function(c)
      c.data.tier = "standard"
      return { keys = { { name = "tier" }, { name = "zone" } }, n = 2 }
    end)
  end,
}]]
      local plan = h:migrate(m, { mode = "plan" })
      assert.is_true(plan.log:find("ConfigMap cozy-system/tenant-a: would set tier,zone (2, {missing})", 1, true) ~= nil,
        plan.log)
      local res = h:migrate(m)
      assert.is_true(res.log:find("ConfigMap cozy-system/tenant-a: setting tier,zone (2, {missing})", 1, true) ~= nil,
        res.log)
    end)
  end)

  describe("join and skip", function()
    local JOIN = [[
return require("cozy.rule") {
  description = "join",
  select = { cms = { "configmaps", namespace = "cozy-system" },
    secrets = { "%s", unserved = "CRD {resource} is absent, nothing to join", noun = "Secret" } },
  walk = function(ctx, s)
    local joined = s.cms:join(s.secrets, { key = function(x) return x.metadata.name end })
    if not joined then return ctx.log:info("ended") end
    for c in joined do s.cms:skip(c, "no reason", c.metadata.name == "other") end
  end,
}]]

    it("a side not served: its unserved text is a finding in check, a line in run, and join returns nil", function()
      local m = migration(JOIN:format("widgets.example.com"))
      local res = h:migrate(m, { mode = "check" })
      assert.same({ "CRD widgets.example.com is absent, nothing to join" }, { res.findings[1].message })
      assert.equal(1, #res.findings)
      res = h:migrate(m)
      assert.is_true(res.log:find("CRD widgets.example.com is absent, nothing to join", 1, true) ~= nil)
      assert.is_true(res.log:find("ended", 1, true) ~= nil)
    end)

    it("skip: a debug line for each object left alone, and a finding in check for a notable one", function()
      local m = migration(JOIN:format("secrets"))
      local res = h:migrate(m, { mode = "check", verbosity = 1 })
      local notable = {}
      for _, f in ipairs(res.findings) do notable[#notable + 1] = f.message end
      assert.same({ "ConfigMap cozy-system/other is left alone: no reason" }, notable)
      local lines = messages(res, "debug")
      local skipped = 0
      for _, l in ipairs(lines) do
        if l:find("^ConfigMap cozy%-system/[%w-]+ left alone: no reason$") then skipped = skipped + 1 end
      end
      assert.equal(4, skipped)
    end)
  end)

  describe("rule.delete", function()
    local DELETE = [[
return require("cozy.rule").delete { "configmaps", namespace = "cozy-system", name = "other",
  description = "delete other once no tenant configmap is blue",
  unless = { "configmaps", label_selector = "team=blue" }%s }]]
    local LINES = [[,
  absent = "no other: nothing to remove", kept = "a blue tenant: other stays",
  deleting = "{Removing|Would remove} other: no blue tenant left (100% sure)"]]

    it("keeps the object while its guard lists any object, saying the declared line", function()
      local res = h:migrate(migration(DELETE:format(LINES)))
      assert.same({}, h:writes())
      assert.is_truthy(h:object("ConfigMap", NS, "other"))
      assert.is_true(res.log:find("a blue tenant: other stays", 1, true) ~= nil)
    end)

    it("deletes once the guard lists nothing, the delete's line worded for the mode", function()
      h:reset { { FIXTURE[1], FIXTURE[3], FIXTURE[5] } }
      local m = migration(DELETE:format(LINES))
      local plan = h:migrate(m, { mode = "plan" })
      assert.is_true(plan.log:find("Would remove other: no blue tenant left (100% sure)", 1, true) ~= nil)
      assert.same({}, h:writes())
      local res = h:migrate(m)
      assert.same({ "DELETE other" }, patched(h))
      assert.is_true(res.log:find("Removing other: no blue tenant left (100% sure)", 1, true) ~= nil)
      res = h:migrate(m)
      assert.is_true(res.log:find("no other: nothing to remove", 1, true) ~= nil)
    end)

    it("without declared lines, says what it keeps and why", function()
      local res = h:migrate(migration(DELETE:format("")))
      assert.same({}, h:writes())
      assert.is_true(res.log:find("configmaps cozy-system/other kept: configmaps still lists objects", 1, true) ~= nil)
    end)
  end)

  describe("rule.orphan", function()
    local FINALIZED = {
      FIXTURE[1], FIXTURE[5],
      cm("addon-a", { metadata = { name = "addon-a", namespace = NS, finalizers = { "example.com/uninstall" },
        labels = { chart = "addon" } } }),
      cm("addon-b", { metadata = { name = "addon-b", namespace = NS, finalizers = { "example.com/uninstall" },
        labels = { chart = "addon" } } }),
    }
    local ORPHAN = [[
return require("cozy.rule").orphan { "configmaps", description = "orphan the addon configmaps",
  where = { ["metadata.labels.chart"] = "addon" }, suspend = { data = { suspended = "true" } },
  noun = "addon ConfigMap", fields = { chart = "metadata.labels.chart" } }]]

    it("per object, in order: suspend, finalizers dropped, read back, delete; the rest untouched", function()
      h:reset { FINALIZED }
      local res = h:migrate(migration(ORPHAN))
      local sent = {}
      for _, r in ipairs(h:requests()) do
        local name = r.path:match("/configmaps/([%w-]+)$")
        if name then sent[#sent + 1] = r.method .. " " .. name end
      end
      assert.same({ "PATCH addon-a", "PATCH addon-a", "GET addon-a", "DELETE addon-a",
        "PATCH addon-b", "PATCH addon-b", "GET addon-b", "DELETE addon-b" }, sent)
      assert.is_nil(h:object("ConfigMap", NS, "addon-a"))
      assert.is_nil(h:object("ConfigMap", NS, "addon-b"))
      assert.is_truthy(h:object("ConfigMap", NS, "other"))
      assert.same({ orphaned = 2, gone = 0 }, res.outcome.counts)
      assert.is_true(res.log:find("Orphaning addon ConfigMap cozy-system/addon-a", 1, true) ~= nil)
      assert.is_true(res.log:find("Orphaned 2 addon ConfigMap(s), 0 already gone", 1, true) ~= nil)
    end)

    it("stops before the delete when a finalizer is back at the read, naming it", function()
      h:reset { FINALIZED }
      h:faults { { method = "GET", path = "/configmaps/addon-a(\\?|$)",
        bump = { merge = { metadata = { finalizers = { "example.com/uninstall" } } } } } }
      local err = h:migrate_error(migration(ORPHAN))
      assert.matches("ConfigMap cozy-system/addon-a still has finalizers [example.com/uninstall] after they"
        .. " were removed", err.message, 1, true)
      assert.is_truthy(h:object("ConfigMap", NS, "addon-a"))
      assert.is_truthy(h:object("ConfigMap", NS, "addon-b"))
      for _, r in ipairs(h:requests()) do assert.not_equal("DELETE", r.method) end
    end)

    it("check lists each object it would orphan with its fields, and writes nothing", function()
      h:reset { FINALIZED }
      local res = h:migrate(migration(ORPHAN), { mode = "check" })
      assert.same({}, h:writes())
      local got = {}
      for i, f in ipairs(res.findings) do got[i] = f.severity .. " " .. f.message end
      assert.same({ "info would orphan addon ConfigMap cozy-system/addon-a",
        "info would orphan addon ConfigMap cozy-system/addon-b" }, got)
      assert.equal("addon", res.findings[1].fields.chart)
    end)
  end)
end)

describe("a join by owner", function()
  teardown(function() files.rm_rf(dir) end) -- the last describe: the files are written at load
  local h = harness.fake { fixtures = { FIXTURE } }
  local JOIN = migration [[
return require("cozy.rule") {
  description = "pair secrets with their configmaps",
  select = { cms = { "configmaps", namespace = "cozy-system", noun = "CM" },
    secrets = { "secrets", namespace = "cozy-system", noun = "Secret",
      where = { ["metadata.labels.pair"] = "yes" } } },
  walk = function(ctx, s)
    local joined = s.cms:join(s.secrets, { owner = true, adopt = true })
    for c, secrets in joined do
      for _, x in ipairs(secrets) do ctx.log:info("pair " .. c.metadata.name .. " " .. x.metadata.name) end
    end
    ctx.log:info("read " .. joined:count() .. ", left " .. joined:count("left"))
  end,
}]]

  it("pairs by controller ownerReference and uid, adopts by name, and says why it leaves each other alone", function()
    local client = h:client("run")
    local cms, secrets = client:resource("v1", "configmaps"), client:resource("v1", "secrets")
    local a = cms:get(NS, "tenant-a")
    local function secret(name, refs, labels)
      secrets:create { metadata = { name = name, namespace = NS, ownerReferences = refs,
        labels = labels or { pair = "yes" } }, data = {} }
    end
    local function ref(kind, name, uid, api)
      return { { apiVersion = api or "v1", kind = kind, name = name, uid = uid, controller = true } }
    end
    secret("owned-by-a", ref("ConfigMap", "tenant-a", a.metadata.uid))
    secret("tenant-b", nil)                                              -- adopted by its name
    secret("earlier-a", ref("ConfigMap", "tenant-a", "0c2f1c1e-0000-4000-8000-000000000001"))
    secret("of-a-pod", ref("Pod", "p", "0c2f1c1e-0000-4000-8000-000000000002"))
    secret("of-gone", ref("ConfigMap", "gone", "0c2f1c1e-0000-4000-8000-000000000003"))
    secret("lonely", nil)
    secret("not-mine", ref("ConfigMap", "tenant-a", a.metadata.uid), { pair = "no" })
    client:close()
    local res = h:migrate(JOIN, { mode = "check", verbosity = 1 })
    local pairs_, debug = {}, {}
    for _, l in ipairs(res.lines) do
      if l.message:find("^pair ") then pairs_[#pairs_ + 1] = l.message end
      if l.level == "debug" and l.message:find(" left alone: ") then debug[#debug + 1] = l.message end
    end
    table.sort(pairs_)
    table.sort(debug)
    assert.same({ "pair tenant-a owned-by-a", "pair tenant-b tenant-b" }, pairs_)
    assert.same({
      "Secret cozy-system/earlier-a left alone: its ownerReference names uid"
        .. " 0c2f1c1e-0000-4000-8000-000000000001 but CM tenant-a has uid " .. a.metadata.uid,
      "Secret cozy-system/lonely left alone: it has no controller ownerReference and no CM of its name",
      "Secret cozy-system/of-a-pod left alone: its controller ownerReference is not of kind ConfigMap",
      "Secret cozy-system/of-gone left alone: its CM gone is gone",
    }, debug)
    -- the uid mismatch is the notable one: check names it
    assert.same({ "Secret cozy-system/earlier-a is left alone: its ownerReference names uid"
      .. " 0c2f1c1e-0000-4000-8000-000000000001 but CM tenant-a has uid " .. a.metadata.uid },
      { res.findings[1] and res.findings[1].message })
    assert.equal(1, #res.findings)
    assert.is_true(res.log:find("read 6, left 4", 1, true) ~= nil, res.log)
  end)
end)
