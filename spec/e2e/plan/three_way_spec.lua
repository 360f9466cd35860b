-- A rehearsal's three-way merge (issue 36, "Writes"; docs/operations.md,
-- "Rehearsals"): a strategic merge or apply patch of an object an earlier
-- step changed is sent with dryRun=All to the live object, and the server's
-- answer merged with the overlay's version. Two servers loaded from one
-- fixture: `plan -o json` on A, `run` on B; each object the plan does not
-- mark inexact ends on B as predicted (server-set fields aside), and a
-- conflict is marked inexact naming its field. Runs on both servers; the
-- fake's apply replaces lists whole (spec/support/README.md), and there the
-- apply case holds the Deployment to being marked inexact.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

-- the scripts' kubectl: the one the kubectl specs use, first in PATH
local KUBECTL_DIR = fake.kubectl_path:match("^(.*)/[^/]+$")
local PATH = (KUBECTL_DIR and (files.absolute(KUBECTL_DIR) .. ":") or "") .. os.getenv("PATH")

local FIXTURE = cli.fixture(1, {
  { apiVersion = "apps/v1", kind = "Deployment",
    metadata = { name = "api", namespace = "cozy-system", labels = { app = "api" } },
    spec = { replicas = 1, selector = { matchLabels = { run = "api" } },
      template = { metadata = { labels = { run = "api" } }, spec = { containers = {
        { name = "app", image = "nginx:1.27", env = { { name = "MODE", value = "one" } } },
        { name = "sidecar", image = "busybox:1.36", args = { "sleep", "infinity" } } } } } } },
  cli.configmap("settings", { a = "1", keep = "yes" }),
  cli.configmap("guarded", { g = "1" }),
})

-- Step 1 (Lua) changes what the later steps patch: the sidecar's image, MODE's value and a label of api; a
-- value and a new key of settings; a finalizer of guarded; and creates ConfigMap "fresh" and Deployment
-- "made", which only the overlay holds.
local CHANGE = [[
return {
  description = "changes api, settings and guarded; creates fresh",
  permissions = {
    { verb = "get", group = "apps", resource = "deployments" },
    { verb = "update", group = "apps", resource = "deployments" },
    { verb = "patch", group = "apps", resource = "deployments" },
    { verb = "get", group = "", resource = "configmaps" },
    { verb = "update", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" },
    { verb = "create", group = "", resource = "configmaps" },
    { verb = "create", group = "apps", resource = "deployments" },
  },
  run = function(ctx)
    local deps = ctx.kube:resource("apps/v1", "deployments")
    deps:change(deps:get(ctx.namespace, "api"), function(d)
      d.metadata.labels.tier = "back"
      local c = d.spec.template.spec.containers
      c[1].env[1].value = "uno"
      c[2].image = "busybox:1.37"
    end)
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:change(cms:get(ctx.namespace, "settings"), function(c) c.data.a = "2" c.data.b = "x" end)
    cms:change(cms:get(ctx.namespace, "guarded"), function(c) c.metadata.finalizers = { "example.com/one" } end)
    cms:create { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "fresh", namespace = ctx.namespace },
      data = { made = "yes" } }
    deps:create { apiVersion = "apps/v1", kind = "Deployment", metadata = { name = "made", namespace = ctx.namespace },
      spec = { replicas = 1, selector = { matchLabels = { run = "made" } },
        template = { metadata = { labels = { run = "made" } }, spec = { containers = {
          { name = "app", image = "nginx:1.27", env = { { name = "A", value = "a" }, { name = "B", value = "b" },
            { name = "C", value = "c" } } },
          { name = "sidecar", image = "busybox:1.36" } } } } } }
  end,
}
]]

local function script(...)
  return table.concat({ "#!/bin/sh", "set -eu", ... }, "\n") .. "\n"
end

local STAMP = [[kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge ]]
  .. [[-p "{\"data\":{\"version\":\"$((CURRENT_VERSION + 1))\"}}"]]

-- metadata the server sets, left out of both sides
local SERVER_SET = { "resourceVersion", "uid", "generation", "creationTimestamp", "managedFields", "selfLink" }

local function stripped(o)
  if type(o) ~= "table" then return o end
  o = json.decode(json.encode(o))
  for _, k in ipairs(SERVER_SET) do o.metadata[k] = nil end
  o.status = nil
  return o
end

local function stored(h, kind, name)
  for _, o in ipairs(h:objects()) do
    if o.kind == kind and o.metadata.namespace == "cozy-system" and o.metadata.name == name then return o end
  end
end

local function cozy_with_path(h, dir, ...)
  return h:cli(cli.args(h.srv, dir, ...), { PATH = PATH })
end

