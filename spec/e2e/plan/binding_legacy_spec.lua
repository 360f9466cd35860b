-- A saved plan that holds a legacy script (docs/operations.md, "A saved
-- plan"): `plan --save` records what the script read and wrote through the
-- engine's endpoint; `run --plan` runs the script in a network namespace of
-- its own whose one address is that endpoint, forwarding each request to the
-- cluster through the run's client, so each of its writes is held to the
-- plan's and the first that differs is not sent. Runs on both servers.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local q = files.quote
local CV = "/api/v1/namespaces/cozy-system/configmaps/cozystack-version"

-- the scripts' kubectl: the one the kubectl specs use, first in PATH
local KUBECTL_DIR = fake.kubectl_path:match("^(.*)/[^/]+$")
local PATH = (KUBECTL_DIR and (KUBECTL_DIR .. ":") or "") .. os.getenv("PATH")

local function fixture()
  return cli.fixture(1, {
    cli.configmap("source", { value = "a" }),
    cli.configmap("old", { original = "yes" }),
    cli.configmap("later", { original = "yes" }),
  })
end

-- Step 1, a script: reads ConfigMap source, patches old, creates `made`
-- (kubectl apply) with source's value and the word in the file `suffix` next
-- to it (outside the cluster: what the plan cannot bind), patches later, then
-- stamps 2 (kubectl apply, as the platform's scripts do). A refused write is
-- said and the script goes on, so that only the engine keeps it from the
-- cluster. The word "skip" leaves `made` out; a file `no-stamp` next to it,
-- the stamp; a file `ignore-term` has it (and its kubectl) ignore SIGTERM.
-- Step 2, Lua, labels `made`.
local SCRIPT = [[#!/bin/sh
set -euo pipefail
if [ -e "$(dirname "$0")/ignore-term" ]; then trap '' TERM; fi
touch "$(dirname "$0")/ran"
curl -sk --max-time 5 "$(cat "$(dirname "$0")/live-url")/api/v1/namespaces/bound-probe" >/dev/null 2>&1 \
  && echo "reached the live server" || echo "the live server is unreachable"
value=$(kubectl -n "$NAMESPACE" get configmap source -o jsonpath='{.data.value}')
suffix=$(cat "$(dirname "$0")/suffix")
kubectl -n "$NAMESPACE" patch configmap old --type merge -p '{"data":{"patched":"yes"}}'
if [ "$suffix" != skip ]; then
kubectl apply -f - <<END || echo "made refused"
apiVersion: v1
kind: ConfigMap
metadata:
  name: made
  namespace: $NAMESPACE
data:
  copied: "$value-$suffix"
END
fi
kubectl -n "$NAMESPACE" patch configmap later --type merge -p '{"data":{"after":"yes"}}' || echo "later refused"
[ -e "$(dirname "$0")/no-stamp" ] && exit 0
kubectl apply -f - <<END
apiVersion: v1
kind: ConfigMap
metadata:
  name: cozystack-version
  namespace: $NAMESPACE
data:
  version: "2"
END
]]

local LABEL = [[
return {
  description = "labels what the script made",
  permissions = { { verb = "patch", group = "", resource = "configmaps" } },
  run = function(ctx)
    ctx.kube:resource("v1", "configmaps"):merge_patch(ctx.namespace, "made",
      { metadata = { labels = { seen = "step-2" } } })
  end,
}
]]

local function migrations(h, suffix)
  local dir = cli.migration_dir { ["1-copies"] = SCRIPT, ["2-label.lua"] = LABEL }
  files.write(dir .. "/suffix", suffix)
  files.write(dir .. "/live-url", h.srv.url)
  return dir
end

local function cozy_with_path(h, dir, ...)
  return h:cli(cli.args(h.srv, dir, ...), { PATH = PATH })
end

local function plan_file(h, dir)
  local path = cli.tmpdir() .. "/plan.json"
  local r = cozy_with_path(h, dir, "plan", "--save", path)
  assert.equal(0, r.code, r.stdout .. r.stderr)
  return path, json.decode(assert(files.read(path)))
end

local function without_query(p) return (tostring(p):gsub("%?.*$", "")) end

-- the run's writes to the cluster, leaving out the lock's Lease and Events: "METHOD path"
local function migration_writes(h)
  local out = {}
  for _, w in ipairs(h:writes()) do
    local p = without_query(w.path)
    if not p:match("/leases") and not p:match("/events$") then out[#out + 1] = w.method .. " " .. p end
  end
  return out
end

local function planned_writes(doc)
  local out = {}
  for _, s in ipairs(doc.steps) do
    for _, w in ipairs(s.writes) do out[#out + 1] = w.method .. " " .. without_query(w.path) end
  end
  return out
end

-- the run's requests after the first `method` of `path`: "METHOD path",
-- leaving out the lock's Lease and Events
local function requests_after(h, method, path)
  local out, seen = {}, false
  for _, r in ipairs(h:requests()) do
    local p = without_query(r.path)
    if seen and not p:match("/leases") and not p:match("/events$") then out[#out + 1] = r.method .. " " .. p end
    if r.method == method and p == path then seen = true end
  end
  assert(seen, method .. " " .. path .. " was not sent")
  return out
end

-- the last record of the stamp's history
local function last(h)
  local _, cm = cli.version(h.srv)
  local history = cli.history(cm)
  return history[#history]
end

describe("run --plan with a legacy script", function()
  local h = harness.fake { fixtures = { fixture() } }
  local dir
  before_each(function() h:reset(fixture()) end)
  after_each(function() if dir then files.rm_rf(dir) end dir = nil end)

  it("records the script's reads and writes, runs it as planned, and the history counts its writes", function()
    dir = migrations(h, "one")
    local path, doc = plan_file(h, dir)
    assert.equal("legacy", doc.migrations[1].kind)
    -- what the script read from the live cluster is bound
    local read = {}
    for _, r in ipairs(doc.reads) do read[r.path] = r.resourceVersion end
    assert.equal(h:object("ConfigMap", "cozy-system", "source").metadata.resourceVersion,
      read["/api/v1/namespaces/cozy-system/configmaps/source"])
    -- what it wrote is the plan's, each marked the script's
    local script_writes = {}
    for _, w in ipairs(doc.steps[1].writes) do
      if w.script then script_writes[#script_writes + 1] = w.method .. " " .. without_query(w.path) end
    end
    assert.same({ "PATCH /api/v1/namespaces/cozy-system/configmaps/old",
      "POST /api/v1/namespaces/cozy-system/configmaps",
      "PATCH /api/v1/namespaces/cozy-system/configmaps/later",
      "PATCH " .. CV }, script_writes)
    os.remove(dir .. "/ran")
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.truthy(files.read(dir .. "/ran"))
    -- it talked to the cluster only through the engine
    assert.matches("the live server is unreachable", r.stderr, 1, true)
    for _, req in ipairs(h:requests()) do assert.not_matches("bound%-probe", req.path) end
    assert.same(planned_writes(doc), migration_writes(h))
    assert.equal(3, (cli.version(h.srv)))
    assert.equal("a-one", h:object("ConfigMap", "cozy-system", "made").data.copied)
    assert.equal("step-2", h:object("ConfigMap", "cozy-system", "made").metadata.labels.seen)
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "later").data.after)
    local _, cm = cli.version(h.srv)
    local history = cli.history(cm)
    assert.same({ 1, "1-copies", 4 }, { history[1].number, history[1].name, history[1].writes })
    -- a Lua step's writes are its own business (its outcome): no count
    assert.is_nil(history[2].writes)
    local st = h:cli({ "status", "--no-builtin", "--migrations", dir })
    assert.equal(0, st.code, st.stdout .. st.stderr)
    assert.matches("1 %-> 2  1%-copies [^\n]*\n        script writes: 4 %(run %-%-plan%)\n  2 %-> 3  2%-label", st.stdout)
  end)

  it("stops the script before its first write that differs: unsent, nothing after it, exit 1", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    -- what the script writes now depends on a value the plan could not bind
    files.write(dir .. "/suffix", "two")
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("legacy script [^\n]*/1%-copies stopped: step 1's write differs from the plan: expected the "
      .. "script's POST /api/v1/namespaces/cozy%-system/configmaps[^\n]*, got the script's POST "
      .. "/api/v1/namespaces/cozy%-system/configmaps[^\n]*; not sent; its process group was stopped", r.stderr)
    assert.matches("version stays at 1", r.stderr)
    -- the write before it went through; the one that differs and all after it did not reach the server
    assert.equal("yes", h:object("ConfigMap", "cozy-system", "old").data.patched)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "made"))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "later").data.after)
    -- after the last write that matched: kubectl apply's reads before its write, then nothing of the
    -- script (not a read of `later`); the failure's record the one write
    local after = {}
    for _, req in ipairs(requests_after(h, "PATCH", "/api/v1/namespaces/cozy-system/configmaps/old")) do
      if not req:match("^GET ") or req:match("/later") then after[#after + 1] = req end
    end
    assert.same({ "PATCH " .. CV }, after)
    -- after the stop: the failure's history record only (and the lock's release)
    assert.same({ "PATCH /api/v1/namespaces/cozy-system/configmaps/old", "PATCH " .. CV }, migration_writes(h))
    assert.equal(1, (cli.version(h.srv)))
    local rec = last(h)
    assert.same({ "failed", "1-copies" }, { rec.result, rec.name })
    assert.matches("differs from the plan", rec.error.message, 1, true)
  end)

  it("answers a script that outlives the stop with the refusal, sending none of its later requests", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    files.write(dir .. "/suffix", "two")
    -- SIGTERM ignored: its kubectl reads the answer, and the script goes on until it ends or gets SIGKILL
    files.write(dir .. "/ignore-term", "")
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    -- the differing write answered with a clear Status, as kubectl prints it
    assert.matches("Error from server (Forbidden): cozy-migrate run --plan: step 1's write differs from the plan: "
      .. "expected the script's POST", r.stderr, 1, true)
    -- the request after it answered the same, unsent
    assert.matches("nothing more is sent", r.stderr, 1, true)
    assert.matches("later refused", r.stderr, 1, true)
    assert.matches("legacy script [^\n]*/1%-copies stopped: step 1's write differs from the plan", r.stderr)
    assert.is_nil(h:object("ConfigMap", "cozy-system", "made"))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "later").data.after)
    assert.same({ "PATCH /api/v1/namespaces/cozy-system/configmaps/old", "PATCH " .. CV }, migration_writes(h))
    for _, req in ipairs(requests_after(h, "PATCH", "/api/v1/namespaces/cozy-system/configmaps/old")) do
      assert.not_matches("/later", req)
    end
    assert.equal(1, (cli.version(h.srv)))
  end)

  it("stops a script that skips a planned write at its stamp, which is not sent", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    files.write(dir .. "/suffix", "skip")
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 wrote fewer than planned: the stamp comes before the planned write the script's POST "
      .. "/api/v1/namespaces/cozy%-system/configmaps", r.stderr)
    assert.equal(1, (cli.version(h.srv)))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "made"))
    -- the script's own stamp (kubectl apply's PATCH) was never sent: only the failure's record
    local stamps = {}
    for _, w in ipairs(h:writes()) do
      if without_query(w.path) == CV then stamps[#stamps + 1] = w.query or "" end
    end
    assert.equal(1, #stamps)
    assert.not_matches("kubectl", stamps[1])
  end)

  it("fails a script that ends without its planned stamp, before the engine's record", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    files.write(dir .. "/no-stamp", "")
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 wrote fewer than planned: the planned write the script's stamp PATCH " .. CV:gsub("%-", "%%-")
      .. "[^\n]* %(version 2%) was not made", r.stderr)
    -- its writes before went through, as planned; the version stays, and no unstamped record says otherwise
    assert.equal("a-one", h:object("ConfigMap", "cozy-system", "made").data.copied)
    assert.equal(1, (cli.version(h.srv)))
    assert.equal("failed", last(h).result)
  end)

  it("forwards kubectl's protobuf create (kubectl create configmap) as its plan recorded it", function()
    dir = cli.migration_dir { ["1-creates"] = [[#!/bin/sh
set -euo pipefail
kubectl -n "$NAMESPACE" create configmap made-by-create --from-literal=made=created
kubectl -n "$NAMESPACE" patch configmap cozystack-version --type merge -p '{"data":{"version":"2"}}'
]] }
    local path = cli.tmpdir() .. "/plan.json"
    local p = cozy_with_path(h, dir, "plan", "--save", path)
    if not h.srv.real then
      -- the fake server reads no protobuf: the rehearsal's create is refused, so the plan binds nothing
      assert.equal(1, p.code, p.stdout .. p.stderr)
      local r = cozy_with_path(h, dir, "run", "--plan", path)
      assert.equal(2, r.code, r.stdout .. r.stderr)
      assert.matches("were not rehearsed", r.stderr, 1, true)
      return
    end
    assert.equal(0, p.code, p.stdout .. p.stderr)
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.same({ made = "created" }, h:object("ConfigMap", "cozy-system", "made-by-create").data)
    assert.equal(2, (cli.version(h.srv)))
    assert.equal(2, last(h).writes)
  end)

  it("refuses to start when an object the script read changed since the plan, writing nothing", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    local cms = h:client():resource("v1", "configmaps")
    cms:change(cms:get("cozy-system", "source"), function(c) c.data.value = "b" end)
    os.remove(dir .. "/ran")
    local before = cli.stored_versions(h, { Lease = true })
    h:mark()
    local r = cozy_with_path(h, dir, "run", "--plan", path)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("the plan does not bind this cluster: /api/v1/namespaces/cozy%-system/configmaps/source changed "
      .. "since the plan read it", r.stderr)
    assert.same({}, h:writes())
    assert.same(before, cli.stored_versions(h, { Lease = true }))
    assert.is_nil(files.read(dir .. "/ran"))
  end)

  it("does not run the script where no network namespace can be had: exit 1, nothing of it sent", function()
    dir = migrations(h, "one")
    local path = plan_file(h, dir)
    os.remove(dir .. "/ran")
    -- a user namespace of the spec's own that may create none, and no CAP_SYS_ADMIN: as in most pods
    local args = {}
    for _, a in ipairs(cli.args(h.srv, dir, "run", "--plan", path)) do args[#args + 1] = q(a) end
    h:mark()
    local r = cli.shell(("unshare -Ur sh -c %s"):format(q(("echo 0 >/proc/sys/user/max_user_namespaces && "
      .. "exec setpriv --bounding-set=-all --inh-caps=-all env PATH=%s %s %s"):format(q(PATH), q(cli.bin),
      table.concat(args, " ")))))
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("legacy script " .. dir .. "/1-copies not run: a run bound to a plan (--plan) holds a script's "
      .. "writes to the plan's by serving its requests itself, in a network namespace of the script's own, and no "
      .. "network namespace could be had", r.stderr, 1, true)
    assert.is_nil(files.read(dir .. "/ran"))
    assert.is_nil(h:object("ConfigMap", "cozy-system", "old").data.patched)
    -- only the failure's record
    assert.same({ "PATCH " .. CV }, migration_writes(h))
    assert.equal(1, (cli.version(h.srv)))
  end)
end)
