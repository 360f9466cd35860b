-- cozy.kube.changes: a rehearsal's objects for the end of a plan: before,
-- after and their diff, without server-set metadata, Secret values redacted.
local changes = require "cozy.kube.changes"
local json = require "cozy.json"
local overlay = require "cozy.kube.overlay"

local function obj(kind, name, fields)
  local o = json.object { apiVersion = "v1", kind = kind, metadata = json.object { name = name, namespace = "a",
    resourceVersion = "7", uid = "u-1", generation = 3, creationTimestamp = "2024-01-01T00:00:00Z",
    managedFields = json.array { json.object { manager = "kubectl" } } } }
  for k, v in pairs(fields or {}) do o[k] = v end
  return o
end

local function by_name(reports)
  local out = {}
  for _, r in ipairs(reports) do out[r.name] = r end
  return out
end

describe("cozy.kube.changes", function()
  it("leaves out the metadata the server sets and keeps status, as kubectl diff does", function()
    local ov = overlay.new()
    local live = obj("ConfigMap", "x", { data = json.object { a = "1" }, status = json.object { phase = "Old" } })
    ov:put("", "configmaps", obj("ConfigMap", "x", { data = json.object { a = "2" },
      status = json.object { phase = "Old" } }), { live = true, before = live })
    local r = changes.report(ov)[1]
    assert.equal("changed", r.action)
    for _, side in ipairs { r.before, r.after } do
      for _, k in ipairs(changes.SERVER_SET) do assert.is_nil(side.metadata[k], k) end
      assert.equal("Old", side.status.phase)
    end
    assert.same({ "--- live/v1.ConfigMap.a.x", "+++ planned/v1.ConfigMap.a.x", "@@ -1,6 +1,6 @@", " apiVersion: v1",
      " data:", '-  a: "1"', '+  a: "2"', " kind: ConfigMap", " metadata:", "   name: x" }, r.diff)
  end)

  it("gives no diff, and says why, when the live object could not be read first", function()
    local ov = overlay.new()
    ov:put("", "configmaps", obj("ConfigMap", "x"), { live = true, before_unknown = "the live object could not be "
      .. "read: forbidden" })
    local r = changes.report(ov)[1]
    assert.is_nil(r.diff)
    assert.equal("the live object could not be read: forbidden", r.before_unknown)
  end)

  it("redacts every value of a Secret, marking those the rehearsal changed or added", function()
    local ov = overlay.new()
    local live = obj("Secret", "s", { data = json.object { same = "c2FtZQ==", old = "b2xk" },
      metadata = json.object { name = "s", namespace = "a", annotations = json.object {
        ["kubectl.kubernetes.io/last-applied-configuration"] = '{"data":{"old":"b2xk"}}' } } })
    ov:put("", "secrets", obj("Secret", "s", { data = json.object { same = "c2FtZQ==", old = "bmV3" },
      stringData = json.object { added = "plain" } }), { live = true, before = live })
    ov:delete("", "secrets", "a", "gone", true, obj("Secret", "gone", { data = json.object { k = "Z29uZQ==" } }))
    local rs = by_name(changes.report(ov))
    local s = rs.s
    assert.same({ same = "<redacted>", old = "<redacted>" }, s.before.data)
    assert.same({ same = "<redacted>", old = changes.CHANGED }, s.after.data)
    assert.same({ added = changes.CHANGED }, s.after.stringData)
    assert.equal('{"data":{"old":"<redacted>"}}',
      s.before.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"])
    assert.same({ k = "<redacted>" }, rs.gone.before.data)
    local all = json.encode(changes.report(ov))
    for _, v in ipairs { "c2FtZQ==", "b2xk", "bmV3", "plain", "Z29uZQ==" } do
      assert.is_nil(all:find(v, 1, true), v)
    end
  end)

  it("says a deleted object kept by its finalizers is terminating", function()
    local ov = overlay.new()
    local after = obj("ConfigMap", "t")
    after.metadata.deletionTimestamp = "2024-01-02T00:00:00Z"
    after.metadata.finalizers = json.array { "keep" }
    ov:put("", "configmaps", after, { live = true, before = obj("ConfigMap", "t") })
    local r = changes.report(ov)[1]
    assert.is_true(r.terminating)
    assert.is_nil(r.after.metadata.deletionTimestamp)
    assert.same({ "+  finalizers:", "+  - keep" }, { r.diff[7], r.diff[8] })
  end)

  it("makes the before from the after, sharing the tables the writes left alone", function()
    local ov = overlay.new()
    local function vm(volumes)
      return obj("VirtualMachine", "vm", { apiVersion = "kubevirt.io/v1", spec = json.decode('{"running":true,'
        .. '"template":{"spec":{"domain":{"cpu":{"cores":2}},"volumes":' .. volumes .. '}}}'),
        status = json.decode('{"conditions":[{"type":"Ready","status":"True"}]}') })
    end
    ov:put("kubevirt.io", "virtualmachines", vm('[{"name":"a"},{"name":"b"}]'),
      { live = true, before = vm('[{"name":"a"}]') })
    local r = changes.report(ov)[1]
    assert.same({ "--- live/kubevirt.io.v1.VirtualMachine.a.vm", "+++ planned/kubevirt.io.v1.VirtualMachine.a.vm",
      "@@ -12,6 +12,7 @@", "           cores: 2", "       volumes:", "       - name: a",
      "+      - name: b", " status:", "   conditions:", "   - status: \"True\"" }, r.diff)
    assert.equal(r.before.status, r.after.status)
    assert.equal(r.before.metadata, r.after.metadata)
    assert.equal(r.before.spec.template.spec.domain, r.after.spec.template.spec.domain)
    assert.are_not.equal(r.before.spec.template.spec.volumes, r.after.spec.template.spec.volumes)
    assert.same({ { name = "a" } }, r.before.spec.template.spec.volumes)
    for _, side in ipairs { r.before, r.after } do
      for _, k in ipairs(changes.SERVER_SET) do assert.is_nil(side.metadata[k], k) end
    end
  end)

  it("redacts a Secret an object of another kind holds, and shows what nests too deep as before", function()
    local ov = overlay.new()
    local function holder(value)
      return obj("Template", "h", { apiVersion = "example.io/v1", spec = json.object { objects = json.array {
        json.object { apiVersion = "v1", kind = "Secret", data = json.object { k = value } } } } })
    end
    ov:put("example.io", "templates", holder("bmV3"), { live = true, before = holder("b2xk") })
    local deep = json.object {}
    local cur = deep
    for _ = 1, 70 do
      cur.x = json.object {}
      cur = cur.x
    end
    local deep_after = obj("ConfigMap", "deep", { data = json.object { k = "2" }, spec = deep })
    ov:put("", "configmaps", deep_after, { live = true, before = obj("ConfigMap", "deep", { spec = deep }) })
    local rs = by_name(changes.report(ov))
    assert.same({ k = "<redacted>" }, rs.h.before.spec.objects[1].data)
    assert.same({ k = "<redacted>" }, rs.h.after.spec.objects[1].data)
    assert.is_nil(table.concat(rs.h.diff, "\n"):find("bmV3", 1, true))
    -- a table nested deeper than trace.MAX_DEPTH shows as trace.redacted shows it
    assert.same(require("cozy.kube.trace").redacted(deep_after).spec, rs.deep.after.spec)
    assert.is_truthy(json.encode(rs.deep.before):find('"<too deep>"', 1, true))
  end)
end)
