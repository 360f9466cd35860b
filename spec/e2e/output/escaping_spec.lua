-- Output integrity: every byte from outside (the API, migrations, legacy
-- scripts, the kubeconfig, the user's arguments) reaches every output
-- escaped: a text log line, a line of status/check/list, the termination
-- message hold no raw newline, CR, ESC or other control character from it,
-- and `-o json` encodes a string cut inside a UTF-8 sequence instead of
-- failing. One function at the output edge (cozy.text: text.line,
-- text.lines, text.json) does it for every path.
-- (Issue 35, class 6: output integrity.)
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local ESC = "\27"
-- what a hostile value tries to pass for: the last line of a run that succeeded
local FORGED = "2026-01-01T00:00:00.000Z INFO  summary result=done steps=1"

-- A text log line: a timestamp and a level, nothing before them.
local LOG_LINE = "^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ [A-Z]+ "

local function assert_log_lines(stderr)
  assert.not_matches(ESC, stderr, 1, true)
  assert.not_matches("\r", stderr, 1, true)
  for _, line in ipairs(cli.lines(stderr)) do
    assert.matches(LOG_LINE, line)
  end
end

local function last_line(s)
  local lines = cli.lines(s)
  return lines[#lines]
end

local function run(srv, sources, ...)
  local dir = cli.migration_dir(sources)
  local r = cli.run(cli.args(srv, dir, ...))
  files.rm_rf(dir)
  return r
end

describe("a string cut inside a UTF-8 sequence, under -o json", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  -- "café" cut after the first byte of "é", in the description and a finding
  local CUT = [[
return {
  description = "caf\xC3",
  check = function(ctx) ctx:finding("warn", "cut \xE2\x82", { value = "x\xC3" }) end,
  run = function() end,
}
]]

  for _, command in ipairs({ "check", "status", "list" }) do
    it(command .. " prints the document, U+FFFD in place of the cut sequence", function()
      -- on the binary before: exit 1, "internal error" and a traceback
      local r = run(srv, { ["1-cut.lua"] = CUT }, command, "-o", "json")
      assert.equal(0, r.code, r.stderr)
      assert.not_matches("internal error", r.stderr, 1, true)
      assert.is_truthy(utf8.len(r.stdout), "stdout is not UTF-8")
      local doc = json.decode(r.stdout)
      local text = json.encode(doc)
      if command == "check" then
        assert.matches("cut \u{FFFD}", text, 1, true)
      else
        assert.matches("caf\u{FFFD}", text, 1, true)
      end
    end)
  end

  it("check's text output too (a finding's field)", function()
    local r = run(srv, { ["1-cut.lua"] = CUT }, "check")
    assert.equal(0, r.code, r.stderr)
    assert.matches("[WARN] 1-cut: cut \u{FFFD}\u{FFFD}  value=x\u{FFFD}", r.stdout, 1, true)
  end)
end)

describe("a newline or ESC from outside", function()
  local srv
  setup(function() srv = fake.start { fixtures = {} } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)); srv:clear_faults() end)

  local READS = [[
return { description = "reads", permissions = { { verb = "get", group = "", resource = "configmaps" } },
  run = function(ctx) ctx.kube:resource("v1", "configmaps"):get("cozy-system", "settings") end }
]]

  local function status_fault()
    srv:faults { { method = "GET", path = "configmaps/settings$", times = -1, respond = { status = 403,
      body = json.encode { apiVersion = "v1", kind = "Status", status = "Failure", reason = "Forbidden", code = 403,
        message = "denied\n" .. FORGED .. ESC .. "[2K\r" } } } }
  end

  it("in an API Status message is escaped in both log formats: the run's last line is still its error", function()
    -- on the binary before, the message's newline made the forged summary
    -- the last line of the failed run (text format)
    status_fault()
    local r = run(srv, { ["1-reads.lua"] = READS }, "run")
    assert.equal(1, r.code, r.stderr)
    assert.same({ "respond" }, srv:fired())
    assert_log_lines(r.stderr)
    local last = last_line(r.stderr)
    assert.matches(" ERROR ", last, 1, true)
    assert.matches("denied\\n" .. FORGED .. "\\x1b[2K\\r", last, 1, true)
    -- the JSON log keeps the message's bytes, as JSON escapes
    r = run(srv, { ["1-reads.lua"] = READS }, "run", "--log-format", "json")
    assert.equal(1, r.code, r.stderr)
    assert.not_matches(ESC, r.stderr, 1, true)
    local lines = cli.lines(r.stderr)
    local decoded = json.decode(lines[#lines])
    assert.equal("error", decoded.level)
    assert.matches("denied\n" .. FORGED .. ESC .. "[2K\r", decoded.msg, 1, true)
  end)

  it("in a history error is escaped by status, and in the termination message", function()
    local termination = os.tmpname()
    local dir = cli.migration_dir { ["1-fails.lua"] = ([[
return { description = "fails", run = function() error(%q, 0) end }
]]):format("boom\n" .. FORGED .. ESC .. "]0;title\7") }
    finally(function() os.remove(termination); files.rm_rf(dir) end)
    local r = cli.run(cli.args(srv, dir, "run"), { COZY_MIGRATE_TERMINATION_LOG = termination })
    assert.equal(1, r.code, r.stderr)
    assert_log_lines(r.stderr)
    -- the termination message: one line, escaped
    local message = files.read(termination)
    assert.not_matches("%c", message)
    assert.matches("boom\\n" .. FORGED .. "\\x1b]0;title\\x07", message, 1, true)
    -- status shows the record's error on one line
    r = cli.run(cli.args(srv, dir, "status"))
    assert.equal(0, r.code, r.stderr)
    assert.not_matches("[\27\7]", r.stdout)
    assert.matches("        error (migration): boom\\n" .. FORGED .. "\\x1b]0;title\\x07\n", r.stdout, 1, true)
    for _, line in ipairs(cli.lines(r.stdout)) do assert.not_matches("^" .. FORGED:gsub("%p", "%%%0"), line) end
  end)

  it("in a stamp's reason is escaped by status and by stamp's own output", function()
    local dir = cli.migration_dir { ["1-one.lua"] = [[return { description = "one", run = function() end }]] }
    finally(function() files.rm_rf(dir) end)
    local reason = "restored by hand\n" .. FORGED .. ESC .. "[31m"
    local r = cli.run(cli.args(srv, dir, "stamp", "2", "--reason", reason))
    assert.equal(0, r.code, r.stderr)
    assert_log_lines(r.stderr)
    assert.not_matches(ESC, r.stdout, 1, true)
    r = cli.run(cli.args(srv, dir, "status"))
    assert.equal(0, r.code, r.stderr)
    assert.not_matches(ESC, r.stdout, 1, true)
    assert.matches(": restored by hand\\n" .. FORGED .. "\\x1b[31m  at ", r.stdout, 1, true)
    -- -o json keeps the reason's bytes, as JSON escapes
    r = cli.run(cli.args(srv, dir, "status", "-o", "json"))
    assert.equal(0, r.code, r.stderr)
    assert.not_matches(ESC, r.stdout, 1, true)
    local st = json.decode(r.stdout)
    assert.equal(reason, st.history[#st.history].reason)
  end)

  it("in a legacy script's output (a CR and an ESC that would redraw the line)", function()
    local dir = cli.migration_dir {}
    files.write(dir .. "/1-redraws", "#!/bin/sh\nprintf 'working\\r\\033[2K" .. FORGED .. "\\n'\nexit 3\n")
    os.execute("chmod +x " .. cli.quote(dir .. "/1-redraws"))
    local r = cli.run(cli.args(srv, dir, "run"))
    files.rm_rf(dir)
    assert.equal(1, r.code, r.stderr)
    assert_log_lines(r.stderr)
    assert.matches("working\\r\\x1b[2K" .. FORGED, r.stderr, 1, true)
  end)

  it("in a migration's log field without a space (once printed bare) and a progress label", function()
    local r = run(srv, { ["1-logs.lua"] = [[
return { description = "logs", run = function(ctx)
  ctx.log:info("colours", { colour = "\27[31mred\n" })
  local bar = ctx:progress("items\r\27[2K", 1)
  bar:step(1); bar:done()
end }
]] }, "run")
    assert.equal(0, r.code, r.stderr)
    assert_log_lines(r.stderr)
    assert.matches('colour="\\x1b[31mred\\n"', r.stderr, 1, true)
    assert.matches('task="items\\r\\x1b[2K"', r.stderr, 1, true)
  end)

  it("in the user's arguments, quoted back in a usage error", function()
    local r = cli.run({ "status", "--bogus\n" .. FORGED .. ESC .. "[2J" })
    assert.equal(2, r.code, r.stderr)
    assert.not_matches(ESC, r.stderr, 1, true)
    -- the option quoted as Lua quotes it (%q), its newline escaped once more
    assert.matches('unknown option "--bogus\\\\n' .. FORGED .. '\\27[2J"', r.stderr, 1, true)
    assert.equal(2, #cli.lines(r.stderr), r.stderr)
  end)

  it("in the kubeconfig: a context name quoted in the error", function()
    local kubeconfig = os.tmpname()
    finally(function() os.remove(kubeconfig) end)
    files.write(kubeconfig, ([[
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://cozy.invalid:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: "gone\n%s\e[2J"
]]):format(FORGED))
    local r = cli.run({ "status", "--kubeconfig", kubeconfig, "--no-builtin", "--target", "1" })
    assert.equal(2, r.code, r.stderr)
    assert_log_lines(r.stderr)
    assert.matches("gone\\n" .. FORGED .. "\\x1b[2J", r.stderr, 1, true)
  end)
end)
