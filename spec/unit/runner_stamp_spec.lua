-- The stamp's JSON patch ops and history, and the lease's time handling.
local stamp = require "cozy.runner.stamp"
local lease = require "cozy.runner.lease"
local json = require "cozy.json"

describe("runner stamp", function()
  it("adds the label, version and a history record to a bare ConfigMap", function()
    local ops = stamp.ops({ metadata = { name = "cozystack-version" } },
      { version = 5, record = { number = 4 } })
    assert.same({ op = "add", path = "/metadata/labels", value = { ["platform.cozystack.io/no-delete"] = "true" } }, ops[1])
    assert.equal("/data", ops[2].path)
    assert.equal("5", ops[2].value.version)
    assert.equal(4, json.decode(ops[2].value.history)[1].number)
  end)

  it("keeps existing labels and appends to history", function()
    local cm = { metadata = { labels = { other = "x" } },
      data = { version = "4", history = json.encode({ { number = 3 } }) } }
    local ops = stamp.ops(cm, { version = 5, record = { number = 4 } })
    assert.same({ op = "add", path = "/metadata/labels/platform.cozystack.io~1no-delete", value = "true" }, ops[1])
    assert.same({ op = "add", path = "/data/version", value = "5" }, ops[2])
    local h = json.decode(ops[3].value)
    assert.same({ 3, 4 }, { h[1].number, h[2].number })
  end)

  it("bounds the history", function()
    local list = {}
    for i = 1, stamp.HISTORY_LIMIT + 5 do list[i] = { number = i } end
    local cm = { metadata = { labels = { ["platform.cozystack.io/no-delete"] = "true" } },
      data = { version = "1", history = json.encode(list) } }
    local ops = stamp.ops(cm, { record = { number = 999 } })
    assert.equal(1, #ops)
    local h = json.decode(ops[1].value)
    assert.equal(stamp.HISTORY_LIMIT, #h)
    assert.equal(999, h[#h].number)
  end)

  it("parses versions strictly", function()
    assert.equal(59, stamp.version_of({ data = { version = "59" } }))
    assert.equal(7, stamp.version_of({ data = { version = " 7\n" } }))
    for _, bad in ipairs({ "x", "", "5.5", "-1" }) do
      assert.has_error(function() stamp.version_of({ metadata = {}, data = { version = bad } }) end,
        ('ConfigMap ?/cozystack-version has no valid data.version ("%s"): refusing to guess'):format(bad))
    end
    assert.has_error(function() stamp.version_of({ metadata = {} }) end,
      "ConfigMap ?/cozystack-version has no valid data.version (absent): refusing to guess")
  end)

  it("refuses a malformed history, naming the key and what it found; status reads it leniently", function()
    local errors = require "cozy.errors"
    for _, case in ipairs({
      { "not json", "found not JSON" },
      { '{"a":1}', "found a JSON object" },
      { '"x"', "found a JSON string" },
      { "[1,2,3]", "found an array whose entry 1 is not a record (a JSON number)" },
      { '[{"number":1},[2]]', "found an array whose entry 2 is not a record (a JSON array)" },
    }) do
      local cm = { metadata = { namespace = "ns" }, data = { version = "3", history = case[1] } }
      local ok, err = pcall(stamp.history_of, cm)
      assert.is_false(ok, case[1])
      assert.is_true(errors.is(err, "failed"), tostring(err))
      assert.matches("ConfigMap ns/cozystack-version: data.history must be a JSON array of step records, "
        .. case[2], err.message, 1, true)
      -- and it is never appended to
      assert.error_matches(function() stamp.ops(cm, { version = 4, record = { number = 3 } }) end,
        "ConfigMap ns/cozystack-version: data.history must be a JSON array of step records, " .. case[2], nil, true)
      local h, why = stamp.history_of(cm, true)
      assert.same({}, h)
      assert.equal(err.message, why)
    end
    assert.same({}, stamp.history_of({ data = { history = "[]" } }))
  end)
end)

describe("runner lease times", function()
  it("formats and parses MicroTime", function()
    local t = 1764670000.25
    local s = lease.microtime(t)
    assert.equal("2025-12-02T10:06:40.250000Z", s)
    assert.near(t, lease.parse_time(s), 1e-6)
    assert.equal(0, lease.parse_time("1970-01-01T00:00:00Z"))
    assert.equal(3600, lease.parse_time("1970-01-01T02:00:00+01:00"))
    assert.is_nil(lease.parse_time("yesterday"))
  end)

  it("tells live from expired", function()
    local now = 1000000
    local obj = { spec = { renewTime = lease.microtime(now - 10), leaseDurationSeconds = 30 } }
    assert.near(20, lease.remaining(obj, now), 1e-6)
    obj.spec.renewTime = lease.microtime(now - 40)
    assert.is_true(lease.remaining(obj, now) < 0)
    assert.is_true(lease.remaining({ spec = {} }, now) < 0)
  end)
end)
