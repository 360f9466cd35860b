-- Lists from a server that answers nonsense (docs/transport.md, "Lists"): a
-- list whose items are not an array of objects, or whose pagination does not
-- move forward, is an InvalidResponse error naming the request, never a raw
-- Lua error, a silently empty answer or a pager that loops.
local transport_harness = require("spec.helpers").transport
local kube = require "cozy.kube"
local json = require "cozy.json"

local TEAM_A = "/api/v1/namespaces/team-a/configmaps"

describe("cozy.kube list against a malformed or looping server", function()
  local srv, client, cms
  transport_harness.fresh_server(function(s)
    srv = s
    client = transport_harness.connect(srv)
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  local function list_requests()
    return transport_harness.api_requests(srv, "GET", "^" .. TEAM_A:gsub("%-", "%%-") .. "$")
  end

  -- Lists team-a in pages of `limit`; returns the names yielded and the error.
  local function walk(limit)
    local got = {}
    local ok, err = pcall(function()
      for o in cms:list { namespace = "team-a", limit = limit } do got[#got + 1] = o.metadata.name end
    end)
    return got, (not ok) and err or nil
  end

  local function assert_invalid(err, message)
    assert.is_truthy(err, "the list did not fail")
    assert.is_true(kube.is_error(err), tostring(err))
    assert.equal("InvalidResponse", err.reason)
    assert.equal("GET", err.method)
    assert.equal(200, err.code)
    assert.equal(TEAM_A .. "?limit=", err.path:sub(1, #TEAM_A + 7))
    assert.matches(message, err.message, 1, true)
    -- the request is named in what an operator reads
    assert.matches("GET " .. TEAM_A .. "?limit=", tostring(err), 1, true)
    assert.matches("InvalidResponse (200): " .. message, tostring(err), 1, true)
  end

  local function respond(body, extra)
    local rule = { method = "GET", path = "/team-a/configmaps\\?", respond = { body = body } }
    for k, v in pairs(extra or {}) do rule[k] = v end
    srv:faults { rule }
  end

  describe("items", function()
    it("null is an error, not an attempt to index a nil", function()
      respond('{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":null}')
      local got, err = walk(5)
      assert_invalid(err, "the list's items is null, not an array")
      assert.same({}, got)
      assert.same({ "respond" }, srv:fired())
    end)

    it("[1] is an error naming the element", function()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = {}, items = { 1 } }
      local _, err = walk(5)
      assert_invalid(err, "items[0] is a number (1), not an object")
      assert.same({ "respond" }, srv:fired())
    end)

    it("{} is an error, not an empty list", function()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = {}, items = json.object() }
      local _, err = walk(5)
      assert_invalid(err, "the list's items is an object, not an array")
      assert.same({ "respond" }, srv:fired())
    end)

    it("an element that is not a named object is an error", function()
      local good = { metadata = { name = "cm-x", namespace = "team-a" } }
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = {},
        items = { good, { metadata = { namespace = "team-a" } } } }
      local _, err = walk(5)
      assert_invalid(err, "items[1].metadata.name is absent, not a name")
      srv:clear_requests()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = {}, items = { good, { metadata = "x" } } }
      _, err = walk(5)
      assert_invalid(err, 'items[1].metadata is the string "x", not an object')
      srv:clear_requests()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = {}, items = { json.null } }
      _, err = walk(5)
      assert_invalid(err, "items[0] is null, not an object")
      assert.same({ "respond" }, srv:fired())
    end)

    it("absent is an empty page when the answer is of a List kind (items omitted when empty)", function()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = { resourceVersion = "7" } }
      local p = cms:list { namespace = "team-a", limit = 5 }
      assert.is_nil(p())
      assert.equal(1, p.pages)
      assert.equal(0, p.count)
      assert.equal("7", p.resource_version)
      assert.same({ "respond" }, srv:fired())
    end)

    it("absent is an error when nothing says the answer is a list", function()
      respond { apiVersion = "v1", metadata = {} }
      local _, err = walk(5)
      assert_invalid(err, "the answer has neither items nor a kind: not a list")
      assert.same({ "respond" }, srv:fired())
    end)
  end)

  describe("the answer itself", function()
    it("of a kind that is not a list is an error", function()
      respond { kind = "Status", apiVersion = "v1", metadata = {}, status = "Success", items = json.array() }
      local _, err = walk(5)
      assert_invalid(err, 'the answer\'s kind is the string "Status", not a list kind (...List)')
      srv:clear_requests()
      respond { kind = "ConfigMap", apiVersion = "v1", metadata = { name = "cm-00" } }
      _, err = walk(5)
      assert_invalid(err, 'the answer\'s kind is the string "ConfigMap", not a list kind')
      assert.same({ "respond" }, srv:fired())
    end)

    it("that is not an object is an error", function()
      respond { { metadata = { name = "cm-00" } } }
      local _, err = walk(5)
      assert_invalid(err, "a list answer must be a JSON object, got an array")
      srv:clear_requests()
      respond '"items"'
      _, err = walk(5)
      assert_invalid(err, 'a list answer must be a JSON object, got the string "items"')
      assert.same({ "respond" }, srv:fired())
    end)

    it("with a metadata or continue token of the wrong type is an error", function()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = { ["continue"] = 7 }, items = json.array() }
      local _, err = walk(5)
      assert_invalid(err, "the list's metadata.continue is a number (7), not a string")
      srv:clear_requests()
      respond { kind = "ConfigMapList", apiVersion = "v1", metadata = json.array(), items = json.array() }
      _, err = walk(5)
      assert_invalid(err, "the list's metadata is an array, not an object")
      assert.same({ "respond" }, srv:fired())
    end)
  end)

  describe("pagination that does not move forward", function()
    it("a server that repeats its continue token forever: an error on the second page", function()
      srv:faults { { method = "GET", path = "continue=", times = -1, ["continue"] = "repeat" } }
      local got, err = walk(5)
      assert_invalid(err, "page 2 answered the continue token it was asked with")
      assert.matches("the list does not move forward", err.message, 1, true)
      assert.same({ "cm-00", "cm-01", "cm-02", "cm-03", "cm-04" }, got)  -- page 1 once, nothing twice
      assert.equal(2, #list_requests())
      assert.same({ "continue" }, srv:fired())
      assert.is_true(list_requests()[2].fault.applied)
    end)

    it("a token that leads back to objects already read: an error, nothing yielded twice", function()
      srv:faults { { method = "GET", path = "limit=", times = 1, ["continue"] = "rewind" } }
      local got, err = walk(5)
      assert_invalid(err, 'page 2 does not move forward: items[0] "team-a/cm-00" is not after "team-a/cm-04", '
        .. "the last object of the previous page")
      assert.same({ "cm-00", "cm-01", "cm-02", "cm-03", "cm-04" }, got)
      assert.equal(2, #list_requests())
      assert.same({ "continue" }, srv:fired())
      assert.is_true(list_requests()[1].fault.applied)
    end)

    it("a token handed out again after another (A, B, A): an error", function()
      -- the first page's token is deterministic (revision and start key): read it as the pager will
      local first = srv:request("GET", TEAM_A .. "?limit=5").json
      local a = first.metadata["continue"]
      assert.is_string(a)
      srv:clear_requests()
      local function page(token)
        return { kind = "ConfigMapList", apiVersion = "v1", metadata = { ["continue"] = token },
          items = json.array() }
      end
      srv:faults { { method = "GET", path = "continue=", times = 1, respond = { body = page("b-token") } },
                   { method = "GET", path = "continue=", times = 1, respond = { body = page(a) } } }
      local got, err = walk(5)
      assert_invalid(err, "page 3 answered a continue token already followed in this list")
      assert.equal(5, #got)
      assert.equal(3, #list_requests())
      assert.same({ "respond", "respond" }, srv:fired())
    end)

    it("an endless run of empty pages, each with a new token: an error after a bound", function()
      local pager = require "cozy.kube.pager"
      local rules = {}
      for i = 1, pager.MAX_EMPTY_PAGES + 1 do
        rules[i] = { method = "GET", path = "continue=", times = 1, respond = { body = {
          kind = "ConfigMapList", apiVersion = "v1", metadata = { ["continue"] = "empty-" .. i },
          items = json.array() } } }
      end
      srv:faults(rules)
      local got, err = walk(5)
      assert_invalid(err, ("%d empty pages in a row, each with a new continue token"):format(pager.MAX_EMPTY_PAGES + 1))
      assert.equal(5, #got)
      assert.equal(pager.MAX_EMPTY_PAGES + 2, #list_requests())
      assert.equal(pager.MAX_EMPTY_PAGES + 1, #srv:fired())
    end)

    it("a few empty pages with new tokens are followed to the end", function()
      local rules = {}
      for i = 1, 3 do
        rules[i] = { method = "GET", path = "continue=", times = 1, respond = { body = {
          kind = "ConfigMapList", apiVersion = "v1", metadata = { ["continue"] = "empty-" .. i },
          items = json.array() } } }
      end
      srv:faults(rules)
      -- the fake cannot resume from an invented token, so the 4th continued page is a
      -- canned last page with the objects after the first page
      local rest = {}
      for i = 5, 11 do rest[#rest + 1] = { metadata = { name = ("cm-%02d"):format(i), namespace = "team-a" } } end
      srv:faults { { method = "GET", path = "continue=empty-3", respond = { body = {
        kind = "ConfigMapList", apiVersion = "v1", metadata = {}, items = rest } } } }
      local got, err = walk(5)
      assert.is_nil(err)
      assert.equal(12, #got)
      assert.equal("cm-11", got[12])
      assert.same({ "respond", "respond", "respond", "respond" }, srv:fired())
    end)
  end)

  describe("a GET", function()
    local PATH = TEAM_A .. "/cm-01"
    local function answer(body)
      srv:faults { { method = "GET", path = "/team-a/configmaps/cm-01$", respond = { body = body } } }
    end
    local function get()
      local typed = client:resource("v1", "configmaps", { kind = "ConfigMap" })
      local ok, err = pcall(typed.get, typed, "team-a", "cm-01")
      assert.is_false(ok, "the GET accepted the answer")
      assert.is_true(kube.is_error(err), tostring(err))
      assert.equal("InvalidResponse", err.reason)
      assert.equal(PATH, err.path)
      assert.same({ "respond" }, srv:fired())
      return err
    end

    it("answering another kind is an InvalidResponse", function()
      answer { apiVersion = "v1", kind = "Secret", metadata = { name = "cm-01", namespace = "team-a" } }
      assert.matches("the answer is a Secret, not a ConfigMap", get().message, 1, true)
    end)

    it("answering another apiVersion, a list, another name or namespace is an InvalidResponse", function()
      for _, case in ipairs({
        { { apiVersion = "v2", kind = "ConfigMap", metadata = { name = "cm-01", namespace = "team-a" } }, "apiVersion v2" },
        { { apiVersion = "v1", kind = "ConfigMapList", metadata = {}, items = json.array {} }, "a ConfigMapList, not an object" },
        { { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "other", namespace = "team-a" } }, "names other" },
        { { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cm-01", namespace = "team-b" } }, "namespace team-b" },
        { json.array { 1 }, "not a JSON object" },
      }) do
        srv:clear_faults()
        srv:clear_requests()
        answer(case[1])
        assert.matches(case[2], get().message, 1, true)
      end
    end)

    it("the object asked for passes", function()
      local obj = client:resource("v1", "configmaps", { kind = "ConfigMap" }):get("team-a", "cm-01")
      assert.equal("cm-01", obj.metadata.name)
    end)
  end)
end)

