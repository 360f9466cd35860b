-- Defects found by reading core/ (issue 13, item 9), each pinned by the
-- behaviour that showed it: run the binary and look at its exit status and
-- output, or call the C module directly.
local support = require "spec.helpers.cli"

local q = support.quote

-- A copy of scripts/ whose cozy/cli.lua is `source`, for COZY_MIGRATE_SCRIPTS.
local function scripts_with_cli(source)
  local dir = support.tmpdir()
  assert(os.execute("cp -r scripts " .. q(dir .. "/scripts")))
  local f = assert(io.open(dir .. "/scripts/cozy/cli.lua", "wb"))
  f:write(source)
  f:close()
  return dir
end

describe("core/main.c: the exit status of cozy.cli.main", function()
  local dirs = {}
  teardown(function()
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. q(d)) end
  end)

  local function run_with(result)
    local dir = scripts_with_cli("return { main = function() return " .. result .. " end }\n")
    dirs[#dirs + 1] = dir
    return support.run({ "--version" }, { COZY_MIGRATE_SCRIPTS = dir .. "/scripts" })
  end

  it("is an error (exit 1, one clear line), not a panic, when it is a string", function()
    local res = run_with('"oops"')
    assert.equal(1, res.code) -- was 134: luaL_optinteger raised outside any protected call
    assert.matches("cozy.cli.main returned string oops, not an exit status %(0%-255%)", res.stderr)
    assert.not_matches("PANIC", res.stderr)
  end)

  it("is an error when it is not an integer or out of range", function()
    for _, v in ipairs { "2.5", "256", "-1", "{}" } do
      local res = run_with(v)
      assert.equal(1, res.code, v)
      assert.matches("not an exit status", res.stderr, 1, v)
    end
  end)

  it("is passed through when it is an integer 0-255, and nil means 0", function()
    assert.equal(3, run_with("3").code)
    assert.equal(0, run_with("nil").code)
    assert.equal(2, run_with("2.0").code) -- an integral float is an integer
  end)
end)

describe("core/proc.c: spawn when exec fails", function()
  local proc = require "cozy.proc"

  -- The child used to call strerror between fork and exec (not
  -- async-signal-safe); it now sends errno back and the parent formats it.
  it("reports the reason as the child's stderr line and exit 127", function()
    local lines = {}
    local how, code = proc.spawn({ "/nonexistent/cozy-legacy-script", "arg" }, nil, function(stream, line)
      lines[#lines + 1] = stream .. ": " .. line
    end)
    assert.equal("exit", how)
    assert.equal(127, code)
    assert.same({ "stderr: exec failed: /nonexistent/cozy-legacy-script: No such file or directory" }, lines)
  end)

  it("reports a file that is not executable by its errno too", function()
    local path = os.tmpname()
    local lines = {}
    local how, code = proc.spawn({ path }, { "PATH=/usr/bin" }, function(_, line) lines[#lines + 1] = line end)
    os.remove(path)
    assert.equal("exit", how)
    assert.equal(127, code)
    assert.same({ "exec failed: " .. path .. ": Permission denied" }, lines)
  end)

  it("still runs a script and hands over its lines", function()
    local lines = {}
    local how, code = proc.spawn({ "/bin/sh", "-c", "echo out; echo err >&2; exit 3" }, nil,
      function(stream, line) lines[#lines + 1] = stream .. ": " .. line end)
    assert.equal("exit", how)
    assert.equal(3, code)
    table.sort(lines)
    assert.same({ "stderr: err", "stdout: out" }, lines)
  end)

  it("keeps the callback's first error and raises it after the child is reaped", function()
    local calls = 0
    local ok, err = pcall(proc.spawn, { "/bin/sh", "-c", "echo a; echo b" }, nil, function()
      calls = calls + 1
      error("callback failed " .. calls, 0)
    end)
    assert.is_false(ok)
    assert.equal("callback failed 1", err)
    assert.equal(2, calls)
  end)
end)

describe("core/transport.c: option strings stay alive for the whole request", function()
  local tsupport = require "spec.helpers.transport"
  local transport = require "cozy.transport"
  local json = require "cozy.json"
  local srv
  setup(function() srv = tsupport.start() end)
  teardown(function() if srv then srv:stop() end end)

  -- The body and content type used to be popped right after they were read,
  -- "kept alive by the options table"; an on_retry that changes the table
  -- then let the collector free the body the retry sends (ASan: heap use
  -- after free; without it, the retry sends whatever reused the memory).
  it("sends the same body on a retry after on_retry dropped it from the options", function()
    local t = assert(transport.new { kubeconfig = srv.kubeconfig,
      retry = { max_attempts = 3, base_delay = 0.01, max_delay = 0.05 } })
    local filler = {}
    for i = 1, 2000 do filler[i] = ("%04d"):format(i) end
    local body = json.encode { apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "kept-alive", namespace = "team-a" }, data = { big = table.concat(filler, "-") } }
    srv:clear_requests()
    srv:faults { { method = "POST", path = "namespaces/team-a/configmaps$", times = 1, status = { code = 500 } } }
    local opts = { body = body, content_type = "application/json", retry_safe = true }
    body = nil -- luacheck: ignore 311 (only opts holds the body from here on)
    opts.on_retry = function()
      opts.body, opts.content_type = nil, nil
      collectgarbage("collect")
      -- churn the heap so that a freed body would be overwritten
      for i = 1, 200 do local _ = ("x"):rep(8000 + i) end
      collectgarbage("collect")
    end
    local status, _, attempts = t:request("POST", "/api/v1/namespaces/team-a/configmaps", opts)
    t:close()
    assert.equal(201, status)
    assert.equal(2, #attempts)
    local posts = tsupport.api_requests(srv, "POST", "namespaces/team%-a/configmaps$")
    assert.equal(2, #posts)
    assert.truthy(posts[1].fault, "the fault rule did not fire")
    assert.equal(posts[1].body, posts[2].body)
    assert.equal("application/json", posts[2].content_type)
    assert.equal(table.concat(filler, "-"), srv:object("ConfigMap", "team-a", "kept-alive").data.big)
  end)
end)

describe("core/transport_http.c: curl options", function()
  local tsupport = require "spec.helpers.transport"
  local transport = require "cozy.transport"
  local srv
  setup(function() srv = tsupport.start() end)
  teardown(function() if srv then srv:stop() end end)

  -- (long)(1e300 * 1000) is undefined behaviour; on x86 it is LONG_MIN, which
  -- curl refuses with CURLE_BAD_FUNCTION_ARGUMENT, a result nobody checked.
  -- Seconds are now clamped, and a refused option would fail the request
  -- with a message naming it.
  it("takes a timeout too large for milliseconds in a long as no limit", function()
    local t = assert(transport.new { kubeconfig = srv.kubeconfig, request_timeout = 1e300, connect_timeout = 1e300 })
    local status, body, attempts = t:request("GET", "/api/v1/namespaces/cozy-system/configmaps/settings", {})
    t:close()
    assert.equal(200, status, attempts[1] and attempts[1].message)
    assert.matches('"name":"settings"', body)
  end)
end)
