-- Least privilege, proven under real RBAC: the Roles and ClusterRole that
-- `cozy-migrate rbac` generates (the ones the chart ships) are applied to the
-- real kube-apiserver, and migrations 59 and 55 run under a ServiceAccount
-- token bound to them.
--
-- - With exactly that RBAC the run succeeds (a concurrent writer meets the
--   first write, so the re-read after a conflict is asked for too).
-- - With any one verb of any one rule taken away, the run fails, names what
--   was refused, and writes nothing past the refusal but the release of its
--   own lock and its Events; the version stays where it was. Without the
--   Events' create (best effort, docs/operations.md) the run succeeds, its
--   first Event refused and no other tried, and it is the Events that go.
-- - `check --service-account` (SubjectAccessReviews) reports exactly what
--   the server then refuses.
--
-- The real server alone can judge this: it runs as real/spec/real/rbac.
local harness = require "spec.helpers"
local json = require "cozy.json"
local cli = require("spec.helpers").cli
local rbac = require "cozy.rbac"

local NAMESPACE = "cozy-system"
local ACCOUNT = "cozystack-migration-hook"

-- What every authenticated user may do on any cluster, through the bootstrap
-- ClusterRoles system:discovery and system:basic-user: taking such a rule
-- out of ours cannot make a run fail. The spec checks the premise.
local function granted_to_everyone(rule, verb)
  if rule.nonResourceURLs then return verb == "get" end
  for _, r in ipairs(rule.resources or {}) do
    if (r == "selfsubjectaccessreviews" or r == "selfsubjectreviews") and verb == "create" then return true end
  end
  return false
end

local CASES = {
  { number = 59, fixture = "spec/fixtures/59-vmi-hotplug/cluster.json", from = "59", target = 60,
    writes = "/virtualmachines/" },
  { number = 55, fixture = "spec/fixtures/55-fluxcd-addon-orphan/cluster.json", from = "55", target = 56,
    writes = "/helmreleases/" },
}

---------------------------------------------------------------------------

-- The generated RBAC objects for the range up to `target`, as the admin
-- asks for them.
local function generated(h, target)
  local r = h:cli { "rbac", "--target", tostring(target), "--output", "json" }
  assert.equal(0, r.code, r.stderr)
  local doc = json.decode(r.stdout)
  return doc.items or doc
end

local PATHS = {
  ServiceAccount = "/api/v1/namespaces/%s/serviceaccounts",
  Role = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
  RoleBinding = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
  ClusterRole = "/apis/rbac.authorization.k8s.io/v1/clusterroles",
  ClusterRoleBinding = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}

local function apply(h, objects)
  for _, o in ipairs(objects) do
    local path = PATHS[o.kind]:format(o.metadata.namespace or "")
    local res = h.srv:request("POST", path, { body = o })
    assert(res.status == 201 or res.status == 409, ("creating %s %s: %d %s"):format(o.kind, o.metadata.name,
      res.status, res.body))
  end
end

