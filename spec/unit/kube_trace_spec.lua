-- cozy.kube.trace: kubectl's -v=6/-v=8 request trace, Secret data redacted.
local trace = require "cozy.kube.trace"
local json = require "cozy.json"

-- A logger that keeps each line's fields.
local function logger(verbosity)
  local lines = {}
  return { verbosity = verbosity, write = function(_, level, message, fields)
    lines[#lines + 1] = { level = level, message = message, fields = fields }
  end }, lines
end

local function req(method, path, body)
  return { method = method, path = path, shown = path, options = { body = body and json.encode(body) } }
end

local LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

-- The annotation `kubectl apply` leaves: the object it applied, with a newline.
local function applied(data, string_data)
  return json.encode { apiVersion = "v1", kind = "Secret", metadata = { name = "x" }, data = data,
    stringData = string_data } .. "\n"
end

describe("cozy.kube.trace", function()
  it("logs nothing below -v=6", function()
    local log, lines = logger(5)
    trace.request(log, req("GET", "/api"), {}, { { code = 200, elapsed_s = 0.01 } })
    assert.same({}, lines)
  end)

  it("logs each attempt sent at -v=6: method, path, status, duration; no bodies", function()
    local log, lines = logger(6)
    trace.request(log, req("PATCH", "/api/v1/namespaces/a/configmaps/x", { data = { k = "v" } }), { kind = "ConfigMap" },
      { { code = 503, elapsed_s = 0.0104 }, { sent = false, code = 0 }, { code = 200, elapsed_s = 0.02 } })
    assert.equal(2, #lines)
    assert.same({ method = "PATCH", path = "/api/v1/namespaces/a/configmaps/x", status = 503, ms = 10, attempt = 1 },
      lines[1].fields)
    assert.same({ method = "PATCH", path = "/api/v1/namespaces/a/configmaps/x", status = 200, ms = 20, attempt = 3 },
      lines[2].fields)
  end)

  it("names a transport failure's reason", function()
    local log, lines = logger(6)
    trace.request(log, req("GET", "/api"), nil, { { code = 0, reason = "ConnectionRefused", elapsed_s = 0.001 } })
    assert.equal("ConnectionRefused", lines[1].fields.reason)
  end)

  for _, case in ipairs({
    { "a secrets list", req("GET", "/api/v1/namespaces/a/secrets"),
      { kind = "SecretList", items = { { metadata = { name = "x" }, data = { a = "AAAA" } } } }, "AAAA" },
    { "a JSON patch of a Secret", req("PATCH", "/api/v1/namespaces/a/secrets/x",
      { { op = "replace", path = "/data/a", value = "BBBB" } }), { kind = "Secret", data = { a = "BBBB" } }, "BBBB" },
    { "a merge patch's stringData", req("PATCH", "/api/v1/namespaces/a/secrets/x", { stringData = { a = "plain" } }),
      nil, "plain" },
    { "a Secret in another list", req("GET", "/api/v1/namespaces/a/pods"),
      { kind = "List", items = { { kind = "Secret", data = { a = "CCCC" }, stringData = { b = "DDDD" } } } }, "CCCC", "DDDD" },
    { "the cluster-wide secrets list", req("GET", "/api/v1/secrets"),
      { items = { { data = { a = "EEEE" } } } }, "EEEE" },
    { "a refusal quoting the Secret it was sent (a real server's 422)", req("PATCH", "/api/v1/namespaces/a/secrets/x"),
      json.encode({ kind = "Status", code = 422, reason = "Invalid",
        message = "patch: Invalid value: \"{\\\"data\\\":{\\\"p\\\":\\\"GGGG\\\"}}\"",
        details = { causes = { { field = "patch", message = "Invalid value: GGGG" } } } }), "GGGG" },
    { "a secrets answer that is not JSON", req("GET", "/api/v1/namespaces/a/secrets/x"), "FFFF not json", "FFFF" },
    -- issue 35: the annotations that carry a copy of a Secret's data
    { "a Secret's last-applied-configuration", req("GET", "/api/v1/namespaces/a/secrets/x"),
      { kind = "Secret", metadata = { annotations = { [LAST_APPLIED] = applied { p = "HHHH" } } } }, "HHHH" },
    { "the last-applied-configuration of a secrets list's item", req("GET", "/api/v1/namespaces/a/secrets"),
      { kind = "SecretList", items = { { metadata = { annotations = { [LAST_APPLIED] = applied(nil, { p = "IIII" }) } } } } },
      "IIII" },
    { "a merge patch setting the annotation", req("PATCH", "/api/v1/namespaces/a/secrets/x",
      { metadata = { annotations = { [LAST_APPLIED] = applied { p = "JJJJ" } } } }), nil, "JJJJ" },
    { "kapp's original of a Secret in another list", req("GET", "/api/v1/namespaces/a/pods"),
      { kind = "List", items = { { kind = "Secret", metadata = { annotations = {
        ["kapp.k14s.io/original"] = json.encode { kind = "Secret", data = { p = "KKKK" } } } } } } }, "KKKK" },
    { "a watch event's Secret", req("GET", "/api/v1/namespaces/a/secrets"),
      { type = "ADDED", object = { kind = "Secret", metadata = { annotations = { [LAST_APPLIED] = applied { p = "LLLL" } } } } },
      "LLLL" },
    { "an annotation that looks like JSON and does not decode", req("GET", "/api/v1/namespaces/a/secrets/x"),
      { kind = "Secret", metadata = { annotations = { [LAST_APPLIED] = '{"data":{"p":"MMMM"' } } }, "MMMM" },
  }) do
    it("redacts " .. case[1] .. " at -v=9, and leaves the caller's body as it was", function()
      local log, lines = logger(9)
      local before = json.encode({ case[3] or json.null })
      trace.request(log, case[2], case[3], { { code = 200, elapsed_s = 0.01 } })
      assert.equal(before, json.encode({ case[3] or json.null }))
      local shown = (lines[1].fields.request_body or "") .. (lines[1].fields.response_body or "")
      assert.matches("<redacted>", shown, 1, true)
      for i = 4, #case do assert.not_matches(case[i], shown, 1, true) end
    end)
  end

  it("keeps a Secret's other annotations, and the rest of its last-applied-configuration", function()
    local log, lines = logger(8)
    trace.request(log, req("GET", "/api/v1/namespaces/a/secrets/x"), { kind = "Secret", metadata = { annotations = {
      owner = "team-a", [LAST_APPLIED] = applied { p = "NNNN" } } } }, { { code = 200, elapsed_s = 0.01 } })
    local shown = json.decode(lines[1].fields.response_body)
    assert.equal("team-a", shown.metadata.annotations.owner)
    local inner = json.decode(shown.metadata.annotations[LAST_APPLIED])
    assert.same({ p = "<redacted>" }, inner.data)
    assert.equal("x", inner.metadata.name)
  end)

  it("blanks a URL's user-info before it cuts a body at 1 KiB", function()
    local log, lines = logger(8)
    -- the cut falls inside the password: before the '@' that marks it
    local value = ("v"):rep(990) .. " http://user:" .. ("s"):rep(100) .. "@proxy:3128"
    trace.request(log, req("GET", "/api/v1/namespaces/a/configmaps/x"), { kind = "ConfigMap", data = { k = value } },
      { { code = 200, elapsed_s = 0.01 } })
    assert.matches("[truncated", lines[1].fields.response_body, 1, true)
    assert.not_matches("user:", lines[1].fields.response_body, 1, true)
    assert.not_matches("sss", lines[1].fields.response_body, 1, true)
  end)

  it("shows other bodies, cut at 1 KiB at -v=8 and whole at -v=9", function()
    local data = {}
    for i = 1, 100 do data["k" .. i] = ("x"):rep(30) end
    for _, v in ipairs({ 8, 9 }) do
      local log, lines = logger(v)
      trace.request(log, req("GET", "/api/v1/namespaces/a/configmaps/x"), { kind = "ConfigMap", data = data },
        { { code = 200, elapsed_s = 0.01 } })
      local body = lines[1].fields.response_body
      if v == 8 then
        assert.matches("^{.+ %[truncated %d+ chars%]$", body)
        assert.equal(1024, #body:match("^(.-) %[truncated"))
      else
        assert.same({ kind = "ConfigMap", data = data }, json.decode(body))
      end
    end
  end)

  describe("redacted", function()
    local other_mt = { __name = "proxy" }

    it("copies a body with nothing to redact: equal, not the same tables, only cozy.json's marks kept", function()
      local ops = json.decode('[{"op":"add","path":"/spec/volumes/-","value":{"name":"v","secret":'
        .. '{"secretName":"Secret"}}},{"op":"test","path":"/metadata/resourceVersion","value":"7"}]')
      ops[1].value.extra = setmetatable({ a = 1 }, other_mt)
      local c = trace.redacted(ops, false)
      assert.same(ops, c)
      assert.are_not.equal(ops, c)
      assert.are_not.equal(ops[1].value, c[1].value)
      assert.equal(json.array_mt, getmetatable(c))
      assert.equal(json.object_mt, getmetatable(c[1].value))
      assert.is_nil(getmetatable(c[1].value.extra))
      assert.equal(json.encode(ops), json.encode(c))
    end)

    it("still redacts a Secret nested anywhere, and cuts what nests past MAX_DEPTH, whatever the marks", function()
      local body = json.decode('{"kind":"List","items":[{"kind":"ConfigMap","data":{"a":"1"}},'
        .. '{"kind":"Secret","data":{"k":"djE="}}]}')
      body.items[2].extra = setmetatable({ b = 2 }, other_mt)
      local c = trace.redacted(body, false)
      assert.same({ k = "<redacted>" }, c.items[2].data)
      assert.same({ a = "1" }, c.items[1].data)
      assert.is_nil(getmetatable(c.items[2].extra))
      assert.equal("djE=", body.items[2].data.k)
      local deep = {}
      local cur = deep
      for _ = 1, trace.MAX_DEPTH + 1 do
        cur.x = {}
        cur = cur.x
      end
      local cut = trace.redacted(deep, false)
      for _ = 1, trace.MAX_DEPTH do cut = cut.x end
      assert.equal("<too deep>", cut.x)
    end)
  end)
end)
