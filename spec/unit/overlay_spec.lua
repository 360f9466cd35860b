-- cozy.kube.overlay: the rehearsal's store of created, changed and deleted
-- objects over the live cluster, and the merge of live list pages with it.
local overlay = require "cozy.kube.overlay"
local json = require "cozy.json"

local function cm(ns, name, labels, extra)
  local o = json.object { apiVersion = "v1", kind = "ConfigMap",
    metadata = json.object { namespace = ns, name = name, resourceVersion = "7",
      labels = labels and json.object(labels) or nil } }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function page(items, cont)
  return json.object { kind = "ConfigMapList", apiVersion = "v1",
    metadata = json.object { resourceVersion = "9", ["continue"] = cont }, items = json.array(items) }
end

local function names(list)
  local out = {}
  for _, o in ipairs(list.items) do
    out[#out + 1] = (o.metadata.namespace and (o.metadata.namespace .. "/") or "") .. o.metadata.name
  end
  return out
end

-- The pages a pager would read: each asked with the token the last answered.
local function read_pages(ov, pages, q)
  local seen, token = {}, nil
  for _, p in ipairs(pages) do
    local qq = {}
    for k, v in pairs(q) do qq[k] = v end
    qq.continue = token
    local merged = ov:merge_page(p, qq)
    for _, n in ipairs(names(merged)) do seen[#seen + 1] = n end
    token = p.metadata["continue"]
  end
  return seen
end

describe("cozy.kube.overlay", function()
  describe("get", function()
    it("asks the live server for an object it does not hold", function()
      local ov = overlay.new()
      assert.equal("live", (ov:get("", "v1", "configmaps", "a", "x")))
    end)

    it("answers a changed or created object from the overlay, with a resourceVersion of its own", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x", { k = "v" }), { live = true, live_rv = "7" })
      local state, obj = ov:get("", "v1", "configmaps", "a", "x")
      assert.equal("present", state)
      assert.same({ k = "v" }, obj.metadata.labels)
      assert.equal("rehearsal-1", obj.metadata.resourceVersion)
      assert.equal("7", ov:entry("", "configmaps", "a", "x").live_rv)
      -- each write a new version, as each write of a run makes one
      ov:put("", "configmaps", obj)
      assert.equal("rehearsal-2", select(2, ov:get("", "v1", "configmaps", "a", "x")).metadata.resourceVersion)
    end)

    it("hands out copies: a caller's edit does not change the overlay", function()
      local ov = overlay.new()
      local sent = cm("a", "x")
      ov:put("", "configmaps", sent)
      sent.metadata.name = "changed"
      local _, obj = ov:get("", "v1", "configmaps", "a", "x")
      obj.data = { y = "1" }
      assert.is_nil(select(2, ov:get("", "v1", "configmaps", "a", "x")).data)
    end)

    it("answers a deleted object with the 404 Status the API server gives", function()
      local ov = overlay.new()
      ov:delete("", "configmaps", "a", "x", true)
      local state, status = ov:get("", "v1", "configmaps", "a", "x")
      assert.equal("deleted", state)
      assert.same({ kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure",
        message = 'configmaps "x" not found', reason = "NotFound",
        details = { name = "x", kind = "configmaps" }, code = 404 }, status)
      local _, cr = (function() ov:delete("kubevirt.io", "virtualmachines", "a", "vm", true)
        return ov:get("kubevirt.io", "v1", "virtualmachines", "a", "vm") end)()
      assert.equal('virtualmachines.kubevirt.io "vm" not found', cr.message)
      assert.equal("kubevirt.io", cr.details.group)
    end)

    it("is one object under two versions of a group, marked inexact when read under the other", function()
      local ov = overlay.new()
      local hr = json.object { apiVersion = "helm.toolkit.fluxcd.io/v2", kind = "HelmRelease",
        metadata = json.object { namespace = "a", name = "r" } }
      ov:put("helm.toolkit.fluxcd.io", "helmreleases", hr)
      local state, obj, why = ov:get("helm.toolkit.fluxcd.io", "v2beta2", "helmreleases", "a", "r")
      assert.equal("present", state)
      assert.equal("helm.toolkit.fluxcd.io/v2", obj.apiVersion)
      assert.matches("written as helm.toolkit.fluxcd.io/v2 and is read as helm.toolkit.fluxcd.io/v2beta2", why,
        1, true)
      assert.is_nil(select(3, ov:get("helm.toolkit.fluxcd.io", "v2", "helmreleases", "a", "r")))
    end)

    it("tells apart a namespace's object and a cluster-scoped one of the same name", function()
      local ov = overlay.new()
      ov:delete("", "namespaces", nil, "a", true)
      assert.equal("live", (ov:get("", "v1", "configmaps", "a", "a")))
      assert.equal("deleted", (ov:get("", "v1", "namespaces", nil, "a")))
    end)
  end)

  describe("label selectors", function()
    local function sel(s, labels)
      local f = assert(overlay.label_selector(s))
      return f(labels)
    end

    it("takes the equality forms", function()
      assert.is_true(sel("app=web", { app = "web" }))
      assert.is_true(sel("app==web", { app = "web" }))
      assert.is_false(sel("app=web", { app = "db" }))
      assert.is_false(sel("app=web", {}))
      assert.is_true(sel("app!=web", {}))          -- as the server: a missing key is "not equal"
      assert.is_false(sel("app!=web", { app = "web" }))
      assert.is_true(sel("app=", { app = "" }))
    end)

    it("takes the set-based forms, comma-joined, with spaces", function()
      assert.is_true(sel("tier in (a, b)", { tier = "b" }))
      assert.is_false(sel("tier in (a,b)", {}))
      assert.is_true(sel("tier notin (a,b)", {}))
      assert.is_false(sel("tier notin (a,b)", { tier = "a" }))
      assert.is_true(sel("example.com/x", { ["example.com/x"] = "" }))
      assert.is_true(sel("!x", {}))
      assert.is_false(sel("!x", { x = "1" }))
      assert.is_true(sel("a=1, tier in (x,y),!gone", { a = "1", tier = "y" }))
      assert.is_false(sel("a=1,tier in (x,y),!gone", { a = "1", tier = "y", gone = "" }))
      assert.is_true(sel("n>3,n<10", { n = "5" }))
      assert.is_false(sel("n>3", { n = "2" }))
      assert.is_true(sel("", {}))
    end)

    it("says why for a selector it cannot parse", function()
      local f, why = overlay.label_selector("a in b")
      assert.is_nil(f)
      assert.matches('"a in b"', why, 1, true)
    end)
  end)

  describe("field selectors", function()
    it("evaluates metadata.name and metadata.namespace", function()
      local f = assert(overlay.field_selector("metadata.name=x,metadata.namespace!=b"))
      assert.is_true(f(cm("a", "x")))
      assert.is_false(f(cm("b", "x")))
      assert.is_false(f(cm("a", "y")))
    end)

    it("refuses to guess any other field", function()
      local f, why = overlay.field_selector("status.phase=Running")
      assert.is_nil(f)
      assert.matches("status.phase=Running", why, 1, true)
    end)
  end)

  describe("merge_page", function()
    it("replaces a changed object, drops a deleted one, adds a created one where it matches", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x", { app = "web", new = "1" }), { live = true })
      ov:delete("", "configmaps", "a", "y", true)
      ov:put("", "configmaps", cm("a", "n", { app = "web" }))
      ov:put("", "configmaps", cm("b", "m", { app = "web" }))      -- another namespace
      ov:put("", "configmaps", cm("a", "o", { app = "db" }))       -- another label
      local list = ov:merge_page(page { cm("a", "x", { app = "web" }), cm("a", "y", { app = "web" }),
        cm("a", "z", { app = "web" }) }, { group = "", plural = "configmaps", namespace = "a",
        label_selector = "app=web" })
      assert.same({ "a/n", "a/x", "a/z" }, names(list))
      assert.equal("1", list.items[2].metadata.labels.new)
    end)

    it("drops a changed object that no longer matches, and shows one that now does", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x", { app = "db" }), { live = true })
      ov:put("", "configmaps", cm("a", "w", { app = "web" }), { live = true }) -- live: app=db, not in the page
      local list = ov:merge_page(page { cm("a", "x", { app = "web" }) },
        { group = "", plural = "configmaps", label_selector = "app=web" })
      assert.same({ "a/w" }, names(list))
    end)

    it("lists cluster-wide and across namespaces in key order", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("m", "a"))
      local list = ov:merge_page(page { cm("a", "z"), cm("z", "a") }, { group = "", plural = "configmaps" })
      assert.same({ "a/z", "m/a", "z/a" }, names(list))
      local nsov = overlay.new()
      nsov:put("", "namespaces", json.object { apiVersion = "v1", kind = "Namespace",
        metadata = json.object { name = "new" } })
      local nss = nsov:merge_page(page { json.object { metadata = json.object { name = "default" } },
        json.object { metadata = json.object { name = "zz" } } }, { group = "", plural = "namespaces" })
      assert.same({ "default", "new", "zz" }, names(nss))
    end)

    it("puts each created object in exactly one page of a paginated pass, in key order", function()
      local ov = overlay.new()
      for _, n in ipairs { "a0", "b5", "c0", "d5", "z9" } do ov:put("", "configmaps", cm("ns", n)) end
      ov:delete("", "configmaps", "ns", "b0", true)
      local pages = {
        page({ cm("ns", "a1"), cm("ns", "b0") }, "t1"),
        page({}, "t2"),                               -- an empty page that still carries a token
        page({ cm("ns", "c1"), cm("ns", "d0") }, "t3"),
        page({ cm("ns", "e0") }),
      }
      local seen = read_pages(ov, pages, { group = "", plural = "configmaps", namespace = "ns" })
      assert.same({ "ns/a0", "ns/a1", "ns/b5", "ns/c0", "ns/c1", "ns/d0", "ns/d5", "ns/e0", "ns/z9" }, seen)
    end)

    it("keeps each page after the one before, as the pager requires", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("ns", "b5"))
      local pages = { page({ cm("ns", "a"), cm("ns", "b") }, "t1"), page({ cm("ns", "c") }) }
      local first = ov:merge_page(pages[1], { group = "", plural = "configmaps" })
      assert.same({ "ns/a", "ns/b" }, names(first))
      local second = ov:merge_page(pages[2], { group = "", plural = "configmaps", continue = "t1" })
      assert.same({ "ns/b5", "ns/c" }, names(second))
    end)

    it("filters created objects by metadata.name and metadata.namespace field selectors", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x"))
      ov:put("", "configmaps", cm("a", "y"))
      local list, why = ov:merge_page(page {}, { group = "", plural = "configmaps",
        field_selector = "metadata.name=y" })
      assert.same({ "a/y" }, names(list))
      assert.is_nil(why)
    end)

    it("marks a read inexact for a field selector it cannot evaluate, adding no created object", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x", { v = "2" }), { live = true })
      ov:put("", "configmaps", cm("a", "new"))
      ov:delete("", "configmaps", "a", "gone", true)
      local list, why = ov:merge_page(page { cm("a", "gone"), cm("a", "x", { v = "1" }) },
        { group = "", plural = "configmaps", field_selector = "status.phase=Running" })
      assert.same({ "a/x" }, names(list))
      assert.equal("2", list.items[1].metadata.labels.v)
      assert.matches("not evaluated in the overlay", why)
    end)

    it("projects the overlay's objects as the page's lean items", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { big = "..." } }))
      local list = ov:merge_page(page {}, { group = "", plural = "configmaps",
        project = function(o) o.data = nil return o end })
      assert.is_nil(list.items[1].data)
    end)

    it("leaves a page of a resource it holds nothing of as it came", function()
      local ov = overlay.new()
      ov:put("", "secrets", cm("a", "x"))
      local p = page { cm("a", "y") }
      local items = p.items
      assert.equal(items, ov:merge_page(p, { group = "", plural = "configmaps" }).items)
    end)
  end)

  describe("changes", function()
    it("counts created, changed (re-created included) and deleted objects", function()
      local ov = overlay.new()
      ov:put("", "configmaps", cm("a", "new"))
      ov:put("", "configmaps", cm("a", "changed"), { live = true })
      ov:delete("", "configmaps", "a", "gone", true)
      ov:delete("", "configmaps", "a", "again", true)
      ov:put("", "configmaps", cm("a", "again"), { created = true })
      ov:put("", "configmaps", cm("a", "brief"))
      ov:delete("", "configmaps", "a", "brief")
      local c = ov:changes()
      local function keys(es) local out = {} for _, e in ipairs(es) do out[#out + 1] = e.key end return out end
      assert.same({ "a/new" }, keys(c.created))
      assert.same({ "a/again", "a/changed" }, keys(c.changed))
      assert.same({ "a/gone" }, keys(c.deleted))
    end)

    it("keeps the live object as the first write found it, for the plan's diff; later writes do not replace it", function()
      local ov = overlay.new()
      local live = cm("a", "x", nil, { data = json.object { v = "live" } })
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "one" } }), { live = true, before = live })
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "two" } }),
        { live = true, before = cm("a", "x", nil, { data = json.object { v = "one" } }) })
      ov:delete("", "configmaps", "a", "gone", true, cm("a", "gone"))
      ov:delete("", "configmaps", "a", "unread", true, nil, "the live object could not be read: forbidden")
      assert.equal("live", ov:before(ov:entry("", "configmaps", "a", "x")).data.v)
      assert.equal("two", ov:object(ov:entry("", "configmaps", "a", "x")).data.v)
      assert.equal("gone", ov:before(ov:entry("", "configmaps", "a", "gone")).metadata.name)
      assert.equal("the live object could not be read: forbidden", ov:entry("", "configmaps", "a", "unread").before_unknown)
    end)

    -- The overlay keeps an entry's before as the patch from its object;
    -- json.diff takes [] for {} and 1 for 1.0, so that patch alone would
    -- give another before back in these cases.
    it("gives back the before exactly where a patch from the object would not: [] for {}, 1.0 for 1", function()
      local ov = overlay.new()
      local live = cm("a", "x", nil, { data = json.object { v = "live" }, spec = json.object {
        empty = json.object {}, n = 1.0, list = json.array { json.object {} } } })
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "one" }, spec = json.object {
        empty = json.array {}, n = 1, list = json.array { json.array {} } } }), { live = true, before = live })
      local before = ov:before(ov:entry("", "configmaps", "a", "x"))
      assert.equal(json.encode(before.spec), json.encode(live.spec))
      assert.equal(json.object_mt, getmetatable(before.spec.empty))
      assert.equal("float", math.type(before.spec.n))
      assert.equal("live", before.data.v)
    end)

    it("keeps the before through later writes that add, change and remove fields, and a delete", function()
      local ov = overlay.new()
      local live = cm("a", "x", nil, { data = json.object { v = "live", w = "1", deep = json.object { k = "x" } } })
      local want = json.encode(live.data)
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "one", w = "1" } }),
        { live = true, before = live })
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "two", z = "new" } }), { live = true })
      assert.equal(want, json.encode(ov:before(ov:entry("", "configmaps", "a", "x")).data))
      ov:delete("", "configmaps", "a", "x", true)
      assert.equal(want, json.encode(ov:before(ov:entry("", "configmaps", "a", "x")).data))
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "three" } }), { live = true, created = true })
      assert.equal(want, json.encode(ov:before(ov:entry("", "configmaps", "a", "x")).data))
      assert.equal("three", ov:object(ov:entry("", "configmaps", "a", "x")).data.v)
    end)

    it("awaits the before of a write that named only its live version, through later writes and a delete", function()
      local ov = overlay.new()
      local due = { live = true, live_rv = "7", before_due = "v1" }
      ov:put("", "configmaps", cm("b", "y", nil, { data = json.object { v = "one" } }), due)
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "one", w = "1" } }), due)
      ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "two" } }), { live = true })
      ov:delete("", "configmaps", "b", "y", true)
      for _, e in ipairs { ov:entry("", "configmaps", "a", "x"), ov:entry("", "configmaps", "b", "y") } do
        assert.is_nil(ov:before(e))
        assert.equal("v1", e.before_due)
        assert.equal("7", e.live_rv)
      end
      assert.equal("two", ov:object(ov:entry("", "configmaps", "a", "x")).data.v)
    end)

    it("makes the before shown beside an after from the after, sharing what the writes left alone", function()
      local function decoded(data, extra)
        local o = cm("a", "x", nil, { data = json.object(data),
          spec = json.object { big = json.object { deep = json.array { 1, 2, 3 } } } })
        for k, v in pairs(extra or {}) do o.metadata[k] = v end
        return json.decode(json.encode(o))
      end
      local after = decoded({ v = "two", z = "new" })
      local before = decoded({ v = "one" }, { resourceVersion = "7", uid = "u-1" })
      local shown = overlay.shared_before(after, before)
      assert.equal('{"v":"one"}', json.encode(shown.data))
      assert.is_nil(shown.metadata.resourceVersion)
      assert.is_nil(shown.metadata.uid)
      assert.equal(after.spec, shown.spec) -- the same table: its YAML made once
      assert.equal('{"v":"two","z":"new"}', json.encode(after.data))
      -- a before the patch would not give back exactly (1.0 against 1) is itself
      local b2 = decoded({ v = "one" })
      b2.spec.big.deep[1] = 1.0
      assert.equal(b2, overlay.shared_before(after, b2))
      assert.equal("1.0", json.encode(b2.spec.big.deep[1]))
    end)

    it("hands out copies: changing what put or get returned leaves the overlay's object as it was", function()
      local ov = overlay.new()
      local kept = ov:put("", "configmaps", cm("a", "x", nil, { data = json.object { v = "one" } }), { live = true })
      kept.data.v = "changed by the caller"
      local _, got = ov:get("", "v1", "configmaps", "a", "x")
      assert.equal("one", got.data.v)
      got.data.v = "changed again"
      local _, again = ov:get("", "v1", "configmaps", "a", "x")
      assert.equal("one", again.data.v)
    end)
  end)
end)