-- The permissions the RBAC objects grant the account, as access reviews ask
-- them: { verb, group, resource, namespace (a Role's), name }.
local function grants(objects)
  local out = {}
  for _, o in ipairs(objects) do
    for _, rule in ipairs(o.rules or {}) do
      for _, verb in ipairs(rule.resources and rule.verbs or {}) do
        out[#out + 1] = { verb = verb, group = rule.apiGroups[1], resource = rule.resources[1],
          namespace = o.metadata.namespace, name = rule.resourceNames and rule.resourceNames[1] or nil }
      end
    end
  end
  return out
end

-- The authorizer reads RBAC from its informers: waits until it allows the
-- account everything `objects` grant, and refuses `taken` (a permission a
-- previous case's RBAC, now deleted, still granted a moment ago).
local function wait_authorizer(h, token, objects, taken)
  local ok = cli.poll(30, function()
    for _, p in ipairs(grants(objects)) do
      if not cli.authorized(h.srv, token, p) then return false end
    end
    return not (taken and cli.authorized(h.srv, token, taken))
  end, 0.05)
  assert(ok, "the authorizer did not take up the generated RBAC")
end

local function version(h)
  local cm = h.srv:request("GET", "/api/v1/namespaces/" .. NAMESPACE .. "/configmaps/cozystack-version")
  return cm.status == 200 and cm.json.data.version or nil
end

local function is_write(e)
  return e.method ~= "GET" and e.method ~= "HEAD"
    and not tostring(e.path):find("accessreviews", 1, true)
end

-- A run's Kubernetes Event (scripts/cozy/runner/events.lua): a report, not state
local function is_event(e)
  return e.method == "POST" and tostring(e.path):find("/apis/events.k8s.io/", 1, true) == 1
end

-- The RBAC without one verb of one rule (a rule left with no verb goes).
local function without(objects, kind, index, verb)
  local copy = json.decode(json.encode(objects))
  for _, o in ipairs(copy) do
    if o.kind == kind then
      local rule = o.rules[index]
      local verbs = {}
      for _, v in ipairs(rule.verbs) do if v ~= verb then verbs[#verbs + 1] = v end end
      if #verbs == 0 then table.remove(o.rules, index) else rule.verbs = verbs end
    end
  end
  return copy
end

-- A state in which the run needs `verb` of `rule`: the engine creates its
-- ConfigMap only on a cluster without one, and patches its Lease at once
-- only to take over one a dead runner left (a run this short ends before its
-- first renewal).
local function prepare(h, rule, verb)
  local res = rule.resources and rule.resources[1]
  if res == "leases" and verb == "patch" then
    local dead = {
      apiVersion = "coordination.k8s.io/v1", kind = "Lease",
      metadata = { name = "cozystack-migrations", namespace = NAMESPACE },
      spec = { holderIdentity = "dead-runner", leaseDurationSeconds = 1,
               acquireTime = "2026-01-01T00:00:00.000000Z", renewTime = "2026-01-01T00:00:00.000000Z",
               leaseTransitions = 0 },
    }
    local r = h.srv:request("POST", "/apis/coordination.k8s.io/v1/namespaces/" .. NAMESPACE .. "/leases", { body = dead })
    assert.equal(201, r.status, r.body)
    return "a Lease a dead runner left"
  end
  if res == "configmaps" and verb == "create" then
    local r = h.srv:request("DELETE", "/api/v1/namespaces/" .. NAMESPACE .. "/configmaps/cozystack-version")
    assert.equal(200, r.status, r.body)
    return "a cluster without the version ConfigMap"
  end
  return "the fixture"
end

for _, case in ipairs(CASES) do
  describe(("migration %d under the RBAC cozy-migrate generates"):format(case.number), function()
    local h = harness.fake { server = "real", fixtures = { case.fixture } }

    -- runs under the account with `objects` applied; `taken` is the
    -- permission taken away from them, if any
    local function run(objects, rule, verb, taken)
      apply(h, objects)
      local account = cli.account_kubeconfig(h.srv, NAMESPACE, ACCOUNT)
      wait_authorizer(h, account.token, objects, taken)
      local kubeconfig = account.kubeconfig
      local state = rule and prepare(h, rule, verb) or "the fixture"
      -- a concurrent writer meets the first write: the re-read is asked for
      h:faults { { method = "PATCH", path = case.writes, times = 1, bump = true } }
      h:mark()
      local r = h:cli({ "run", "--target", tostring(case.target), "--kubeconfig", kubeconfig },
        { NAMESPACE = NAMESPACE })
      return r, state, kubeconfig
    end

    it("succeeds with exactly that RBAC, the re-read after a conflict included", function()
      local objects = generated(h, case.target)
      local r = run(objects)
      assert.equal(0, r.code, r.stderr)
      assert.equal(tostring(case.target), version(h))
      assert.same({ "bump" }, h:fired())
      for _, e in ipairs(h:requests()) do
        assert.is_true(e.status ~= 403, ("refused: %s %s?%s"):format(e.method, e.path, e.query or ""))
      end
      local check = h:cli({ "check", "--service-account", ACCOUNT, "--target", tostring(case.target), "--output", "json" }, { NAMESPACE = NAMESPACE })
      -- the run is done: nothing pending, the engine's own needs still reviewed
      local report = json.decode(check.stdout)
      for _, p in ipairs(report.permissions) do
        assert.is_true(p.allowed, ("check says %s %s.%s is not allowed: %s"):format(p.verb, p.resource, p.group,
          check.stdout))
      end
    end)

    it("bootstrap RBAC grants every authenticated user what we leave out of the minimum", function()
      apply(h, { { apiVersion = "v1", kind = "ServiceAccount", metadata = { name = ACCOUNT, namespace = NAMESPACE } } })
      local token = cli.account_kubeconfig(h.srv, NAMESPACE, ACCOUNT).token
      assert.equal(200, h.srv:request("GET", "/apis", { token = token }).status)
      assert.equal(200, h.srv:request("GET", "/version", { token = token }).status)
      assert.equal(201, h.srv:request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", { token = token,
        body = { apiVersion = "authorization.k8s.io/v1", kind = "SelfSubjectAccessReview",
                 spec = { resourceAttributes = { verb = "get", resource = "configmaps" } } } }).status)
      assert.equal(201, h.srv:request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", { token = token,
        body = { apiVersion = "authentication.k8s.io/v1", kind = "SelfSubjectReview" } }).status)
    end)

    -- every verb of every rule the ClusterRole and the Role give, each
    -- taken away in turn from a freshly reset cluster
    it("fails, names the refusal and writes nothing past it without any one verb of any one rule", function()
      local variants = {}
      for _, o in ipairs(generated(h, case.target)) do
        for index, rule in ipairs(o.rules or {}) do
          for _, verb in ipairs(rule.verbs) do
            if not granted_to_everyone(rule, verb) then
              variants[#variants + 1] = { kind = o.kind, index = index, rule = rule, verb = verb,
                what = ("%s %s%s (%s)"):format(verb, table.concat(rule.resources, ","),
                  rule.resourceNames and (" " .. table.concat(rule.resourceNames, ",")) or "", o.kind) }
            end
          end
        end
      end
      assert.is_true(#variants >= 5, "too few rules to take away: " .. #variants)
      for n, v in ipairs(variants) do
        if n > 1 then h:reset() end
        local objects = without(generated(h, case.target), v.kind, v.index, v.verb)
        local taken = { verb = v.verb, group = v.rule.apiGroups[1], resource = v.rule.resources[1],
          namespace = v.kind == "Role" and NAMESPACE or nil, name = v.rule.resourceNames and v.rule.resourceNames[1] }
        local r, state = run(objects, v.rule, v.verb, taken)
        local where = ("without %s, on %s"):format(v.what, state)
        if rbac.BEST_EFFORT[v.rule.apiGroups[1] .. "/" .. v.rule.resources[1]] then
          -- best effort: the run goes on, its first Event refused, no other tried
          assert.equal(0, r.code, where .. ":\n" .. r.stderr)
          assert.equal(tostring(case.target), version(h), where)
          local events = {}
          for _, e in ipairs(h:requests()) do
            if is_event(e) then events[#events + 1] = e.status end
          end
          assert.same({ 403 }, events, where)
          assert.truthy(r.stderr:find("could not write a Kubernetes Event", 1, true), where .. ":\n" .. r.stderr)
          -- the WARN line's error field, quoted: its quotes escaped
          assert.truthy(r.stderr:find(('cannot %s resource \\"%s\\"'):format(v.verb, v.rule.resources[1]), 1, true),
            where .. ":\n" .. r.stderr)
        else
          assert.is_true(r.code ~= 0, ("run succeeded %s:\n%s"):format(where, r.stderr))
          -- the refusal, in the run's own words
          assert.truthy(r.stderr:find("forbidden", 1, true), where .. ":\n" .. r.stderr)
          assert.truthy(r.stderr:find(('cannot %s resource "%s"'):format(v.verb, v.rule.resources[1]), 1, true),
            where .. ":\n" .. r.stderr)
          local log = h:requests()
          local first
          for i, e in ipairs(log) do
            if e.status == 403 then first = first or i end
          end
          assert.is_not_nil(first, "no request was refused " .. where)
          -- nothing written past the refusal but the lock's release, the run's
          -- Events and the failed attempt's history record (below)
          local recorded = 0
          for i = first + 1, #log do
            local e = log[i]
            if is_write(e) and e.status < 300 and not is_event(e) then
              if e.method == "PATCH" and tostring(e.path):find("/configmaps/cozystack%-version$") then
                recorded = recorded + 1
              else
                assert.truthy(tostring(e.path):find("/leases/", 1, true),
                  ("wrote past the refusal %s: %s %s (%d)"):format(where, e.method, e.path, e.status))
              end
            end
          end
          if state ~= "a cluster without the version ConfigMap" then
            assert.equal(case.from, version(h), where)
          end
          -- that record, if written, is the failed attempt, naming the refusal
          assert.is_true(recorded <= 1, recorded .. " stamp writes past the refusal " .. where)
          if recorded == 1 then
            local history = cli.history(h:object("ConfigMap", NAMESPACE, "cozystack-version"))
            local last = history[#history]
            assert.equal("failed", last.result, where)
            assert.truthy(last.error.message:find(('cannot %s resource "%s"'):format(v.verb, v.rule.resources[1]),
              1, true), where .. ": " .. last.error.message)
          end
        end
        -- and the preflight sees it coming
        local check = h:cli({ "check", "--service-account", ACCOUNT, "--target", tostring(case.target), "--output", "json" }, { NAMESPACE = NAMESPACE })
        local report = json.decode(check.stdout)
        local refused = false
        for _, p in ipairs(report.permissions or {}) do
          if not p.allowed and p.verb == v.verb and p.resource == v.rule.resources[1] then refused = true end
        end
        assert.is_true(refused, ("check --service-account did not report %s:\n%s"):format(where, check.stdout))
      end
    end)
  end)
end
