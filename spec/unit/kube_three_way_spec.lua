-- cozy.kube.three_way: a rehearsal's merge of the server's answer S to a
-- strategic merge or apply patch of the live object L with the overlay's
-- version O (docs/operations.md, "Rehearsals").
local json = require "cozy.json"
local three_way = require "cozy.kube.three_way"

local d = json.decode

local function deployment(app, sidecar, labels, md)
  local o = d('{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"api","namespace":"ns",'
    .. '"resourceVersion":"10","generation":1},"spec":{"template":{"spec":{"containers":[]}}}}')
  o.metadata.labels = labels and json.object(labels) or nil
  for k, v in pairs(md or {}) do o.metadata[k] = v end
  o.spec.template.spec.containers = json.array { app, sidecar }
  return o
end

local function container(name, image, env)
  local c = json.object { name = name, image = image }
  if env then
    c.env = json.array {}
    for _, kv in ipairs(env) do c.env[#c.env + 1] = json.object { name = kv[1], value = kv[2] } end
  end
  return c
end

describe("cozy.kube.three_way", function()
  it("takes each side's changes; merges containers and env by name; the patch's scalars win", function()
    local l = deployment(container("app", "nginx:1.27", { { "MODE", "one" } }), container("sidecar", "busybox:1.36"),
      { app = "api" })
    -- O: an earlier step changed the sidecar's image, MODE and a label, and the app's image
    local o = deployment(container("app", "nginx:1.29", { { "MODE", "uno" } }), container("sidecar", "busybox:1.37"),
      { app = "api", tier = "back" }, { resourceVersion = "rehearsal-3", generation = 2 })
    -- S: the server applied {"metadata":{"labels":{"team":"x"}}, containers: [app image 1.28, env LEVEL]} to L
    local p = d('{"metadata":{"labels":{"team":"x"}},"spec":{"template":{"spec":{"containers":['
      .. '{"name":"app","image":"nginx:1.28","env":[{"name":"LEVEL","value":"two"}]}]}}}}')
    local s = deployment(container("app", "nginx:1.28", { { "MODE", "one" }, { "LEVEL", "two" } }),
      container("sidecar", "busybox:1.36"), { app = "api", team = "x" }, { generation = 2 })
    local merged, conflicts = three_way.merge(l, s, o, { patch = p, group = "apps" })
    assert.same({}, conflicts)
    assert.same({ app = "api", tier = "back", team = "x" }, merged.metadata.labels)
    assert.equal("rehearsal-3", merged.metadata.resourceVersion)
    assert.equal('[{"env":[{"name":"MODE","value":"uno"},{"name":"LEVEL","value":"two"}],"image":"nginx:1.28",'
      .. '"name":"app"},{"image":"busybox:1.37","name":"sidecar"}]', json.encode(merged.spec.template.spec.containers))
  end)

  it("names a field both changed that the patch did not set: a conflict", function()
    local l = d('{"metadata":{"name":"c","finalizers":["a"]},"data":{"x":"1"}}')
    local o = d('{"metadata":{"name":"c","finalizers":["a","b"]},"data":{"x":"1"}}')
    local s = d('{"metadata":{"name":"c","finalizers":["a","c"]},"data":{"x":"1"}}')
    local _, conflicts = three_way.merge(l, s, o, { patch = d('{"metadata":{"finalizers":["c"]}}'), group = "" })
    assert.same({ "metadata.finalizers" }, conflicts)
  end)

  it("holds containers atomic outside the pod-bearing built-in groups", function()
    local l = deployment(container("app", "a:1"), container("side", "b:1"))
    local o = deployment(container("app", "a:1"), container("side", "b:2"))
    local s = deployment(container("app", "a:2"), container("side", "b:1"))
    local _, conflicts = three_way.merge(l, s, o, { apply = true, group = "example.com" })
    assert.same({ "spec.template.spec.containers" }, conflicts)
    _, conflicts = three_way.merge(l, s, o, { apply = true, group = "apps" })
    assert.same({}, conflicts)
  end)

  it("an apply's scalar both changed is a conflict; a strategic merge's is the patch's", function()
    local l, o, s = d('{"data":{"a":"1"}}'), d('{"data":{"a":"2"}}'), d('{"data":{"a":"3"}}')
    local p = d('{"data":{"a":"3"}}')
    local _, conflicts = three_way.merge(l, s, o, { patch = p, apply = true, group = "" })
    assert.same({ "data.a" }, conflicts)
    local merged
    merged, conflicts = three_way.merge(l, s, o, { patch = p, group = "" })
    assert.same({}, conflicts)
    assert.equal("3", merged.data.a)
  end)

  it("a directive over what the overlay changed is a conflict", function()
    local l, o = d('{"data":{"a":"1"}}'), d('{"data":{"a":"1","b":"2"}}')
    local s = d('{"data":{"c":"3"}}')
    local _, conflicts = three_way.merge(l, s, o, { patch = d('{"data":{"$patch":"replace","c":"3"}}'), group = "" })
    assert.same({ "data (a patch directive)" }, conflicts)
  end)

  it("an apply that removes a field, or whose manager applied earlier in the rehearsal, is a conflict", function()
    local l = d('{"metadata":{"name":"c"},"data":{"a":"1","gone":"x"}}')
    local o = d('{"metadata":{"name":"c"},"data":{"a":"1","gone":"x","b":"2"}}')
    local s = d('{"metadata":{"name":"c"},"data":{"a":"1"}}')
    local _, conflicts = three_way.merge(l, s, o, { patch = d('{"data":{"a":"1"}}'), apply = true, group = "" })
    assert.same({ "data.gone (removed by the apply)" }, conflicts)
    local owned = d('{"metadata":{"name":"c","managedFields":[{"manager":"k","operation":"Apply",'
      .. '"fieldsV1":{"f:data":{"f:b":{}}}}]},"data":{"a":"1","gone":"x","b":"2"}}')
    local s2 = d('{"metadata":{"name":"c"},"data":{"a":"1","gone":"x","c":"3"}}')
    _, conflicts = three_way.merge(l, s2, owned, { patch = d('{"data":{"c":"3"}}'), apply = true, group = "",
      field_manager = "k" })
    assert.same({ "metadata.managedFields (fields applied by k earlier in the rehearsal)" }, conflicts)
  end)

  it("a strategic merge patch without lists or directives is a merge patch", function()
    assert.is_true(three_way.merge_patch_equivalent(d('{"metadata":{"labels":{"a":"b","c":null}},"data":{"x":"1"}}')))
    assert.is_false(three_way.merge_patch_equivalent(d('{"spec":{"containers":[{"name":"a"}]}}')))
    assert.is_false(three_way.merge_patch_equivalent(d('{"data":{"$patch":"replace"}}')))
  end)
end)
