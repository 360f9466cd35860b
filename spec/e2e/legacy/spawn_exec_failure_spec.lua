-- proc.spawn (core/proc.c), which runs legacy scripts, when exec fails: the
-- reason comes back from the child as its stderr line, with exit 127.
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
