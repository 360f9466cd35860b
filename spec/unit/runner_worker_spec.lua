-- cozy.worker (a background thread with its own Lua state), cozy.proc
-- (child processes), and the guard ctx.kube puts before every write.
local context = require "cozy.runner.context"
local proc = require "cozy.proc"
local support = require "spec.e2e.runner_support"
local worker = require "cozy.worker"

describe("cozy.worker", function()
  it("runs a module function in another thread, reports success, stops on request", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "")
    assert.truthy(support.poll(5, function() return w:last_ok() end))
    assert.is_nil(w:lost())
    assert.is_true(w:stop())
    assert.is_true(w:stop())  -- twice is fine
  end)

  it("tells the main state when the work is lost", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "lose")
    assert.equal("gone after 3", support.poll(5, function() return w:lost() end))
    assert.is_true(w:stop())
  end)

  it("reports the worker's error", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "fail", "")
    assert.matches("probe failed on purpose", support.poll(5, function() return w:lost() end))
    local ok, err = w:stop()
    assert.is_nil(ok)
    assert.matches("probe failed on purpose", err)
  end)

  it("joins the thread when collected", function()
    do local _ <close> = worker.start("spec.fixtures.runner.worker_probe", "loop", "") end
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "")
    w = nil
    collectgarbage()
    collectgarbage()
    assert.is_nil(w)
  end)
end)

describe("cozy.proc.spawn", function()
  it("streams stdout and stderr line by line and returns the exit status", function()
    local lines = {}
    local how, code = proc.spawn({ "/bin/sh", "-c", "echo one; echo two >&2; printf three; exit 4" },
      { "PATH=/usr/bin:/bin" }, function(stream, line) lines[#lines + 1] = stream .. ":" .. line end)
    assert.same({ "exit", 4 }, { how, code })
    table.sort(lines)
    assert.same({ "stderr:two", "stdout:one", "stdout:three" }, lines)
  end)

  it("passes exactly the given environment", function()
    local seen = {}
    proc.spawn({ "/usr/bin/env" }, { "A=1", "B=two words" }, function(_, line) seen[#seen + 1] = line end)
    assert.same({ "A=1", "B=two words" }, seen)
  end)

  it("reports a signal and a failed exec", function()
    assert.same({ "signal", 9 }, { proc.spawn({ "/bin/sh", "-c", "kill -9 $$" }, nil, function() end) })
    local out = {}
    local how, code = proc.spawn({ "/nonexistent/x" }, nil, function(_, l) out[#out + 1] = l end)
    assert.same({ "exit", 127 }, { how, code })
    assert.matches("exec failed", out[1])
  end)

  it("runs the child in opts.cwd, with a relative argv[1] made absolute first", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir .. "/sub && printf '#!/bin/sh\\necho \"$0 $(pwd)\"\\n' > "
      .. dir .. "/sub/script && chmod +x " .. dir .. "/sub/script"))
    finally(function() os.execute("rm -rf " .. dir) end)
    local real = require("cozy.sys").realpath(dir .. "/sub")
    local out = {}
    local how, code = proc.spawn({ dir .. "/sub/script" }, nil, function(_, l) out[#out + 1] = l end,
      { cwd = dir .. "/sub" })
    assert.same({ "exit", 0 }, { how, code })
    assert.same({ real .. "/script " .. real }, out)
    assert.has_error(function()
      proc.spawn({ "/bin/true" }, nil, function() end, { cwd = dir .. "/missing" })
    end)
  end)

  it("raises the callback's error after the child is reaped", function()
    assert.has_error(function()
      proc.spawn({ "/bin/echo", "x" }, nil, function() error("callback broke") end)
    end)
  end)
end)

describe("ctx.kube guard", function()
  -- a stand-in client: records calls
  local function fake_client(calls)
    local res = {}
    function res.get(self, ns, name) calls[#calls + 1] = "get " .. name; return { self = self } end
    function res.merge_patch(_, _, name) calls[#calls + 1] = "patch " .. name end
    function res.update(_, obj, mutate)
      for _ = 1, 2 do calls[#calls + 1] = "attempt"; mutate(obj) end
      return obj, true
    end
    return { namespace = "ns", stats = { writes = 0 },
      resource = function(self, api, plural) calls[#calls + 1] = "resource " .. plural; return res end }
  end

  it("checks before every write and every update attempt, never before reads", function()
    local calls, guards = {}, 0
    local ctx = context.new{ client = fake_client(calls), log = require("cozy.log").new{ stream = io.stderr },
      namespace = "ns", from = 1, to = 2, guard = function() guards = guards + 1; calls[#calls + 1] = "guard" end }
    local cms = ctx.kube:resource("v1", "configmaps")
    cms:get("ns", "a")
    cms:merge_patch("ns", "a", {})
    cms:update({}, function() return {} end)
    assert.same({ "resource configmaps", "get a", "guard", "patch a", "guard", "attempt", "guard", "attempt",
      "guard" }, calls)
    assert.equal("ns", ctx.kube.namespace)
  end)

  it("stops a write when the guard raises", function()
    local calls = {}
    local ctx = context.new{ client = fake_client(calls), log = require("cozy.log").new{ stream = io.stderr },
      guard = function() error("lock lost") end }
    assert.has_error(function() ctx.kube:resource("v1", "configmaps"):merge_patch("ns", "a", {}) end, "lock lost")
    assert.same({ "resource configmaps" }, calls)
  end)

  it("validates finding severities", function()
    local ctx = context.new{ client = {}, log = require("cozy.log").new{ stream = io.open("/dev/null", "w") } }
    ctx.finding("warn", "w")
    assert.has_error(function() ctx.finding("fatal", "x") end)
    assert.same({ { severity = "warn", message = "w" } }, ctx.findings)
  end)
end)
