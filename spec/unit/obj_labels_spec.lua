-- cozy.obj's labels and annotations (docs/engine-api.md, "Labels and
-- annotations"): keys and values checked as the API server checks them
-- (apimachinery's IsQualifiedName, IsValidLabelValue; the same keys go to
-- both servers in spec/e2e/kube/label_checks_spec.lua), a bad key an error before
-- anything is sent, and paths that reach keys with dots in them.
local json = require "cozy.json"
local obj = require "cozy.obj"

local APP = "apps.cozystack.io/application.name"

-- keys the API server accepts as label keys
local VALID = {
  "a", "A", "9", "a_b.c-D", APP, "tenant.cozystack.io/tenant-x", "kubernetes.io/metadata.name",
  ("n"):rep(63), ("p"):rep(253) .. "/n", "a-b.c/X_y", "1.2/3",
}

-- keys it refuses, and why (the defect our message names)
local INVALID = {
  { "tenant.cozystack.io/tenant-", "name part must consist of" },
  { "-a", "name part must consist of" },
  { "a b", "name part must consist of" },
  { "é", "name part must consist of" },
  { "", "name part must be non-empty" },
  { "x/", "name part must be non-empty" },
  { "/x", "prefix part must be non-empty" },
  { "a/b/c", "separated by one '/'" },
  { "Example.com/x", "prefix part must be a lowercase RFC 1123 subdomain" },
  { "-a.com/x", "prefix part must be a lowercase RFC 1123 subdomain" },
  { "a..com/x", "prefix part must be a lowercase RFC 1123 subdomain" },
  { "a_b.com/x", "prefix part must be a lowercase RFC 1123 subdomain" },
  { ("n"):rep(64), "name part must be no more than 63 characters" },
  { ("p"):rep(254) .. "/n", "prefix part must be no more than 253 characters" },
}

describe("cozy.obj labels and annotations", function()
  it("accepts the keys the API server accepts", function()
    for _, key in ipairs(VALID) do
      assert.is_nil(obj.key_error(key), key)
      local o = { metadata = { name = "x" } }
      assert.is_true(obj.set_label(o, key, "v"))
      assert.equal("v", obj.label(o, key))
    end
  end)

  it("refuses the keys it refuses, naming the key and the defect, before the object is touched", function()
    for _, c in ipairs(INVALID) do
      local key, why = c[1], c[2]
      local o = { metadata = { name = "x" } }
      local ok, err = pcall(obj.set_label, o, key, "v")
      assert.is_false(ok, key)
      assert.matches("cozy.obj: invalid label key " .. ("%q"):format(key):gsub("%p", "%%%0"), err)
      assert.matches(why, err, 1, true)
      assert.is_nil(o.metadata.labels, key)
      assert.has_error(function() obj.remove_label(o, key) end, "cozy.obj: invalid label key " .. obj.key_error(key))
    end
  end)

  it("checks label values: 63 characters of the name charset, or empty", function()
    local o = { metadata = {} }
    assert.is_true(obj.set_label(o, "a", ""))
    assert.is_true(obj.set_label(o, "a", ("v"):rep(63)))
    assert.has_error(function() obj.set_label(o, "a", ("v"):rep(64)) end,
      ("cozy.obj: invalid label value %q: a label value must be no more than 63 characters"):format(("v"):rep(64)))
    assert.has_error(function() obj.set_label(o, "a", "x-") end,
      [[cozy.obj: invalid label value "x-": a label value must be empty or consist of alphanumeric characters, ]] ..
      [['-', '_' or '.', and must start and end with an alphanumeric character]])
    assert.has_error(function() obj.set_label(o, "a", 1) end,
      "cozy.obj: invalid label value a label value must be a string, not a number")
  end)

  it("checks annotation keys lowercased, as the API server does, and takes any string value", function()
    local o = { metadata = {} }
    assert.is_true(obj.set_annotation(o, "Example.com/Note", "any text: with / and spaces"))
    assert.equal("any text: with / and spaces", obj.annotation(o, "Example.com/Note"))
    assert.has_error(function() obj.set_annotation(o, "x/-y", "v") end,
      [[cozy.obj: invalid annotation key "x/-y": name part must consist of alphanumeric characters, ]] ..
      [['-', '_' or '.', and must start and end with an alphanumeric character]])
    assert.has_error(function() obj.set_annotation(o, "a", 1) end,
      "cozy.obj: an annotation value must be a string, not a number")
  end)

  it("creates the map when absent or null, reports whether it changed anything, and removes", function()
    local o = json.decode('{"metadata":{"name":"x","labels":null}}')
    assert.is_nil(obj.label(o, APP))
    assert.is_true(obj.set_label(o, APP, "v"))
    assert.is_false(obj.set_label(o, APP, "v"))
    assert.equal("v", o.metadata.labels[APP])
    assert.is_true(obj.remove_label(o, APP))
    assert.is_false(obj.remove_label(o, APP))
    assert.is_nil(o.metadata.labels[APP])
    assert.is_false(obj.remove_annotation({}, "a"))
    assert.is_nil(obj.annotation({}, "a"))
    assert.is_nil(obj.label(nil, "a"))
    -- the map made is a JSON object, so an emptied one still encodes as {}
    local fresh = {}
    obj.set_annotation(fresh, "a", "b")
    obj.remove_annotation(fresh, "a")
    assert.equal('{"metadata":{"annotations":{}}}', json.encode(fresh))
  end)

  it("reaches a key with dots in it through a path given as an array of steps", function()
    local o = json.decode(('{"metadata":{"labels":{"%s":"tenant-a"}},"spec":{"v":[{"n":1}]}}'):format(APP))
    assert.equal("tenant-a", obj.get(o, { "metadata", "labels", APP }))
    assert.is_nil(obj.get(o, "metadata.labels." .. APP)) -- the dotted form splits the key
    assert.equal(1, obj.get(o, { "spec", "v", 1, "n" }))
    assert.is_nil(obj.get(o, { "spec", "v", 2, "n" }))
    assert.same({ { n = 1 } }, obj.list(o, { "spec", "v" }))
    obj.append(o, { "metadata", "annotations", "example.io/list.v1" }, { "x" })
    assert.same({ "x" }, obj.get(o, { "metadata", "annotations", "example.io/list.v1" }))
  end)
end)

