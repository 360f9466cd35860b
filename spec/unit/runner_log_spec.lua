-- cozy.log: text and JSON lines, tags, verbosity, progress rate limit.
local log = require "cozy.log"
local json = require "cozy.json"

local function capture()
  local path = os.tmpname()
  local f = assert(io.open(path, "w+"))
  return f, function()
    f:flush()
    local r = assert(io.open(path))
    local s = r:read("a")
    r:close()
    f:close()
    os.remove(path)
    return s
  end
end

describe("cozy.log", function()
  it("writes text lines with sorted k=v fields, quoting when needed", function()
    local f, read = capture()
    local l = log.new{ stream = f }
    l:info("hello world", { b = 2, a = "x y" })
    local out = read()
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ INFO  hello world a=\"x y\" b=2\n$", out)
  end)

  it("writes one JSON object per line with tags merged", function()
    local f, read = capture()
    local l = log.new{ stream = f, format = "json" }:with{ migration = "59-x" }
    l:warn("careful", { n = 3 })
    l:info("second")
    local lines = {}
    for line in read():gmatch("[^\n]+") do lines[#lines + 1] = json.decode(line) end
    assert.equal(2, #lines)
    assert.equal("warn", lines[1].level)
    assert.equal("careful", lines[1].msg)
    assert.equal(3, lines[1].n)
    assert.equal("59-x", lines[2].migration)
    assert.is_string(lines[1].ts)
  end)

  it("hides debug below -v", function()
    local f, read = capture()
    log.new{ stream = f }:debug("hidden")
    assert.equal("", read())
    f, read = capture()
    log.new{ stream = f, verbosity = 1 }:debug("shown")
    assert.matches("DEBUG shown", read())
  end)

  it("rate limits progress lines", function()
    local f, read = capture()
    local l = log.new{ stream = f, tty = false }
    local p = l:progress("objects", 1000)
    for i = 1, 1000 do p:step(i) end
    p:done()
    local out = read()
    local n = select(2, out:gsub("\n", ""))
    assert.is_true(n <= 2, "too many progress lines: " .. out)
    assert.matches("progress done.*done=1000", out)
  end)

  it("draws a bar in place on a terminal, clears it before a line and draws it again after", function()
    local f, read = capture()
    local l = log.new{ stream = f, tty = true }
    local p = l:progress("objects", 10)
    p:step(5)
    l:info("between")
    local out = read()
    assert.truthy(out:find("\r\27[K[###############...............] objects 5/10", 1, true), out)
    assert.truthy(out:find("/s ETA %d+s\r\27%[K"), out)
    assert.matches("INFO  between\n\r\27%[K%[#+%.+%] objects 5/10 [%d.]+/s ETA %d+s$", out)
  end)

  -- What a person sees: the output replayed on a terminal (\r returns to
  -- the line's start, \27[K clears to its end): after every log line the
  -- bar is the last line, with count, rate and ETA.
  local function screen(out)
    local lines, cur = {}, ""
    local i = 1
    while i <= #out do
      local c = out:sub(i, i)
      if out:sub(i, i + 2) == "\27[K" then cur = ""; i = i + 3
      elseif c == "\r" then cur = ""; i = i + 1
      elseif c == "\n" then lines[#lines + 1] = cur; cur = ""; i = i + 1
      else cur = cur .. c; i = i + 1 end
    end
    lines[#lines + 1] = cur
    return lines
  end

  -- everything written to f so far, leaving f where it was
  local function peek(f)
    f:flush()
    local pos = f:seek("cur")
    f:seek("set", 0)
    local all = f:read("a")
    f:seek("set", pos)
    return all
  end

  it("keeps the bar on the terminal's last line while per-object lines scroll", function()
    local f, read = capture()
    local l = log.new{ stream = f, tty = true }
    local p = l:progress("VMs", 6)
    for i = 1, 6 do
      l:info("VM ns/vm-" .. i .. ": adding hotplugged volumes x to the VM spec")
      p:step(i)
      local shown = screen(peek(f))
      assert.matches("^%[#*%.*%] VMs %d/6", shown[#shown], 1)
      assert.matches("VM ns/vm%-" .. i .. ": adding", shown[#shown - 1])
    end
    p:done()
    local shown = screen(read())
    assert.matches("progress done", shown[#shown - 1])
    assert.equal("", shown[#shown]) -- the bar is gone once done
  end)

  it("feeds a sink (summaries, tests)", function()
    local seen = {}
    local f, read = capture()
    log.new{ stream = f, sink = function(level, msg) seen[#seen + 1] = level .. ":" .. msg end }:error("boom")
    read()
    assert.same({ "error:boom" }, seen)
  end)

  -- stderr is unbuffered: each write() call on it is one write(2), and the
  -- lease thread logs from its own Lua state to the same fd. A line split
  -- over two calls (text, then "\n") can interleave with another thread's.
  it("hands each line, newline included, to the stream in one write call", function()
    local calls = {}
    local stream = {
      write = function(self, ...)
        calls[#calls + 1] = table.pack(...)
        return self
      end,
      flush = function(self) return self end,
    }
    local l = log.new{ stream = stream, tty = true }
    l:info("plain")
    l:with{ migration = "59-x" }:warn("tagged", { a = 1 })
    l:progress("objects", 10):step(5)
    l:info("after a bar")
    log.new{ stream = stream, format = "json" }:error("as json")
    local lines = {}
    for _, c in ipairs(calls) do
      assert.equal(1, c.n, "a write call with " .. c.n .. " arguments")
      if c[1]:sub(-1) == "\n" then lines[#lines + 1] = c[1] end
    end
    assert.equal(4, #lines)
    assert.matches("INFO  plain\n$", lines[1])
    assert.matches("^\r\27%[K%d.*INFO  after a bar\n$", lines[3])
    assert.matches('"msg":"as json"', lines[4])
  end)

  it("stops writing once a write fails (the reader is gone), and goes on", function()
    local calls, seen = 0, {}
    local stream = {
      write = function() calls = calls + 1; return nil, "Broken pipe", 32 end,
      flush = function(self) return self end,
    }
    local l = log.new{ stream = stream, tty = true, sink = function(_, msg) seen[#seen + 1] = msg end }
    l:info("first")
    l:progress("objects", 10):step(5)
    l:warn("second")
    assert.equal(1, calls)
    assert.same({ "first", "second" }, seen)
  end)
end)
