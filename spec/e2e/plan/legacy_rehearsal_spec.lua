-- A legacy script in a rehearsal (docs/operations.md, "Rehearsals"): it runs
-- in a network namespace of its own whose only address is the engine's
-- overlay endpoint, so its kubectl sees the overlay, its writes are judged
-- by the server with dryRun=All and listed with the step's, its stamp
-- decides the next step as in a run, and it can reach nothing real.
-- Runs on both servers.
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli

local DIR = "spec/fixtures/plan_legacy_rehearsal/"
local q = files.quote

-- the scripts' kubectl: the one the kubectl specs use, first in PATH
local KUBECTL_DIR = fake.kubectl_path:match("^(.*)/[^/]+$")
local PATH = (KUBECTL_DIR and (KUBECTL_DIR .. ":") or "") .. os.getenv("PATH")

local function fixture(version)
  return cli.fixture(version or 1, {
    cli.configmap("old", { original = "yes" }),
  })
end

local function plan(h, dir, env, ...)
  local e = { PATH = PATH }
  for k, v in pairs(env or {}) do e[k] = v end
  return h:cli(cli.args(h.srv, dir, "plan", ...), e)
end

-- nothing stored: every request a read or a dryRun=All write, no object changed, came or went
local function nothing_written(h, before)
  for _, req in ipairs(h:requests()) do
    if req.method ~= "GET" then
      assert.matches("dryRun=All", req.query or "", 1, true, req.method .. " " .. req.path)
    end
  end
  assert.same(before, cli.stored_versions(h))
end