describe("obj.set_labels", function()
  it("sets every label of the map, and says whether any changed", function()
    local o = { metadata = { labels = { keep = "me", a = "1" } } }
    assert.is_true(obj.set_labels(o, { a = "2", ["x.io/b"] = "" }))
    assert.same({ keep = "me", a = "2", ["x.io/b"] = "" }, o.metadata.labels)
    assert.is_false(obj.set_labels(o, { a = "2" }))
  end)

  it("is all or none, as one kubectl label: a bad key or value sets nothing and says why", function()
    for _, case in ipairs {
      { { ["x.io/ok"] = "", ["tenant.cozystack.io/tenant-"] = "" }, "name part must consist of" },
      { { ["x.io/ok"] = "", ["x.io/v"] = "bad-" }, "a label value must be empty or consist of" },
      -- several bad keys: the first in key order is named, whatever the map's order
      { { ["b-"] = "", ["a-"] = "", ok = "" }, '"a-"' },
    } do
      local o = { metadata = { labels = { keep = "me" } } }
      local changed, why = obj.set_labels(o, case[1])
      assert.is_false(changed)
      assert.matches(case[2], why, 1, true)
      assert.same({ keep = "me" }, o.metadata.labels)
    end
  end)
end)

describe("obj.compare and obj.list's keep", function()
  it("pairs two arrays by a key: the items the first lacks and those it holds otherwise, in the second's order", function()
    local mine = { { name = "a", v = 1 }, { name = "b", v = 1 }, { name = "c", flag = false } }
    local theirs = { { name = "d" }, { name = "b", v = 2 }, { name = "c" }, { name = "a", v = 1 }, { name = "e" } }
    local lacking, differing = obj.compare(mine, theirs, "name")
    assert.same({ { name = "d" }, { name = "e" } }, lacking)
    -- c's false equals its absence (obj.equal): only b differs
    assert.same({ { { name = "b", v = 1 }, { name = "b", v = 2 } } }, differing)
    assert.same({ theirs[1], theirs[5] }, (obj.compare({}, { theirs[1], theirs[5] }, "name")))
  end)

  it("keep: a new array of the items kept, in order; the array itself without it", function()
    local o = { spec = { v = { { n = 1 }, { n = 2 }, { n = 3 } } } }
    local odd = obj.list(o, "spec.v", function(x) return x.n % 2 == 1 end)
    assert.same({ { n = 1 }, { n = 3 } }, odd)
    assert.equal(o.spec.v, obj.list(o, "spec.v"))
    assert.same({}, obj.list(o, "spec.none", function() return true end))
  end)
end)

describe("obj.append and obj.map", function()
  it("append of nothing leaves the object as it is: no list, no parent created", function()
    local o = { spec = {} }
    assert.is_nil(obj.append(o, "spec.template.disks", {}))
    assert.same({ spec = {} }, o)
    local held = obj.append(o, "spec.list", { 1 })
    assert.equal(held, obj.append(o, "spec.list", {}))
    assert.same({ 1 }, o.spec.list)
  end)

  it("map gives each item through fn, in order, and refuses a fn that is none", function()
    assert.same({ "add a", "remove b" }, obj.map({ { "add", "a" }, { "remove", "b" } },
      function(r) return r[1] .. " " .. r[2] end))
    assert.same({}, obj.map({}, tostring))
    local ok, err = pcall(obj.map, { 1 }, "tostring")
    assert.is_false(ok)
    assert.matches("obj.map(items, fn): fn must be a function", tostring(err), 1, true)
  end)
end)
