-- What a plan shows (issue 36, section 3): per step each write with the
-- object it names and the server's verdict; at the end a unified diff of
-- each object created, changed or deleted, as YAML without the fields the
-- server sets; a summary with the why of each inexact step; `-o json` the
-- same as one document; exit 1 naming the refusal, -o json too. A Secret's
-- values are redacted in every one of them. Runs on both servers.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local DIR = "spec/fixtures/plan_output/changes"
local REFUSED = "spec/fixtures/plan_rehearsal/refused"
local RANGE = "spec/fixtures/plan_rehearsal/range"

-- the Secret's values before and after, plain and base64: none may be printed
local SECRET_VALUES = { "c2VjcmV0LW9sZA==", "secret-old", "c2VjcmV0LW5ldw==", "secret-new", "tok-plain-value",
  "dG9rLXBsYWluLXZhbHVl" }

local function fixture()
  local last_applied = json.encode { apiVersion = "v1", kind = "Secret",
    metadata = { name = "creds", namespace = "cozy-system" }, data = { password = "c2VjcmV0LW9sZA==" } }
  return cli.fixture(1, {
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "kept", namespace = "cozy-system" },
      data = { note = "to go", keep = "yes" } },
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "gone", namespace = "cozy-system" },
      data = { doomed = "1" } },
    -- for RANGE, which replaces it
    { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "old", namespace = "cozy-system" },
      data = { original = "yes" } },
    { apiVersion = "v1", kind = "Secret", metadata = { name = "creds", namespace = "cozy-system",
      annotations = { ["kubectl.kubernetes.io/last-applied-configuration"] = last_applied } },
      type = "Opaque", data = { password = "c2VjcmV0LW9sZA==", user = "YWRtaW4=" } },
  })
end

local function assert_no_secret(out)
  for _, v in ipairs(SECRET_VALUES) do
    assert.is_nil(out:find(v, 1, true), v .. " printed:\n" .. out)
  end
end

