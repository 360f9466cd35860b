-- Lists: pages with continue tokens, and what a consumer sees when a continue
-- token expires (410) in mid-list (docs/transport.md). On the fake and on the
-- real server (COZY_SPEC_SERVER=real); an expired token needs the fake's
-- compaction or fault rules (#fakeonly).
local transport_harness = require("spec.helpers").transport
local harness = require "spec.helpers"
local json = require "cozy.json"
local compare = require("cozy.sys").compare

-- A continue token as the server made it: base64url (padded or not) of a
-- small JSON object, { v =, rv =, start = } on kube-apiserver and the fake.
local function decode_token(token)
  token = token:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
  local value = {}
  for i = 1, #alphabet do value[alphabet:sub(i, i)] = i - 1 end
  value["-"], value["_"], value["+"], value["/"] = 62, 63, 62, 63
  local bits, nbits, out = 0, 0, {}
  for c in token:gsub("=+$", ""):gmatch(".") do
    local v = assert(value[c], "not base64: " .. token)
    bits, nbits = (bits << 6) | v, nbits + 6
    if nbits >= 8 then
      nbits = nbits - 8
      out[#out + 1] = string.char((bits >> nbits) & 0xff)
    end
  end
  return json.decode(table.concat(out))
end

describe("cozy.kube list", function()
  local srv, client, cms, captured
  transport_harness.fresh_server(function(s)
    srv = s
    captured = harness.capture_log(1)
    client = transport_harness.connect(srv, { log = captured.log })
    cms = client:resource("v1", "configmaps")
  end)
  after_each(function() client:close() end)

  local function names(iter)
    local out = {}
    for o in iter do out[#out + 1] = o.metadata.namespace .. "/" .. o.metadata.name end
    return out
  end

  local function list_requests()
    return transport_harness.api_requests(srv, "GET", "^/api/v1/.*configmaps$")
  end

  it("walks every page with continue tokens", function()
    -- what the server holds, in one unpaged read: the fixture's 25, and on a
    -- real server its own two in kube-system
    local want = {}
    for _, o in ipairs(srv:request("GET", "/api/v1/configmaps").json.items) do
      want[#want + 1] = o.metadata.namespace .. "/" .. o.metadata.name
    end
    local fixture = 0
    for _, k in ipairs(want) do
      if k:find("^cozy%-system/") or k:find("^team%-[ab]/") then fixture = fixture + 1 end
    end
    assert.equal(25, fixture)
    if not srv.real then assert.equal(25, #want) end
    srv:clear_requests()
    local p = cms:list { limit = 5 }
    local got = names(p)
    assert.same(want, got) -- each once, in the server's order
    assert.equal("cozy-system/settings", got[1])
    assert.equal("team-b/cm-11", got[#got])
    local pages = (#got + 4) // 5
    assert.equal(pages, p.pages)
    assert.equal(#got, p.count)
    local reqs = list_requests()
    assert.equal(pages, #reqs)
    assert.matches("limit=5", reqs[1].query)
    assert.is_nil(reqs[1].query:find("continue=", 1, true))
    -- every later page asked with the token the server made: one snapshot
    -- (its resourceVersion), starting further on each time
    local rv, start
    for i, e in ipairs(reqs) do
      assert.equal(200, e.status)
      assert.matches("limit=5", e.query)
      if i > 1 then
        local token = e.query:match("continue=([^&]+)")
        assert.is_string(token, e.query)
        local t = decode_token(token)
        assert.equal("meta.k8s.io/v1", t.v)
        assert.is_number(t.rv)
        assert.equal(rv or t.rv, t.rv)
        assert.is_string(t.start)
        if start then assert.is_true(compare(start, t.start) < 0, start .. " then " .. t.start) end
        rv, start = t.rv, t.start
      end
    end
  end)

  it("defaults to pages of 500 and fills apiVersion and kind on items", function()
    local first
    for o in cms:list { namespace = "team-a" } do first = first or o end
    assert.equal("v1", first.apiVersion)
    assert.equal("ConfigMap", first.kind)
    local reqs = list_requests()
    assert.equal(1, #reqs)
    assert.equal("/api/v1/namespaces/team-a/configmaps", reqs[1].path)
    assert.matches("limit=500", reqs[1].query)
  end)

  it("passes label and field selectors", function()
    local got = names(cms:list { label_selector = "fleet=yes,parity=even", limit = 4 })
    assert.equal(12, #got)
    assert.matches("labelSelector=fleet%%3Dyes%%2Cparity%%3Deven", list_requests()[1].query)
    local one = names(cms:list { namespace = "team-b", field_selector = "metadata.name=cm-03" })
    assert.same({ "team-b/cm-03" }, one)
  end)

  it("holds one page at a time: it can stop early and costs only the pages read", function()
    local n = 0
    for _ in cms:list { limit = 5 } do
      n = n + 1
      if n == 7 then break end
    end
    assert.equal(2, #list_requests())
  end)

  it("restarts on 410 Expired without yielding an object twice, and says so #fakeonly", function()
    local p = cms:list { limit = 5 }
    local restarts_seen = 0
    p.on_restart = function(pg) restarts_seen = pg.restarts end
    local got = {}
    local n = 0
    for o in p do
      n = n + 1
      got[#got + 1] = o.metadata.namespace .. "/" .. o.metadata.name
      if n == 7 then
        -- compaction: every continue token issued so far expires; meanwhile a new
        -- object appears after the resume point and one before it
        srv:compact()
        cms:create { metadata = { name = "cm-99", namespace = "team-b" } }
        cms:create { metadata = { name = "aaa", namespace = "team-a" } }
      end
    end
    assert.equal(1, p.restarts)
    assert.equal(1, restarts_seen)
    assert.equal(1, client.stats.list_restarts)
    local seen = {}
    for _, k in ipairs(got) do
      assert.is_nil(seen[k], "yielded twice: " .. k)
      seen[k] = true
    end
    assert.is_true(seen["team-b/cm-99"]) -- after the resume point: seen
    assert.is_nil(seen["team-a/aaa"])    -- before it: not in this pass
    assert.equal(26, #got)
    assert.equal(1, captured.count("warn", "410"))
    local statuses = {}
    for i, e in ipairs(list_requests()) do statuses[i] = e.status end
    assert.equal(410, statuses[3])
    assert.is_nil(list_requests()[4].query:find("continue=", 1, true)) -- the restart
  end)

  it("restarts on a 410 fault on a continue request #fakeonly", function()
    srv:faults { { method = "GET", path = "configmaps\\?.*continue=", times = 1,
      status = { code = 410, reason = "Expired" } } }
    local p = cms:list { limit = 10 }
    local got = names(p)
    assert.equal(25, #got)
    assert.equal(1, p.restarts)
    assert.is_true(p.skipped >= 10)
    assert.same({ "status" }, srv:fired())
    local restart = list_requests()[3]
    assert.is_nil(restart.query:find("continue=", 1, true))
  end)

  it("compares keys in byte order, not in the locale's", function()
    local le = require("cozy.kube.pager")._le_bytes
    assert.is_true(le("team-a/cm-01", "team-a/cm-01"))
    assert.is_true(le("team-a/cm-01", "team-a/cm-02"))
    assert.is_false(le("team-b/a", "team-a/z"))
    assert.is_true(le("a-b", "a_b"))   -- '-' (0x2d) before '_' (0x5f)
    assert.is_true(le("Z", "a"))       -- upper case first
    assert.is_true(le("ab", "abc"))
    assert.is_false(le("abc", "ab"))
    assert.is_true(le("z", "\xc3\xa9"))  -- UTF-8 bytes (>= 0x80) after ASCII
    assert.is_true(le("a\0b", "a\0c"))   -- past an embedded NUL
    assert.is_false(le("a\0c", "a\0b"))
  end)

  it("gives up after repeated expiry #fakeonly", function()
    srv:faults { { method = "GET", path = "continue=", times = 100, status = { code = 410, reason = "Expired" } } }
    local ok, err = pcall(function() for _ in cms:list { limit = 10 } do end end)
    assert.is_false(ok)
    assert.equal(410, err.code)
    assert.matches("restarted 5 times", err.message)
    assert.same({ "status", "status", "status", "status", "status", "status" }, srv:fired())
  end)

  it("retries a failed page like any read #fakeonly", function()
    srv:faults { { method = "GET", path = "continue=", times = 1, status = { code = 503 } } }
    assert.equal(25, #names(cms:list { limit = 10 }))
    assert.equal(1, client.stats.retries)
    assert.same({ "status" }, srv:fired())
  end)
end)
