-- cozy.worker (a background thread with its own Lua state) and cozy.proc
-- (child processes). The write guard is proven with the step executor, in
-- spec/e2e/step/boundary_spec.lua.
local proc = require "cozy.proc"
local cli = require("spec.helpers").cli
local worker = require "cozy.worker"

describe("cozy.worker", function()
  it("runs a module function in another thread, reports success, stops on request", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "")
    assert.truthy(cli.poll(5, function() return w:last_ok() end))
    assert.is_nil(w:lost())
    assert.is_true(w:stop())
    assert.is_true(w:stop())  -- twice is fine
  end)

  it("records a success at the time given, never moving the record back", function()
    -- the lease's renewals count from before they were sent, not from the answer
    local sys = require "cozy.sys"
    local at = ("%.17g"):format(sys.monotime() - 2.5)
    local w = worker.start("spec.fixtures.runner.worker_probe", "ok_at", at)
    assert.truthy(cli.poll(5, function() return w:last_ok() end))
    assert.equal(tonumber(at), w:last_ok())
    assert.is_true(w:stop())
  end)

  it("tells the main state when the work is lost", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "lose")
    assert.equal("gone after 3", cli.poll(5, function() return w:lost() end))
    assert.is_true(w:stop())
  end)

  it("reports the worker's error", function()
    local w = worker.start("spec.fixtures.runner.worker_probe", "fail", "")
    assert.matches("probe failed on purpose", cli.poll(5, function() return w:lost() end))
    local ok, err = w:stop()
    assert.is_nil(ok)
    assert.matches("probe failed on purpose", err)
  end)

  it("stops a loop under a watch armed in the worker's state at its deadline", function()
    -- the worker's thread blocks every signal: its watch cannot be one the
    -- signal handlers serve, and keeps its hook from the start
    local w = worker.start("spec.fixtures.runner.worker_probe", "watched_loop", "")
    local lost = cli.poll(10, function() return w:lost() end)
    assert.is_true(w:stop())
    assert.matches("^stopped=true .*deadline exceeded$", lost)
  end)

  it("joins the thread when closed or collected", function()
    -- the process's threads, as the kernel counts them: a worker that was
    -- neither joined nor detached-and-finished would still be listed
    local sys = require "cozy.sys"
    local function threads() return #assert(sys.listdir("/proc/self/task")) end
    local before = threads()
    do
      local w <close> = worker.start("spec.fixtures.runner.worker_probe", "loop", "")
      assert.truthy(cli.poll(5, function() return w:last_ok() end))
      assert.equal(before + 1, threads())
    end
    assert.equal(before, threads())
    local w = worker.start("spec.fixtures.runner.worker_probe", "loop", "")
    assert.truthy(cli.poll(5, function() return w:last_ok() end))
    assert.equal(before + 1, threads())
    w = nil -- the only reference: the collector now owns it
    collectgarbage()
    collectgarbage()
    assert.equal(before, threads())
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
    end, dir .. "/missing: No such file or directory")
  end)

  it("raises the callback's error after the child is reaped", function()
    assert.has_error(function()
      proc.spawn({ "/bin/echo", "x" }, nil, function() error("callback broke") end)
    end, "callback broke")
  end)
end)