-- the lines of one object's block in the text output, from its "object ..." line to the next blank-free header
local function block(stdout, header)
  local lines, out, inside = cli.lines(stdout), {}, false
  for _, l in ipairs(lines) do
    if l == header then inside = true
    elseif inside and (l:match("^object ") or l:match("^plan:")) then break end
    if inside then out[#out + 1] = l end
  end
  return out
end

local SERVER_SET = { "resourceVersion:", "uid:", "managedFields:", "generation:", "creationTimestamp:",
  "deletionTimestamp:", "rehearsal%-" }

describe("plan shows", function()
  local h = harness.fake { fixtures = { fixture() } }

  it("a unified diff of each object created, changed and deleted, without server-set fields", function()
    local r = h:cli(cli.args(h.srv, DIR, "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.same({
      "object created: ConfigMap cozy-system/new",
      "--- live/v1.ConfigMap.cozy-system.new",
      "+++ planned/v1.ConfigMap.cozy-system.new",
      "@@ -0,0 +1,7 @@",
      "+apiVersion: v1",
      "+data:",
      "+  greeting: hello",
      "+kind: ConfigMap",
      "+metadata:",
      "+  name: new",
      "+  namespace: cozy-system",
    }, block(r.stdout, "object created: ConfigMap cozy-system/new"))
    assert.same({
      "object changed: ConfigMap cozy-system/kept",
      "--- live/v1.ConfigMap.cozy-system.kept",
      "+++ planned/v1.ConfigMap.cozy-system.kept",
      "@@ -1,7 +1,7 @@",
      " apiVersion: v1",
      " data:",
      "   keep: \"yes\"",
      "-  note: to go",
      "+  mode: \"on\"",
      " kind: ConfigMap",
      " metadata:",
      "   name: kept",
    }, block(r.stdout, "object changed: ConfigMap cozy-system/kept"))
    assert.same({
      "object deleted: ConfigMap cozy-system/gone",
      "--- live/v1.ConfigMap.cozy-system.gone",
      "+++ planned/v1.ConfigMap.cozy-system.gone",
      "@@ -1,7 +0,0 @@",
      "-apiVersion: v1",
      "-data:",
      "-  doomed: \"1\"",
      "-kind: ConfigMap",
      "-metadata:",
      "-  name: gone",
      "-  namespace: cozy-system",
    }, block(r.stdout, "object deleted: ConfigMap cozy-system/gone"))
    -- the stamp is a change the run makes too
    assert.matches("\nobject changed: ConfigMap cozy%-system/cozystack%-version\n", r.stdout)
    for _, l in ipairs(cli.lines(r.stdout)) do
      if l:match("^[-+ ]") and not l:match("^  ") then
        for _, f in ipairs(SERVER_SET) do assert.is_nil(l:find(f), l) end
      end
    end
    assert.matches("objects 2 created, 3 changed, 1 deleted", r.stdout)
  end)

  it("each write with the object it names and the server's verdict", function()
    local r = h:cli(cli.args(h.srv, DIR, "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("\n  POST /api/v1/namespaces/cozy%-system/configmaps%?dryRun=All[^\n]*\n    object: ConfigMap "
      .. "cozy%-system/new\n", r.stdout)
    assert.matches("\n  DELETE /api/v1/namespaces/cozy%-system/configmaps/gone%?dryRun=All[^\n]*\n    object: "
      .. "ConfigMap cozy%-system/gone\n", r.stdout)
  end)

  it("a Secret's values redacted in the diff, a changed one said changed, in every format", function()
    local r = h:cli(cli.args(h.srv, DIR, "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert_no_secret(r.stdout .. r.stderr)
    local b = table.concat(block(r.stdout, "object changed: Secret cozy-system/creds"), "\n")
    assert.matches("\n%-  password: <redacted>\n%+  password: '<redacted: changed>'\n", b)
    assert.matches("\n   user: <redacted>\n", b)
    -- a Secret created: each of its values is new
    local fresh = table.concat(block(r.stdout, "object created: Secret cozy-system/fresh"), "\n")
    assert.matches("\n%+  token: '<redacted: changed>'", fresh)
    for _, format in ipairs { { "-o", "json" }, { "--log-format", "json" } } do
      local rj = h:cli(cli.args(h.srv, DIR, "plan", format[1], format[2]))
      assert.equal(0, rj.code, rj.stdout .. rj.stderr)
      assert_no_secret(rj.stdout .. rj.stderr)
      assert.matches("<redacted: changed>", rj.stdout)
    end
  end)

  it("-o json: one document of steps, writes, verdicts, objects and summary", function()
    local r = h:cli(cli.args(h.srv, DIR, "plan", "-o", "json"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local doc = json.decode(r.stdout)
    assert.equal(0, doc.exit)
    assert.same({ current = 1, target = 2, steps = 1, server_dry_run = false, type = "plan" }, doc.plan)
    assert.equal(1, #doc.steps)
    local s = doc.steps[1]
    assert.equal("1-changes", s.name)
    assert.is_true(#s.writes >= 6)
    for _, w in ipairs(s.writes) do
      assert.equal("admitted", w.verdict)
      assert.is_string(w.object.kind)
      assert.is_string(w.object.name)
    end
    assert.same({ kind = "ConfigMap", namespace = "cozy-system", name = "new" }, s.writes[1].object)
    assert.same({ exact = true }, s.rehearsed)
    local by_name = {}
    for _, o in ipairs(doc.objects) do by_name[o.action .. " " .. o.name] = o end
    local created, changed, deleted = by_name["created new"], by_name["changed kept"], by_name["deleted gone"]
    assert.is_nil(created.before)
    assert.same({ greeting = "hello" }, created.after.data)
    assert.same({ keep = "yes", note = "to go" }, changed.before.data)
    assert.same({ keep = "yes", mode = "on" }, changed.after.data)
    assert.is_nil(changed.after.metadata.resourceVersion)
    assert.is_nil(changed.after.metadata.uid)
    assert.is_nil(changed.after.metadata.managedFields)
    assert.is_nil(deleted.after)
    assert.equal("--- live/v1.ConfigMap.cozy-system.gone", deleted.diff[1])
    assert.same({ steps_exact = 1, steps_inexact = 0, steps_not_rehearsed = 0, writes_admitted = #s.writes,
      writes_refused = 0, writes_not_validated = 0, created = 2, changed = 3, deleted = 1 }, doc.summary.rehearsal)
  end)

  it("exit 1 with -o json naming the failing step and the server's refusal", function()
    local r = h:cli(cli.args(h.srv, REFUSED, "plan", "-o", "json"))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    local doc = json.decode(r.stdout)
    assert.equal(1, doc.exit)
    local s = doc.steps[1]
    assert.matches("^POST /api/v1/namespaces/cozy%-system/configmaps%?dryRun=All: Invalid %(422%)", s.failure.error)
    assert.equal("refused", s.writes[1].verdict)
    assert.is_string(s.writes[1].message)
    assert.equal("step 1-refused would fail", doc.steps[2].not_rehearsed)
    assert.same({ { number = 2, name = "2-after", why = "step 1-refused would fail" } },
      doc.summary.why.not_rehearsed)
  end)

  it("the why of each inexact step in the summary, text and -o json", function()
    local r = h:cli(cli.args(h.srv, RANGE, "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("\nrehearsal: steps 0 exact, 2 inexact[^\n]*\n  inexact: step 1 %(1%-create%): configmaps "
      .. "rehearsal%-made/made validated in namespace cozy%-system: its own namespace exists only in the rehearsal\n",
      r.stdout)
    local j = h:cli(cli.args(h.srv, RANGE, "plan", "-o", "json"))
    assert.equal(0, j.code, j.stdout .. j.stderr)
    local why = json.decode(j.stdout).summary.why
    assert.equal(2, #why.inexact)
    assert.same({ number = 1, name = "1-create" }, { number = why.inexact[1].number, name = why.inexact[1].name })
    assert.matches("validated in namespace cozy%-system", why.inexact[1].why[1])
  end)

  it("no diff, and why, for a live object the engine may not read first #fakeonly", function()
    h:faults { { method = "GET", path = "^/api/v1/namespaces/cozy-system/configmaps/gone$", status = { code = 403,
      reason = "Forbidden", message = "configmaps \"gone\" is forbidden: no get" } } }
    local r = h:cli(cli.args(h.srv, DIR, "plan"))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.equal(1, #h:fired())
    -- neither the live object nor the delete's answer (a Status here) gives its kind: the resource stands in
    assert.same({ "object deleted: configmaps cozy-system/gone",
      '  no diff: the live object could not be read: configmaps "gone" is forbidden: no get' },
      block(r.stdout, "object deleted: configmaps cozy-system/gone"))
  end)

  it("exit 2 on a bad -o, nothing on stdout", function()
    local r = h:cli(cli.args(h.srv, DIR, "plan", "-o", "yaml"))
    assert.equal(2, r.code, r.stdout .. r.stderr)
    assert.equal("", r.stdout)
  end)
end)
