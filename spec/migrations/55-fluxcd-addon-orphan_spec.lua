-- Migration 55-fluxcd-addon-orphan on the spec harness (spec/README.md):
-- the fake API server holds spec/fixtures/55-fluxcd-addon-orphan/cluster.json
-- (the HelmRelease CRD; two tenants with the addon's two HelmReleases each;
-- other HelmReleases, among them a near-miss chart name and an old-style
-- spec.chart naming the addon's chart, that must stay untouched); every case
-- asserts on the stored objects and on the request log.
local harness = require "spec.helpers"
local json = require "cozy.json"

local CLUSTER = "spec/fixtures/55-fluxcd-addon-orphan/cluster.json"
local NO_CRD = "spec/fixtures/55-fluxcd-addon-orphan/no-helmrelease-crd.json"
local HR_PATH = "^/apis/helm%.toolkit%.fluxcd%.io/v2/namespaces/([^/]+)/helmreleases/([^/]+)$"
local FLUX = "cozystack-kubernetes-application-kubevirt-kubernetes-fluxcd"

-- The addon's HelmReleases, in the order the list returns them (namespace, name).
local ADDON = {
  "tenant-a/kubernetes-alpha-fluxcd", "tenant-a/kubernetes-alpha-fluxcd-operator",
  "tenant-b/kubernetes-beta-fluxcd", "tenant-b/kubernetes-beta-fluxcd-operator",
}
local FIRST = "kubernetes-alpha-fluxcd$"       -- a fault path for the first addon HelmRelease only

local function hr_key(o) return o.metadata.namespace .. "/" .. o.metadata.name end

-- Every stored HelmRelease by "ns/name".
local function helmreleases(h)
  local out = {}
  for _, o in ipairs(h:objects()) do
    if o.kind == "HelmRelease" then out[hr_key(o)] = o end
  end
  return out
end

local function is_addon(key)
  for _, k in ipairs(ADDON) do if k == key then return true end end
  return false
end

-- The requests to single HelmReleases, as "VERB ns/name body" in log order.
local function hr_requests(h)
  local out = {}
  for _, e in ipairs(h:requests()) do
    local ns, name = tostring(e.path):match(HR_PATH)
    if ns then
      local body = type(e.body) == "string" and json.decode(e.body) or nil
      out[#out + 1] = { method = e.method, key = ns .. "/" .. name, body = body,
        content_type = e.content_type, status = e.status, at = e.at }
    end
  end
  return out
end

local function cluster_with(edit)
  local list = json.decode(assert(harness.files.read(CLUSTER)))
  for _, o in ipairs(list.items) do
    if o.kind == "HelmRelease" then edit(o) end
  end
  return list
end

describe("migration 55-fluxcd-addon-orphan", function()
  local h = harness.fake { fixtures = { CLUSTER } }

  describe("run", function()
    it("orphans the addon's four HelmReleases and leaves every other object as it was", function()
      local before = helmreleases(h)
      local others_before = {}
      for _, o in ipairs(h:objects()) do
        if not (o.kind == "HelmRelease" and is_addon(hr_key(o))) then others_before[#others_before + 1] = o end
      end
      local res = h:migrate(55)
      local after = helmreleases(h)
      for _, key in ipairs(ADDON) do
        assert.is_not_nil(before[key], key)
        assert.is_nil(after[key], key .. " is still there")
      end
      -- everything else, the near-miss chart and the old-style spec.chart included, byte for byte
      assert.same(others_before, h:objects())
      assert.is_not_nil(after["tenant-c/kubernetes-gamma-fluxcd-extras"])
      assert.equal(FLUX, after["tenant-c/kubernetes-gamma-fluxcd"].spec.chart.spec.chart)
      assert.same({ orphaned = 4, gone = 0 }, res.outcome.counts)
      local orphaning = {}
      for _, line in ipairs(res.lines) do
        if line.message:find("^Orphaning ") then orphaning[#orphaning + 1] = line.message end
      end
      local want = {}
      for i, key in ipairs(ADDON) do want[i] = "Orphaning FluxCD addon HelmRelease " .. key end
      assert.same(want, orphaning)
      assert.matches("Orphaned 4 FluxCD addon HelmRelease%(s%), 0 already gone", res.log)
    end)

    it("per object: suspends, drops the finalizers, reads back, deletes; one object after the other", function()
      h:migrate(55)
      local want = {}
      for _, key in ipairs(ADDON) do
        want[#want + 1] = { method = "PATCH", key = key, body = { spec = { suspend = true } },
          content_type = "application/merge-patch+json" }
        want[#want + 1] = { method = "PATCH", key = key, body = { metadata = { finalizers = json.null } },
          content_type = "application/merge-patch+json" }
        want[#want + 1] = { method = "GET", key = key }
        want[#want + 1] = { method = "DELETE", key = key }
      end
      local got = hr_requests(h)
      local last_at = 0
      for i, r in ipairs(got) do
        assert.equal(200, r.status, r.method .. " " .. r.key)
        assert(r.at >= last_at, "the request log is in arrival order")
        last_at = r.at
        r.status, r.at = nil, nil
        if r.method == "GET" or r.method == "DELETE" then r.body, r.content_type = nil, nil end
        got[i] = r
      end
      assert.same(want, got)
      -- nothing else was written: no other HelmRelease, no other kind
      assert.equal(12, #h:writes())
    end)

    it("is idempotent: a second run finds nothing to orphan", function()
      assert.migration_idempotent(55)
      -- and it did the work the first time
      assert.is_nil(helmreleases(h)["tenant-a/kubernetes-alpha-fluxcd"])
    end)

    -- allow-list mode and conflict faults: the fake's alone
    it("declares every permission it uses (check and run under exactly the RBAC it is granted) #fakeonly", function()
      assert.permissions_complete(55)
      assert.is_nil(helmreleases(h)["tenant-b/kubernetes-beta-fluxcd-operator"])   -- run did run
    end)

    it("has nothing to do when the HelmRelease API is not served", function()
      h:reset(NO_CRD)
      -- the real server always has Flux's CRD (a reset brings it back): delete
      -- it (on the fake, whose fixture has none, the DELETE answers 404) and
      -- forget the requests that did it
      h.srv:delete_crd("helmreleases.helm.toolkit.fluxcd.io")
      h.srv:clear_requests()
      local res = h:migrate(55)
      assert.no_writes()
      assert.matches("HelmRelease API %(helm.toolkit.fluxcd.io/v2%) not served", res.log)
      assert.same({ orphaned = 0, gone = 0 }, res.outcome.counts)
      -- it asked discovery, and listed nothing
      assert.same({}, h:requests { path = "helmreleases" })
      local check = h:migrate(55, { mode = "check" })
      assert.same({}, check.findings)
    end)

    it("orphans an object that is already being deleted (its finalizer removal completes the delete)", function()
      h:reset(cluster_with(function(o)
        if o.metadata.name == "kubernetes-alpha-fluxcd" then o.metadata.deletionTimestamp = "2026-11-30T22:14:05Z" end
      end))
      -- being deleted on either server (the real one sets its own timestamp)
      assert.is_string(helmreleases(h)["tenant-a/kubernetes-alpha-fluxcd"].metadata.deletionTimestamp)
      local res = h:migrate(55)
      assert.same({ orphaned = 4, gone = 0 }, res.outcome.counts)
      assert.same({}, (function()
        local left = {}
        for key in pairs(helmreleases(h)) do if is_addon(key) then left[#left + 1] = key end end
        return left
      end)())
    end)
  end)

  -- every case here injects its failure with a fault rule: the fake's alone
  describe("fails closed #fakeonly", function()
    -- What each failure must leave: the run raised; its last request was
    -- `method` on the first addon HelmRelease, no request went to a later
    -- one, and every fault that fired was of `action` (at least one did).
    local function assert_stopped_at(err, method, action)
      assert.is_table(err)
      local got = hr_requests(h)
      assert.equal(method, got[#got].method)
      for _, r in ipairs(got) do assert.equal("tenant-a/kubernetes-alpha-fluxcd", r.key) end
      local fired = h:fired()
      assert.is_true(#fired >= 1, "the fault fired")
      for _, f in ipairs(fired) do assert.equal(action, f) end
      local after = helmreleases(h)
      for i = 2, #ADDON do
        assert.same({ "finalizers.fluxcd.io" }, after[ADDON[i]].metadata.finalizers, ADDON[i] .. " untouched")
        assert.is_nil(after[ADDON[i]].spec.suspend, ADDON[i] .. " untouched")
      end
      return after["tenant-a/kubernetes-alpha-fluxcd"], got
    end

    it("when the list fails", function()
      h:faults { { method = "GET", path = "/v2/helmreleases(\\?|$)", times = -1,
        status = { code = 500, message = "etcd down" } } }
      local err = h:migrate_error(55)
      assert.equal("api", err.kind)
      assert.equal(500, err.code)
      assert.is_true(#h:fired { method = "GET" } >= 1)
      assert.no_writes()
    end)

    it("when discovery fails (an unreachable API is never read as an absent one)", function()
      h:faults { { method = "GET", path = "^/apis/helm.toolkit.fluxcd.io/v2$", times = -1, status = 503 } }
      local err = h:migrate_error(55)
      assert.equal(503, err.code)
      assert.is_true(#h:fired() >= 1)
      assert.no_writes()
    end)

    it("when the suspend patch fails: no finalizer removed, nothing deleted", function()
      h:faults { { method = "PATCH", path = FIRST, times = -1, status = { code = 500, message = "webhook down" } } }
      local err = h:migrate_error(55)
      assert.equal(500, err.code)
      local first, sent = assert_stopped_at(err, "PATCH", "status")
      assert.same({ "finalizers.fluxcd.io" }, first.metadata.finalizers)
      assert.is_nil(first.spec.suspend)
      for _, r in ipairs(sent) do assert.same({ spec = { suspend = true } }, r.body) end
    end)

    it("when the finalizer patch fails: suspended, finalizers kept, nothing deleted", function()
      h:faults { { method = "PATCH", path = FIRST, skip = 1, times = -1,
        status = { code = 422, message = "denied by policy" } } }
      local err = h:migrate_error(55)
      assert.equal(422, err.code)
      local first, sent = assert_stopped_at(err, "PATCH", "status")
      assert.same({ spec = { suspend = true } }, sent[1].body)
      for i = 2, #sent do assert.same({ metadata = { finalizers = json.null } }, sent[i].body) end
      assert.is_true(first.spec.suspend)
      assert.same({ "finalizers.fluxcd.io" }, first.metadata.finalizers)
    end)

    it("when the finalizer is back at the verify read: no delete, and the error says why", function()
      -- helm-controller (or anything) re-adds its finalizer between the removal and the read
      local readd = { metadata = { finalizers = { "finalizers.fluxcd.io" } } }
      h:faults { { method = "GET", path = FIRST, bump = { merge = readd } } }
      local err = h:migrate_error(55)
      assert.equal("migration", err.kind)
      assert.matches("HelmRelease tenant%-a/kubernetes%-alpha%-fluxcd still has finalizers %[finalizers.fluxcd.io%] "
        .. "after they were removed", err.message)
      assert.matches("would run the helm uninstall in the tenant cluster", err.message)
      local first, sent = assert_stopped_at(err, "GET", "bump")
      assert.equal(3, #sent)
      assert.same({ "bump" }, h:fired())
      assert.is_true(first.spec.suspend)
      assert.is_nil(first.metadata.deletionTimestamp)
      assert.same({}, h:requests { method = "DELETE" })
    end)

    it("when the verify read fails", function()
      h:faults { { method = "GET", path = FIRST, times = -1, status = { code = 500, message = "etcd down" } } }
      local err = h:migrate_error(55)
      assert.equal(500, err.code)
      local first = assert_stopped_at(err, "GET", "status")
      assert.is_true(first.spec.suspend)
      assert.is_nil(first.metadata.finalizers)
      assert.same({}, h:requests { method = "DELETE" })
    end)

    it("when the delete fails: the object stays, suspended and without finalizers", function()
      h:faults { { method = "DELETE", path = FIRST, times = -1, status = { code = 500, message = "etcd down" } } }
      local err = h:migrate_error(55)
      assert.equal(500, err.code)
      local first = assert_stopped_at(err, "DELETE", "status")
      assert.is_true(first.spec.suspend)
      assert.is_nil(first.metadata.finalizers)
    end)
  end)

  -- a deleter between two requests: on the real server the front deletes the
  -- object through the API just before the request passes
  describe("objects deleted meanwhile", function()
    for _, case in ipairs {
      { "before the suspend patch", "PATCH", 0, "gone", 1 },
      { "before the finalizer patch", "PATCH", 1, "gone", 2 },
      { "before the verify read", "GET", 0, "orphaned", 3 },
      { "before the delete", "DELETE", 0, "orphaned", 4 },
    } do
      local label, method, skip, counted, sent = case[1], case[2], case[3], case[4], case[5]
      it(label .. ": fine, the run goes on", function()
        h:faults { { method = method, path = FIRST, skip = skip, delete = true } }
        local res = h:migrate(55)
        assert.same({ "delete" }, h:fired())
        assert.same({ orphaned = counted == "orphaned" and 4 or 3, gone = counted == "gone" and 1 or 0 },
          res.outcome.counts)
        local first = {}
        for _, r in ipairs(hr_requests(h)) do
          if r.key == "tenant-a/kubernetes-alpha-fluxcd" then first[#first + 1] = r.method .. " " .. r.status end
        end
        assert.equal(sent, #first)
        assert.equal(" 404", first[#first]:match(" %d+$"))
        for key in pairs(helmreleases(h)) do assert.is_false(is_addon(key), key .. " is left") end
      end)
    end
  end)

  describe("plan", function()
    it("writes nothing and shows each object's three writes in order", function()
      local before = h:objects()
      local res = h:migrate(55, { mode = "plan" })
      assert.no_writes()
      assert.same(before, h:objects())
      local shown = {}
      for _, w in ipairs(res.writes) do
        local ns, name = w.path:match(HR_PATH)
        shown[#shown + 1] = w.method .. " " .. ns .. "/" .. name
      end
      local want = {}
      for _, key in ipairs(ADDON) do
        want[#want + 1] = "PATCH " .. key
        want[#want + 1] = "PATCH " .. key
        want[#want + 1] = "DELETE " .. key
      end
      assert.same(want, shown)
      assert.same({ spec = { suspend = true } }, res.writes[1].body)
      assert.matches("Would orphan FluxCD addon HelmRelease tenant%-a/kubernetes%-alpha%-fluxcd ", res.log)
      assert.matches("Would orphan 4 FluxCD addon HelmRelease%(s%)", res.log)
    end)
  end)

  describe("check", function()
    it("lists each HelmRelease it would orphan and writes nothing", function()
      local res = h:migrate(55, { mode = "check" })
      assert.no_writes()
      local messages = {}
      for i, f in ipairs(res.findings) do
        assert.equal("info", f.severity)
        messages[i] = f.message
      end
      local want = {}
      for i, key in ipairs(ADDON) do want[i] = "would orphan FluxCD addon HelmRelease " .. key end
      assert.same(want, messages)
      assert.equal(FLUX, res.findings[1].fields.chart)
    end)

    it("warns about a HelmRelease that already has a deletionTimestamp", function()
      h:reset(cluster_with(function(o)
        if o.metadata.name == "kubernetes-beta-fluxcd-operator" then
          o.metadata.deletionTimestamp = "2026-11-30T22:14:05Z"
        end
      end))
      -- the fake stores the fixture's timestamp; the real server, which sets
      -- its own, deleted the object after loading it (its finalizer keeps it)
      local since = helmreleases(h)["tenant-b/kubernetes-beta-fluxcd-operator"].metadata.deletionTimestamp
      assert.is_string(since)
      if not h.srv.real then assert.equal("2026-11-30T22:14:05Z", since) end
      local res = h:migrate(55, { mode = "check" })
      local warns = {}
      for _, f in ipairs(res.findings) do
        if f.severity == "warn" then warns[#warns + 1] = f.message end
      end
      assert.same({ "HelmRelease tenant-b/kubernetes-beta-fluxcd-operator is already being deleted (deletionTimestamp "
        .. since .. "): helm-controller may be uninstalling the FluxCD addon from the tenant cluster now; "
        .. "run orphans it at once" }, warns)
      assert.equal(5, #res.findings)
    end)
  end)

  describe("through the binary", function()
    it("a cluster at 55 with only 55 and 59 refuses the gap; --target 56 runs 55 and stamps 56", function()
      local args = { "run", "--no-builtin", "--migrations", "migrations" }
      local r = h:cli(args)
      assert.equal(2, r.code, r.stderr)
      assert.matches("no migration for version 56: a gap inside %[55, 60%)", r.stderr)
      assert.no_writes()
      args[#args + 1] = "--target"
      args[#args + 1] = "56"
      r = h:cli(args)
      assert.equal(0, r.code, r.stderr)
      assert.equal("56", h:object("ConfigMap", "cozy-system", "cozystack-version").data.version)
      assert.matches("Orphaning FluxCD addon HelmRelease tenant%-b/kubernetes%-beta%-fluxcd%-operator", r.stderr)
    end)
  end)
end)
