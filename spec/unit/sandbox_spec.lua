-- The migration sandbox: what a migration cannot reach, and what it can.
local sandbox = require "cozy.sandbox"

-- Runs `code` as a migration would be loaded and returns what it returns.
local function eval(code)
  local v, err = sandbox.load(code, "test.lua")
  if err then error(err, 0) end
  return v
end

describe("the migration sandbox", function()
  describe("keeps out of reach", function()
    for _, expr in ipairs({
      "os.execute", "os.exit", "os.getenv", "os.remove", "os.rename", "os.tmpname",
      "io", "debug", "package", "dofile", "loadfile", "collectgarbage", "print",
      "string.dump",
    }) do
      it(expr, function()
        assert.is_nil(eval("return " .. expr))
      end)
    end

    it("nothing of xpcall's own argument check: a handler that is not a function is its error", function()
      local r = eval([[return { pcall(xpcall, function() end, 42) }]])
      assert.is_false(r[1])
      assert.matches("bad argument #2 to 'xpcall' (function expected", r[2], 1, true)
      assert.same({ false, "boom!" }, eval([[return { xpcall(function() error("boom", 0) end, function(e) return e .. "!" end) }]]))
    end)

    it("io.popen, through any path", function()
      assert.is_nil(eval("return io"))
      assert.is_nil(eval("return _G.io"))
      assert.is_nil(eval("return _ENV.io"))
    end)

    it("binary chunks", function()
      local dumped = string.dump(function() return 1 end)
      local env = sandbox.env()
      local chunk, err = env.load(dumped)
      assert.is_nil(chunk)
      assert.matches("attempt to load a binary chunk", err)
      chunk, err = env.load("return 1", "x", "b")
      assert.is_nil(chunk)
      assert.matches("only text chunks", err)
      -- and the migration file itself must be text
      local v, lerr = sandbox.load(dumped, "bin.lua")
      assert.is_nil(v)
      assert.matches("binary chunk", lerr)
    end)

    it("the engine's own modules", function()
      for _, m in ipairs({ "cozy.sys", "cozy.kube", "cozy.transport", "cozy.sandbox", "io", "os", "debug" }) do
        assert.has_error(function() eval(("return require(%q)"):format(m)) end,
          ("cozy sandbox: module '%s' is not available to migrations"):format(m))
      end
    end)

    it("the shared string metatable", function()
      assert.is_nil(eval([[return getmetatable("")]]))
    end)
  end)

  describe("keeps the engine safe from a migration", function()
    it("library tables are copies", function()
      eval([[string.format = nil; table.insert = nil; math.floor = nil; return true]])
      assert.is_function(string.format)
      assert.is_function(table.insert)
      assert.is_function(math.floor)
    end)

    it("cozy.base64, to read and write a Secret's data", function()
      assert.equal("cGFzc3dvcmQ=", eval([[return require("cozy.base64").encode("password")]]))
      assert.equal("password", eval([[return require("cozy.base64").decode("cGFzc3dvcmQ=")]]))
    end)

    it("module tables handed out are copies", function()
      eval([[local j = require "cozy.json"; j.encode = nil; return true]])
      assert.is_function(require("cozy.json").encode)
    end)

    it("globals stay in the migration's environment", function()
      eval([[leaked = 42; return true]])
      assert.is_nil(rawget(_G, "leaked"))
    end)

    it("a proxy leads nowhere past itself: pairs, next, rawget, rawlen, rawset", function()
      local state = { a = 1, 10, 20 }
      local proxy = sandbox.view(state, "the state")
      local env = sandbox.env()
      local probe = assert(env.load([[
        local proxy = ...
        local iter, s = pairs(proxy)
        local seen = {}
        for k, v in pairs(proxy) do seen[#seen + 1] = tostring(k) .. "=" .. tostring(v) end
        table.sort(seen)
        local ok, err = pcall(rawset, proxy, "a", 2)
        return rawequal(s, proxy), table.concat(seen, ","), next(proxy) ~= nil, rawget(proxy, "a"), rawlen(proxy), #proxy,
          ok, err, (pcall(function() proxy.a = 3 end))
      ]]))
      local ok, same, seen, nonempty, a, rawn, n, set_ok, set_err, assign_ok = pcall(probe, proxy)
      assert.is_true(ok)
      assert.is_true(same)
      assert.equal("1=10,2=20,a=1", seen)
      assert.is_true(nonempty)
      assert.equal(1, a)
      assert.equal(2, rawn)
      assert.equal(2, n)
      assert.is_false(set_ok)
      assert.matches("rawset of an engine object is not available to migrations", set_err, 1, true)
      assert.is_false(assign_ok)
      assert.same({ a = 1, 10, 20 }, state)
      assert.has_error(function() env.getmetatable(proxy) end,
        "cozy sandbox: the metatable of an engine object is not available to migrations")
    end)

    it("each load gets a fresh environment", function()
      eval([[shared = 1; return true]])
      assert.is_nil(eval([[return shared]]))
    end)
  end)

  describe("offers what a migration needs", function()
    it("string methods on values, table, math, utf8, coroutine", function()
      local v = eval([[
        local t = {}
        table.insert(t, ("a,b"):upper())
        t[#t + 1] = string.format("%d", math.max(1, 2))
        t[#t + 1] = utf8.char(233)
        local co = coroutine.wrap(function() coroutine.yield("y") end)
        t[#t + 1] = co()
        return table.concat(t, "|")
      ]])
      assert.equal("A,B|2|é|y", v)
    end)

    it("time without side effects", function()
      assert.is_number(eval("return os.time()"))
      assert.is_string(eval("return os.date('!%Y')"))
    end)

    it("cozy.json", function()
      assert.equal('{"a":1}', eval([[return require("cozy.json").encode({ a = 1 })]]))
    end)

    it("pcall, error with tables, setmetatable", function()
      local v = eval([[
        local ok, e = pcall(error, { code = 7 })
        local o = setmetatable({}, { __index = function() return e.code end })
        return o.anything
      ]])
      assert.equal(7, v)
    end)

    it("text load into its own environment", function()
      assert.equal(3, eval([[return load("return 1 + 2")()]]))
      assert.is_nil(eval([[return load("return io")()]]))
    end)
  end)

  describe("reports", function()
    it("syntax errors with the file and line", function()
      local v, err = sandbox.load("return {\n  run = function(\n", "59-x.lua")
      assert.is_nil(v)
      assert.matches("^59%-x%.lua:3:", err)
    end)

    it("errors raised while loading", function()
      local v, err = sandbox.load("local x = nil\nreturn x.y", "60-y.lua")
      assert.is_nil(v)
      assert.matches("^60%-y%.lua:2:", err)
    end)
  end)
end)
