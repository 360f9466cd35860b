-- cozy.kube.update: the per-object state machine of the update engine and
-- the scheduler that drives it (docs/engine-api.md, "Changing objects"),
-- against a stand-in resource and batch: each transition, the backoff and
-- deadline, and that the serial path begins nothing after a failure.
local update = require "cozy.kube.update"
local kerrors = require "cozy.kube.errors"
local json = require "cozy.json"

local POLICY = { max_attempts = 3, base_delay = 0.01, factor = 3, max_delay = 2, jitter = 0 }

local function cm(name, rv, data)
  return json.decode(json.encode { apiVersion = "v1", kind = "ConfigMap",
    metadata = { namespace = "ns", name = name, resourceVersion = rv }, data = data or { a = "1" } })
end

local function api_error(code, fields)
  local f = { method = "PATCH", path = "/x", code = code, reason = "R", message = "refused " .. code, attempts = {} }
  for k, v in pairs(fields or {}) do f[k] = v end
  return kerrors.new(f)
end

-- A resource whose reads answer from `store` (name -> object; absent: a 404
-- naming it) and a client whose batch answers PATCHes with `answers`
-- (a list of functions(req) -> ok, result), in order.
local function stand_in(store, answers)
  local sent, reads = {}, 0
  local client = { update_policy = POLICY, stats = { conflicts = 0 } }
  local resource = { client = client }
  function resource.path(_, ns, name) return ("/api/v1/namespaces/%s/configmaps/%s"):format(ns, name) end
  function resource._get(_, _, name)
    reads = reads + 1
    if store[name] == nil then
      error(api_error(404, { method = "GET", absent = "object", details = { name = name } }), 0)
    end
    return store[name]
  end
  function resource._patch_request(_, ns, name, ops)
    return "PATCH", resource:path(ns, name), { body = ops }
  end
  function client.prepare(_, method, path, spec) return { method = method, path = path, options = spec } end
  -- the answer to each request, by the options it was submitted with
  local results = {}
  function client.finish(_, req)
    local r = results[req.options]
    if not r[1] then error(r[2], 0) end
    return r[2]
  end
  client._t = { multi = function()
    local queue, next_id = {}, 0
    return setmetatable({
      submit = function(_, method, path, options)
        next_id = next_id + 1
        local req = { method = method, path = path, options = options }
        sent[#sent + 1] = req
        queue[#queue + 1] = next_id
        results[options] = table.pack(table.remove(answers, 1)(req))
        return next_id
      end,
      wait = function() return table.remove(queue, 1) end,
    }, { __close = function() end })
  end }
  return resource, client, sent, function() return reads end
end

local function change(resource, obj, set, extra)
  local o = { resource = resource, ns = "ns", name = obj.metadata.name, obj = obj,
    compute = update.editing(function(copy) copy.data.a = set return "edited" end) }
  for k, v in pairs(extra or {}) do o[k] = v end
  return update.new(o)
end

describe("update.new: a change's request", function()
  it("is a PATCH led by a test of the base's resourceVersion, then the difference", function()
    local resource = stand_in({}, {})
    local ch = change(resource, cm("a", "7"), "2")
    local method, path, spec = ch:request()
    assert.equal("PATCH", method)
    assert.equal("/api/v1/namespaces/ns/configmaps/a", path)
    assert.same({ { op = "test", path = "/metadata/resourceVersion", value = "7" },
      { op = "replace", path = "/data/a", value = "2" } }, spec.body)
    assert.equal("sent", ch.state)
    assert.equal("edited", ch.info)
  end)

  it("is none when the edit changes nothing: done, unchanged, the base as the result", function()
    local resource = stand_in({}, {})
    local base = cm("a", "7")
    local ch = change(resource, base, "1")
    assert.is_nil(ch:request())
    assert.equal("done", ch.state)
    assert.is_false(ch.changed)
    assert.equal(base, ch.result)
  end)

  it("reads the object first when no base was given", function()
    local resource, _, _, reads = stand_in({ a = cm("a", "9") }, {})
    local ch = update.new { resource = resource, ns = "ns", name = "a",
      compute = update.editing(function(copy) copy.data.a = "2" end) }
    local _, _, spec = ch:request()
    assert.equal(1, reads())
    assert.equal("9", spec.body[1].value)
  end)

  it("raises on a base without a resourceVersion", function()
    local resource = stand_in({}, {})
    local ch = change(resource, json.decode('{"metadata":{"namespace":"ns","name":"a"},"data":{"a":"1"}}'), "2")
    assert.has_error(function() ch:request() end, "update: /api/v1/namespaces/ns/configmaps/a has no metadata.resourceVersion")
  end)
end)

describe("Change:settle", function()
  it("a 2xx answer: done and changed, with the answer as the result", function()
    local resource = stand_in({}, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(true, cm("a", "8", { a = "2" }))
    assert.equal("done", ch.state)
    assert.is_true(ch.changed)
    assert.equal("8", ch.result.metadata.resourceVersion)
  end)

  it("a 409: again after the first backoff, re-read on the next request, counted as a conflict", function()
    local resource, client, _, reads = stand_in({ a = cm("a", "8") }, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(false, api_error(409))
    assert.equal("again", ch.state)
    assert.equal(POLICY.base_delay, ch.delay)
    assert.equal(1, client.stats.conflicts)
    assert.is_nil(ch.obj)
    local _, _, spec = ch:request()
    assert.equal(1, reads())
    assert.equal("8", spec.body[1].value)
  end)

  it("backs off growing by the policy's factor, and gives up after its attempts with the error named", function()
    local resource = stand_in({ a = cm("a", "8") }, {})
    local ch = change(resource, cm("a", "7"), "2")
    local delays = {}
    for _ = 1, POLICY.max_attempts - 1 do
      ch:request()
      ch:settle(false, api_error(409))
      delays[#delays + 1] = ch.delay
    end
    assert.same({ 0.01, 0.03 }, { delays[1], math.floor(delays[2] * 1000 + 0.5) / 1000 })
    ch:request()
    ch:settle(false, api_error(409))
    assert.equal("failed", ch.state)
    assert.is_true(ch.gave_up)
    assert.equal("refused 409 (gave up after 3 conflicting attempts)", ch.err.message)
  end)

  it("gives up when the next backoff would pass its deadline", function()
    local resource = stand_in({ a = cm("a", "8") }, {})
    local ch = change(resource, cm("a", "7"), "2", { deadline = require("cozy.sys").monotime() })
    ch:request()
    ch:settle(false, api_error(409))
    assert.equal("failed", ch.state)
    assert.is_true(ch.gave_up)
    assert.matches("gave up at its deadline after 1 conflicting attempts", ch.err.message)
  end)

  it("a 422 without causes while the object did not move: failed, not a conflict", function()
    local resource, client = stand_in({ a = cm("a", "7") }, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    local e = api_error(422)
    ch:settle(false, e)
    assert.equal("failed", ch.state)
    assert.equal(e, ch.err)
    assert.equal(0, client.stats.conflicts)
  end)

  it("a 422 without causes when the object moved on: again, from the fresh object", function()
    local resource = stand_in({ a = cm("a", "8") }, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(false, api_error(422))
    assert.equal("again", ch.state)
    assert.equal("8", ch.obj.metadata.resourceVersion)
  end)

  it("a 422 naming refused fields is the object's fault: failed at once, nothing re-read", function()
    local resource, _, _, reads = stand_in({ a = cm("a", "8") }, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(false, api_error(422, { details = { causes = { { field = "data.a", message = "bad" } } } }))
    assert.equal("failed", ch.state)
    assert.equal(0, reads())
  end)

  it("an absent object (its 404): absent; also when the conflict's re-read finds it gone", function()
    local resource = stand_in({}, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(false, api_error(404, { absent = "object" }))
    assert.equal("absent", ch.state)
    local ch2 = change(resource, cm("a", "7"), "2")
    ch2:request()
    ch2:settle(false, api_error(422))
    assert.equal("absent", ch2.state)
    assert.equal(404, ch2.err.code)
  end)

  it("an uncertain attempt before a conflict: a later empty edit still counts as changed", function()
    local resource = stand_in({ a = cm("a", "8", { a = "2" }) }, {})
    local ch = change(resource, cm("a", "7"), "2")
    ch:request()
    ch:settle(false, api_error(409, { attempts = { { code = 503 }, { code = 409 } } }))
    assert.is_nil(ch:request())
    assert.equal("done", ch.state)
    assert.is_true(ch.changed)
  end)
end)

describe("update.run", function()
  local function pull_of(list)
    local i = 0
    return function() i = i + 1 return list[i] end
  end

  it("drives a conflict through to done: the re-read and the second PATCH", function()
    local resource, client, sent = stand_in({ a = cm("a", "8") }, {
      function() return false, api_error(409) end,
      function() return true, cm("a", "9", { a = "2" }) end,
    })
    local ended = {}
    update.run(client, pull_of { change(resource, cm("a", "7"), "2") }, 1, function(ch) ended[#ended + 1] = ch end)
    assert.equal(2, #sent)
    assert.equal("8", sent[2].options.body[1].value)
    assert.equal(1, #ended)
    assert.equal("done", ended[1].state)
  end)

  it("serial (concurrency 1): after a failure no other change is begun, and the failure is raised", function()
    local resource, client, sent = stand_in({}, {
      function() return false, api_error(403) end,
      function() return true, cm("b", "2") end,
    })
    local pulled = 0
    local list = { change(resource, cm("a", "7"), "2"), change(resource, cm("b", "1"), "2") }
    local err = select(2, pcall(update.run, client, function()
      pulled = pulled + 1
      return list[pulled]
    end, 1, function(ch) if ch.state ~= "done" then error(ch.err, 0) end end))
    assert.equal("refused 403", err.message)
    assert.equal(1, #sent)
    assert.equal(1, pulled)
  end)

  it("a client dry run's kept-back write ends its change at once with the computed answer", function()
    local resource, client, sent = stand_in({}, {})
    client.prepare = function() return nil, cm("a", "7", { a = "2" }) end
    local ended
    update.run(client, pull_of { change(resource, cm("a", "7"), "2") }, 8, function(ch) ended = ch end)
    assert.equal(0, #sent)
    assert.equal("done", ended.state)
    assert.is_true(ended.changed)
    assert.equal("2", ended.result.data.a)
  end)
end)

describe("update.run's backoff", function()
  local sys = require "cozy.sys"
  local real_sleep = sys.sleep
  after_each(function() sys.sleep = real_sleep end)

  it("parks a conflicting change for its backoff while another goes ahead, then sends it again", function()
    local slept = {}
    sys.sleep = function(d) slept[#slept + 1] = d real_sleep(d) end
    local resource, client, sent = stand_in({ a = cm("a", "8") }, {
      function() return false, api_error(409) end,
      function() return true, cm("b", "2", { a = "2" }) end,
      function() return true, cm("a", "9", { a = "2" }) end,
    })
    local list, i, ended = { change(resource, cm("a", "7"), "2"), change(resource, cm("b", "1"), "2") }, 0, {}
    update.run(client, function() i = i + 1 return list[i] end, 2, function(ch) ended[#ended + 1] = ch.name end)
    assert.same({ "/api/v1/namespaces/ns/configmaps/a", "/api/v1/namespaces/ns/configmaps/b",
      "/api/v1/namespaces/ns/configmaps/a" }, { sent[1].path, sent[2].path, sent[3].path })
    assert.same({ "b", "a" }, ended)
    -- the only waits are a's backoff, within its first delay
    assert.is_true(#slept >= 1)
    for _, d in ipairs(slept) do assert.is_true(d > 0 and d <= POLICY.base_delay, tostring(d)) end
  end)
end)