-- Rehearses dir on a, runs it on b; returns the plan's objects by "Kind name" and b.
local function rehearse_and_run(a, b, dir)
  local before = cli.stored_versions(a)
  local p = cozy_with_path(a, dir, "plan", "-o", "json")
  assert.same(before, cli.stored_versions(a))
  assert.equal(0, p.code, p.stdout .. p.stderr)
  local r = cozy_with_path(b, dir, "run")
  assert.equal(0, r.code, r.stdout .. r.stderr)
  local planned = {}
  for _, o in ipairs(json.decode(p.stdout).objects) do planned[o.kind .. " " .. o.name] = o end
  return planned
end

-- The planned object is exact and equals b's (the Deployment's status aside: no controller runs in either).
local function predicted(b, planned, kind, name)
  local o = planned[kind .. " " .. name]
  assert.is_not_nil(o, kind .. " " .. name .. " is not in the plan")
  assert.is_nil(o.inexact, kind .. " " .. name .. ": " .. tostring(o.inexact))
  local actual = stored(b, kind, name)
  assert.same(stripped(actual), stripped(o.after))
  return actual
end

describe("a rehearsal's three-way merge", function()
  local a = harness.fake { fixtures = { FIXTURE } }
  local b = harness.fake { fixtures = { FIXTURE } }
  local dir
  after_each(function() if dir then files.rm_rf(dir) end dir = nil end)

  it("predicts kubectl's strategic merge of what an earlier step changed, containers by name, exactly", function()
    dir = cli.migration_dir { ["1-change.lua"] = CHANGE, ["2-strategic"] = script(
      [[kubectl -n "$NAMESPACE" patch deployment api --type strategic -p '{"metadata":{"labels":{"team":"x"}},]]
        .. [["spec":{"template":{"spec":{"containers":[{"name":"app","image":"nginx:1.28",]]
        .. [["env":[{"name":"LEVEL","value":"two"}]}]}}}}']],
      -- a value the earlier step changed too: the patch sets it, in the run as here
      [[kubectl -n "$NAMESPACE" patch configmap settings --type strategic -p '{"data":{"a":"3","c":"new"}}']],
      -- only the overlay holds fresh: a strategic merge without lists is its merge patch
      [[kubectl -n "$NAMESPACE" patch configmap fresh --type strategic -p '{"metadata":{"labels":{"l":"v"}}}']],
      -- nor made: the engine merges its containers and env by name, in kube-apiserver's order
      [[kubectl -n "$NAMESPACE" patch deployment made --type strategic -p '{"spec":{"template":{"spec":{"containers":[]]
        .. [[{"name":"app","env":[{"name":"A","value":"1"},{"name":"N","value":"n"}]}]}}}}']],
      STAMP) }
    local planned = rehearse_and_run(a, b, dir)
    local api = predicted(b, planned, "Deployment", "api")
    assert.same({ app = "api", tier = "back", team = "x" }, api.metadata.labels)
    local c = api.spec.template.spec.containers
    assert.same({ "app", "nginx:1.28", "busybox:1.37" }, { c[1].name, c[1].image, c[2].image })
    -- kube-apiserver puts an element the patch adds before the ones it leaves (as the fake does)
    assert.same({ { name = "LEVEL", value = "two" }, { name = "MODE", value = "uno" } }, c[1].env)
    assert.same({ a = "3", b = "x", c = "new", keep = "yes" }, predicted(b, planned, "ConfigMap", "settings").data)
    assert.same({ l = "v" }, predicted(b, planned, "ConfigMap", "fresh").metadata.labels)
    local made = predicted(b, planned, "Deployment", "made").spec.template.spec.containers
    local env = {}
    for _, e in ipairs(made[1].env) do env[#env + 1] = e.name .. "=" .. e.value end
    assert.same({ "A=1", "N=n", "B=b", "C=c" }, env)
    assert.equal("sidecar", made[2].name)
  end)

  it("marks a field both changed inexact, naming it: the finalizers an earlier step set and the patch adds to",
    function()
      dir = cli.migration_dir { ["1-change.lua"] = CHANGE, ["2-strategic"] = script(
        [[kubectl -n "$NAMESPACE" patch configmap guarded --type strategic ]]
          .. [[-p '{"metadata":{"finalizers":["example.com/two"]},"data":{"h":"2"}}']],
        -- a directive over what the earlier step changed
        [[kubectl -n "$NAMESPACE" patch configmap settings --type strategic -p '{"data":{"$patch":"replace","z":"1"}}']],
        -- only the overlay holds made, and how the server merges tolerations is its schema's
        [[kubectl -n "$NAMESPACE" patch deployment made --type strategic ]]
          .. [[-p '{"spec":{"template":{"spec":{"tolerations":[{"key":"k","operator":"Exists"}]}}}}']],
        STAMP) }
      local planned = rehearse_and_run(a, b, dir)
      assert.matches("configmaps cozy%-system/guarded: a strategic merge patch of an object the rehearsal changed: "
        .. "both changed metadata%.finalizers %(three%-way merge%)", planned["ConfigMap guarded"].inexact)
      assert.matches("both changed data %(a patch directive%)", planned["ConfigMap settings"].inexact)
      assert.matches("the object exists only in the rehearsal: the server cannot apply the patch to it, nor the "
        .. "engine to the list spec%.template%.spec%.tolerations", planned["Deployment made"].inexact)
      -- what the run made: the finalizer merged into the earlier step's, which the plan could not know
      assert.same({ "example.com/two", "example.com/one" }, stored(b, "ConfigMap", "guarded").metadata.finalizers)
      assert.same({ z = "1" }, stored(b, "ConfigMap", "settings").data)
      predicted(b, planned, "Deployment", "api")
    end)

  it("predicts a server-side apply of what an earlier step changed; a field both set is named", function()
    dir = cli.migration_dir { ["1-change.lua"] = CHANGE, ["2-apply"] = script(
      "kubectl apply --server-side --force-conflicts --field-manager=migration -f - <<END",
      "apiVersion: apps/v1", "kind: Deployment", "metadata:", "  name: api", "  namespace: $NAMESPACE",
      "  labels:", "    applied: \"yes\"", "spec:", "  selector:", "    matchLabels:", "      run: api",
      "  template:", "    metadata:", "      labels:", "        run: api", "    spec:", "      containers:",
      "      - name: app", "        image: nginx:1.30", "END",
      "kubectl apply --server-side --force-conflicts --field-manager=migration -f - <<END",
      "apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: settings", "  namespace: $NAMESPACE",
      "data:", "  a: \"4\"", "END",
      -- fresh only the overlay holds: the server cannot apply to it, the engine does not know an apply's semantics
      "kubectl apply --server-side --field-manager=migration -f - <<END",
      "apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: fresh", "  namespace: $NAMESPACE",
      "data:", "  applied: \"yes\"", "END",
      STAMP) }
    local planned = rehearse_and_run(a, b, dir)
    if a.srv.real then
      local api = predicted(b, planned, "Deployment", "api")
      assert.same({ app = "api", tier = "back", applied = "yes" }, api.metadata.labels)
      local c = api.spec.template.spec.containers
      assert.same({ "nginx:1.30", "uno", "busybox:1.37" }, { c[1].image, c[1].env[1].value, c[2].image })
    else
      -- the fake's apply replaces a list whole (spec/support/README.md): the containers the earlier
      -- step changed and the apply's are a conflict there, named, never a wrong prediction
      assert.matches("a server%-side apply of an object the rehearsal changed: both changed "
        .. "spec%.template%.spec%.containers", planned["Deployment api"].inexact)
    end
    -- data.a: the earlier step's "2" and the apply's "4"; a forced apply takes it, an unforced one is refused
    assert.matches("a server%-side apply of an object the rehearsal changed: both changed data%.a",
      planned["ConfigMap settings"].inexact)
    assert.equal("4", stored(b, "ConfigMap", "settings").data.a)
    assert.matches("a application/apply%-patch%+yaml applied as a merge patch to the rehearsal's version %(the object "
      .. "exists only in the rehearsal: the server cannot apply the patch to it%)", planned["ConfigMap fresh"].inexact)
    assert.same({ made = "yes", applied = "yes" }, stored(b, "ConfigMap", "fresh").data)
  end)

  it("applies here what credentials that may not dry-run the patch send, marked inexact and not validated #fakeonly",
    function()
      a:deny { { verb = "patch", group = "apps", resource = "deployments" },
        { verb = "update", group = "apps", resource = "deployments" } }
      dir = cli.migration_dir { ["1-change.lua"] = CHANGE, ["2-strategic"] = script(
        [[kubectl -n "$NAMESPACE" patch deployment api --type strategic -p '{"metadata":{"labels":{"team":"x"}}}']],
        STAMP) }
      local before = cli.stored_versions(a)
      local p = cozy_with_path(a, dir, "plan")
      assert.same(before, cli.stored_versions(a))
      assert.equal(0, p.code, p.stdout .. p.stderr)
      assert.matches("deployments%.apps cozy%-system/api: a application/strategic%-merge%-patch%+json applied as a "
        .. "merge patch to the rehearsal's version %(the dry%-run patch of the live object was refused %(403%)%)", p.stdout)
      assert.matches("not validated by the server: the dry%-run write was refused %(403%)", p.stdout)
    end)
end)