-- a legacy script: `body` (shell lines) then, unless `stamps` is false, the
-- platform's stamp of version 2 with `kubectl apply`
local function script(body, stamps)
  local out = "#!/bin/sh\nset -euo pipefail\n" .. body .. "\n"
  if stamps == false then return out end
  return out .. [[
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
end

-- a Lua step 2 that labels ConfigMap `name` (it fails unless it finds it)
local LABEL = [[
return {
  description = "labels what step 1 left",
  permissions = { { verb = "get", group = "", resource = "configmaps" },
    { verb = "patch", group = "", resource = "configmaps" } },
  run = function(ctx)
    local cms = ctx.kube:resource("v1", "configmaps")
    local o = cms:get(ctx.namespace, "old")
    cms:merge_patch(ctx.namespace, "old", { metadata = { labels = { seen = o.data.patched or "no" } } })
  end,
}
]]

local function step_writes(evs, n)
  local out = {}
  for _, w in ipairs(cli.of_type(evs, "write")) do
    if w.step == n then out[#out + 1] = ("%s %s %s"):format(w.method, w.path, w.verdict) end
  end
  return out
end

describe("plan rehearses a legacy script", function()
  local h = harness.fake { fixtures = { fixture() } }
  local dir
  after_each(function() if dir then files.rm_rf(dir) end dir = nil end)

  it("serves its kubectl from the overlay: its writes listed and judged, the next step sees them", function()
    local before = cli.stored_versions(h)
    h:mark()
    local r = plan(h, DIR .. "writes", nil, "--log-format", "json")
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local evs = cli.json_lines(r.stdout)
    assert.is_true(cli.of_type(evs, "legacy")[1].rehearsal)
    -- the script's writes, as the step's: judged by the server
    local cv = "/api/v1/namespaces/cozy-system/configmaps/cozystack-version"
    assert.same({ "POST /api/v1/namespaces/cozy-system/configmaps admitted",
      "PATCH /api/v1/namespaces/cozy-system/configmaps/old admitted",
      "PATCH " .. cv .. " admitted", -- the script's own stamp (kubectl apply)
      "PATCH " .. cv .. " admitted", -- its history record
    }, step_writes(evs, 1))
    -- its kubectl read back what it created from the overlay
    assert.matches('"msg":"yes","stream":"stdout"', r.stderr, 1, true)
    -- step 2 was decided by the script's stamp, and saw what it created and patched
    local rehearsed = cli.of_type(evs, "rehearsed")
    assert.same({ 1, 2 }, { rehearsed[1].number, rehearsed[2].number })
    local w2 = cli.of_type(evs, "write")
    local label
    for _, w in ipairs(w2) do if w.step == 2 and w.body.metadata and w.body.metadata.labels then label = w end end
    assert.same({ seen = "yes-yes" }, label.body.metadata.labels)
    assert.equal("admitted", label.verdict)
    local summary = cli.of_type(evs, "summary")[1]
    assert.same({ 2, 0, 0, 0 }, { summary.rehearsal.steps_exact, summary.rehearsal.steps_inexact,
      summary.rehearsal.steps_not_rehearsed, summary.failures })
    nothing_written(h, before)
  end)

  it("decides the next step after a script that does not stamp as a run does", function()
    dir = cli.migration_dir { ["1-leaves"] = script([[
kubectl -n "$NAMESPACE" patch configmap old --type merge -p '{"data":{"patched":"left"}}'
echo "WARN: leaving CURRENT_VERSION at 1 for retry on next upgrade."]], false), ["2-label.lua"] = LABEL }
    local before = cli.stored_versions(h)
    h:mark()
    -- by default the run goes on: so does the rehearsal, step 2 seeing the script's patch
    local r = plan(h, dir, nil, "--log-format", "json")
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local evs = cli.json_lines(r.stdout)
    assert.matches("step did not stamp: the version stays", r.stderr, 1, true)
    local labels
    for _, w in ipairs(cli.of_type(evs, "write")) do
      if w.step == 2 and w.body.metadata then labels = w.body.metadata.labels end
    end
    assert.same({ seen = "left" }, labels)
    assert.equal(0, #cli.of_type(evs, "not_rehearsed"))
    -- under --strict-stamp the run would fail at step 1: the rehearsal says so, and goes no further
    r = plan(h, dir, nil, "--strict-stamp")
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("step 1 %(1%-leaves%) would fail: [^\n]*did not stamp 2 %(version is 1%) and %-%-strict%-stamp "
      .. "is set", r.stdout)
    assert.matches("step 2: 2%-label %(lua%): not rehearsed: step 1%-leaves would fail", r.stdout)
    nothing_written(h, before)
  end)

  it("lets the script reach nothing real: not the kubeconfig's server, the in-cluster address, nor its own", function()
    local host, port = h.srv.url:match("^https://([^:/]+):(%d+)")
    dir = cli.migration_dir { ["1-probes"] = script(table.concat({
      -- the in-cluster variables are gone from its environment
      'echo "in-cluster: ${KUBERNETES_SERVICE_HOST:-unset}:${KUBERNETES_SERVICE_PORT:-unset}"',
      -- the original kubeconfig's server, and an address the script computes, handed over in a file
      'for url in "$(cat live-url)" "https://$(cat live-host):$(cat live-port)"; do',
      '  curl -sk --max-time 5 "$url/api/v1/namespaces/isolation-probe" >/dev/null 2>&1'
        .. ' && echo "reached $url" || echo "unreachable $url"',
      'done',
      -- and through the in-cluster address the runner had
      "curl -sk --max-time 5 https://" .. host .. ":" .. port .. "/api/v1/namespaces/isolation-probe-env"
        .. " >/dev/null 2>&1 && echo reached-env || echo unreachable-env",
    }, "\n")) }
    files.write(dir .. "/live-url", h.srv.url)
    files.write(dir .. "/live-host", host)
    files.write(dir .. "/live-port", port)
    h:mark()
    local r = plan(h, dir, { KUBERNETES_SERVICE_HOST = host, KUBERNETES_SERVICE_PORT = port })
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("in-cluster: unset:unset", r.stderr, 1, true)
    assert.matches("unreachable " .. h.srv.url, r.stderr, 1, true)
    assert.matches(("unreachable https://%s:%s"):format(host, port), r.stderr, 1, true)
    assert.matches("unreachable-env", r.stderr, 1, true)
    assert.not_matches("reached", r.stderr:gsub("unreachable", ""), 1, true)
    -- the live server saw none of its requests
    for _, req in ipairs(h:requests()) do assert.not_matches("isolation%-probe", req.path) end
    -- and the rehearsal went on by the stamp it made through the endpoint
    assert.matches("rehearsal: steps 1 exact, 0 inexact, 0 not rehearsed", r.stdout, 1, true)
  end)

  it("answers kubectl exec and port-forward with a clear Status, and marks the step inexact", function()
    h:reset(cli.fixture(1, { cli.configmap("old", { original = "yes" }),
      -- the real server admits a Pod only with its service account (no controller makes it there)
      { apiVersion = "v1", kind = "ServiceAccount", metadata = { name = "default", namespace = "cozy-system" } },
      { apiVersion = "v1", kind = "Pod", metadata = { name = "worker", namespace = "cozy-system" },
        spec = { containers = { { name = "c", image = "busybox" } } }, status = { phase = "Running" } } }))
    dir = cli.migration_dir { ["1-execs"] = script(table.concat({
      'kubectl -n "$NAMESPACE" exec worker -- true || echo "exec refused"',
      'kubectl -n "$NAMESPACE" port-forward pod/worker 18080:80 || echo "port-forward refused"',
    }, "\n")) }
    local r = plan(h, dir)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("exec refused", r.stderr, 1, true)
    assert.matches("port-forward refused", r.stderr, 1, true)
    assert.matches("the overlay serves no exec", r.stderr, 1, true)
    -- kubectl tries a WebSocket (GET) then SPDY (POST) upgrade: each refused and said
    assert.matches("rehearsed inexactly:\n    GET /api/v1/namespaces/cozy-system/pods/worker/exec: the legacy "
      .. "script's exec cannot be rehearsed: the overlay serves no exec", r.stdout, 1, true)
    assert.matches("/pods/worker/portforward: the legacy script's port-forward cannot be rehearsed", r.stdout, 1, true)
    assert.matches("rehearsal: steps 0 exact, 1 inexact", r.stdout, 1, true)
  end)

  it("answers a watch with the rehearsal's state as ADDED events, then ends it, said inexact", function()
    dir = cli.migration_dir { ["1-watches"] = script([[
kubectl -n "$NAMESPACE" patch configmap old --type merge -p '{"data":{"patched":"watched"}}'
kubectl -n "$NAMESPACE" get configmap old -w -o jsonpath='{.data.patched}{"\n"}']]) }
    local r = plan(h, dir)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    -- the watch saw the overlay's object (the patch only the rehearsal holds), and ended
    assert.matches("INFO  watched migration=1-watches stream=stdout", r.stderr, 1, true)
    assert.matches("watch of /api/v1/namespaces/cozy-system/configmaps: answered with the rehearsal's state, "
      .. "then ended", r.stdout, 1, true)
  end)

  it("takes kubectl's protobuf create (kubectl create configmap), transcoded by the server", function()
    dir = cli.migration_dir { ["1-creates"] = script([[
kubectl -n "$NAMESPACE" create configmap made-by-create --from-literal=made=created
kubectl -n "$NAMESPACE" get configmap made-by-create -o jsonpath='{.data.made}{"\n"}']]) }
    local before = cli.stored_versions(h)
    h:mark()
    local r = plan(h, dir, nil, "--log-format", "json")
    if not h.srv.real then
      -- the fake server reads no protobuf: the create is refused, clearly, and the rehearsal says the step would fail
      assert.equal(1, r.code, r.stdout .. r.stderr)
      assert.matches('"type":"failure"', r.stdout, 1, true)
      nothing_written(h, before)
      return
    end
    assert.equal(0, r.code, r.stdout .. r.stderr)
    local evs = cli.json_lines(r.stdout)
    local created
    for _, w in ipairs(cli.of_type(evs, "write")) do
      if w.method == "POST" then created = w end
    end
    assert.same({ "/api/v1/namespaces/cozy-system/configmaps", "admitted", { made = "created" } },
      { created.path, created.verdict, created.body.data })
    assert.matches('"msg":"created","stream":"stdout"', r.stderr, 1, true)
    nothing_written(h, before)
  end)

  it("does not run a script where no network namespace can be had; later steps are not rehearsed", function()
    dir = cli.migration_dir { ["1-marks"] = script('touch "$(dirname "$0")/ran"'), ["2-label.lua"] = LABEL }
    local before = cli.stored_versions(h)
    -- a user namespace of the spec's own that may create none, and no CAP_SYS_ADMIN: as in most pods
    local args = {}
    for _, a in ipairs(cli.args(h.srv, dir, "plan")) do args[#args + 1] = q(a) end
    local r = cli.shell(("unshare -Ur sh -c %s"):format(q(("echo 0 >/proc/sys/user/max_user_namespaces && "
      .. "exec setpriv --bounding-set=-all --inh-caps=-all env PATH=%s %s %s"):format(q(PATH), q(cli.bin),
      table.concat(args, " ")))))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.is_nil(files.read(dir .. "/ran"))
    assert.matches("step 1: 1-marks (legacy): not rehearsed: no network namespace could be had (with a user "
      .. "namespace: No space left on device; without one: Operation not permitted); it was not run", r.stdout, 1,
      true)
    assert.matches("step 2: 2-label (lua): not rehearsed: it follows legacy script " .. dir
      .. "/1-marks, which was not rehearsed", r.stdout, 1, true)
    assert.matches("rehearsal: steps 0 exact, 0 inexact, 2 not rehearsed", r.stdout, 1, true)
    nothing_written(h, before)
  end)
end)
