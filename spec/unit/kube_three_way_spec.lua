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

  it("applies a strategic merge patch here where its lists are the known by-name ones, in the server's order", function()
    local obj = deployment(container("app", "nginx:1.27", { { "MODE", "one" } }), container("sidecar", "busybox:1.36"),
      { app = "api", gone = "x" })
    local p = d('{"metadata":{"labels":{"team":"x","gone":null}},"spec":{"template":{"spec":{"containers":['
      .. '{"name":"app","image":"nginx:1.28","args":["-g"],"env":[{"name":"LEVEL","value":"two"}]},'
      .. '{"name":"sidecar","$patch":"delete"},{"name":"extra","image":"e:1"}]}}}}')
    local r = assert(three_way.strategic(obj, p, "apps"))
    assert.same({ app = "api", team = "x" }, r.metadata.labels)
    assert.equal('[{"args":["-g"],"env":[{"name":"LEVEL","value":"two"},{"name":"MODE","value":"one"}],'
      .. '"image":"nginx:1.28","name":"app"},{"image":"e:1","name":"extra"}]', json.encode(r.spec.template.spec.containers))
    -- an element the patch adds goes before the original's that follow the last one it names
    local l = d('{"env":[{"name":"A"},{"name":"B"},{"name":"C"}]}')
    assert.same({ "A", "N", "B", "C" }, (function()
      local out = {}
      for _, e in ipairs(assert(three_way.strategic(d('{"spec":' .. json.encode(l) .. '}'),
        d('{"spec":{"env":[{"name":"A","value":"1"},{"name":"N"}]}}'), "")).spec.env) do out[#out + 1] = e.name end
      return out
    end)())
  end)

  it("does not apply here a list whose strategy is the server's schema's, nor a directive", function()
    local svc = d('{"spec":{"ports":[{"name":"http","port":80}]}}')
    local r, why = three_way.strategic(svc, d('{"spec":{"ports":[{"name":"http","port":81}]}}'), "")
    assert.is_nil(r)
    assert.equal("the list spec.ports (its merge strategy is the server's schema's)", why)
    r, why = three_way.strategic(svc, d('{"spec":{"$retainKeys":["ports"]}}'), "")
    assert.is_nil(r)
    assert.equal("the directive spec.$retainKeys", why)
    -- containers outside the pod-bearing built-in groups: not known to merge by name
    assert.is_nil(three_way.strategic(d('{"spec":{}}'), d('{"spec":{"containers":[{"name":"a"}]}}'), "example.com"))
  end)
end)
