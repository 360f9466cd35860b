-- Bytes that are not UTF-8, from outside, logged safely in either log format
-- (text.utf8: U+FFFD for a bad byte; an error body cut at a UTF-8 boundary).
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

-- Each stderr line of a --log-format json run, decoded; a line that does
-- not decode fails the spec.
local function json_lines(stderr)
  local out = {}
  for _, line in ipairs(cli.lines(stderr)) do
    local ok, v = pcall(json.decode, line)
    assert(ok and type(v) == "table", "not a JSON log line: " .. line)
    out[#out + 1] = v
  end
  return out
end

describe("bytes that are not UTF-8", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)); srv:clear_faults() end)

  it("a legacy script printing Latin-1 is logged as JSON lines, and its step is recorded", function()
    local dir = cli.migration_dir {}
    files.write(dir .. "/1-latin1", [[#!/bin/sh
printf 'caf\351 cr\350me\n'
printf 'na\357ve \377\376 on stderr\n' >&2
kubectl() { :; }
]] .. ([[
curl -sk -X PATCH -H 'Content-Type: application/merge-patch+json' "$SERVER/api/v1/namespaces/cozy-system/configmaps/cozystack-version" \
  --data '{"data":{"version":"2"}}' >/dev/null
]]))
    os.execute("chmod +x " .. cli.quote(dir .. "/1-latin1"))
    local r = cli.run(cli.args(srv, dir, "run", "--log-format", "json"), { SERVER = srv.url })
    files.rm_rf(dir)
    assert.equal(0, r.code, r.stderr)
    local lines = json_lines(r.stderr)
    local msgs = {}
    for _, l in ipairs(lines) do msgs[#msgs + 1] = l.msg end
    local all = table.concat(msgs, "\n")
    assert.matches("caf\u{FFFD} cr\u{FFFD}me", all, 1, true)
    assert.matches("na\u{FFFD}ve \u{FFFD}\u{FFFD} on stderr", all, 1, true)
    local _, cm = cli.version(srv)
    assert.equal(2, cli.version(srv))
    assert.equal("1-latin1", cli.history(cm)[1].name)
  end)

  for _, format in ipairs({ "text", "json" }) do
    it("an error body cut inside a UTF-8 sequence still logs the error (" .. format .. ")", function()
      -- 199 bytes, then a two-byte "é": the 200-byte cut falls inside it
      srv:faults { { method = "GET", path = "configmaps/settings$", times = -1,
        respond = { status = 403, body = ("x"):rep(199) .. "\u{E9} denied", content_type = "text/plain" } } }
      local dir = cli.migration_dir { ["1-reads.lua"] = [[
return { description = "reads", permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx) ctx.kube:resource("v1", "configmaps"):get("cozy-system", "settings") end }
]] }
      local r = cli.run(cli.args(srv, dir, "run", "--log-format", format))
      files.rm_rf(dir)
      assert.equal(1, r.code, r.stderr)
      assert.same({ "respond" }, srv:fired())
      assert.matches("Forbidden (403): " .. ("x"):rep(199), r.stderr, 1, true)
      if format == "json" then json_lines(r.stderr) end
      assert.is_truthy(utf8.len(r.stderr), "stderr is not valid UTF-8")
    end)
  end
end)
