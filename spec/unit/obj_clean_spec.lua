-- obj.clean: a copy of an object without what the API server sets, as a
-- migration that copies or adopts an object creates it.
local json = require "cozy.json"
local obj = require "cozy.obj"

describe("obj.clean", function()
  local live = json.decode([[{"apiVersion":"v1","kind":"ConfigMap",
    "metadata":{"name":"a","namespace":"ns","labels":{"x":"1"},"annotations":{},"finalizers":["f"],
      "resourceVersion":"42","uid":"u-1","generation":3,"creationTimestamp":"2026-01-01T00:00:00Z",
      "deletionTimestamp":"2026-01-02T00:00:00Z","deletionGracePeriodSeconds":30,"selfLink":"/x",
      "managedFields":[{"manager":"kubectl"}],"ownerReferences":[{"kind":"X","name":"o","uid":"u-0"}]},
    "data":{"k":"v","empty":""},"list":[],"status":{"phase":"Ready"}}]])

  it("leaves out every server-set metadata field and status, keeping the rest exactly", function()
    local c = obj.clean(live)
    assert.equal('{"apiVersion":"v1","data":{"empty":"","k":"v"},"kind":"ConfigMap","list":[],'
      .. '"metadata":{"annotations":{},"finalizers":["f"],"labels":{"x":"1"},"name":"a","namespace":"ns",'
      .. '"ownerReferences":[{"kind":"X","name":"o","uid":"u-0"}]}}', json.encode(c))
  end)

  it("keeps status when asked, and never changes the object it copies", function()
    local before = json.encode(live)
    local c = obj.clean(live, { keep_status = true })
    assert.same({ phase = "Ready" }, c.status)
    c.metadata.labels.x = "2"
    assert.equal(before, json.encode(live))
  end)

  it("takes an object without metadata, and refuses what is not a table", function()
    assert.same({ kind = "X" }, obj.clean({ kind = "X", status = {} }))
    assert.has_error(function() obj.clean("x") end, 'obj.clean(o, opts): o must be an object (a table), got "x"')
  end)
end)
