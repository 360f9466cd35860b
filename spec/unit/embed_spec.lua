-- The runtime compiled into the binary (cmake/embed.cmake): binary chunks
-- compiled at build time (cmake/luac.c) with their debug information, so
-- that what people read (error messages, tracebacks, chunk names) is what
-- the text would give; and bytecode is taken from nowhere but the binary.
local files = require("spec.helpers").files
local shell = require("spec.helpers").cli

local q = shell.quote

-- Runs the binary with `args` (a shell-quoted string) and `env` (a string of
-- assignments, or ""); returns { code =, stdout =, stderr = }.
local function run(env, args)
  return shell.shell(("env %s %s %s"):format(env, q(shell.bin), args))
end

-- A file's lines, numbered as the compiler numbers them (empty ones too).
local function source_lines(path)
  local out = {}
  for line in (assert(files.read(path)) .. "\n"):gmatch("([^\n]*)\n") do out[#out + 1] = line end
  return out
end

-- The runtime's files: { path = "scripts/cozy/x.lua", module = "cozy.x" }.
local function runtime_files()
  local found = {}
  for path in files.capture("find scripts -name '*.lua' | sort"):gmatch("[^\n]+") do
    local module = path:gsub("^scripts/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    found[#found + 1] = { path = path, module = module }
  end
  return found
end

describe("the compiled-in runtime", function()
  it("keeps each module's file and line in its functions' debug information", function()
    local lines_of = {}
    for _, f in ipairs(runtime_files()) do lines_of["@" .. f.path] = source_lines(f.path) end
    local checked = 0
    for _, f in ipairs(runtime_files()) do
      local m = require(f.module)
      for name, fn in pairs(type(m) == "table" and m or {}) do
        local info = type(fn) == "function" and debug.getinfo(fn, "S")
        if info and info.what == "Lua" then
          -- a module may hand on another's function: any file of the runtime
          local lines = lines_of[info.source]
          assert.truthy(lines, f.module .. "." .. name .. " comes from " .. info.source)
          -- and the line it names is where the function is written in the tree
          assert.matches("function", lines[info.linedefined], 1, true, f.module .. "." .. name)
          checked = checked + 1
        end
      end
    end
    assert.is_true(checked > 100, "only " .. checked .. " functions checked")
  end)

  it("reports an error in a module as the text does: same message, file, line and traceback", function()
    local code = q([[require("cozy.runner.discovery").classify(nil)]])
    local compiled = run("-u COZY_MIGRATE_SCRIPTS", "lua -e " .. code)
    local text = run("COZY_MIGRATE_SCRIPTS=scripts", "lua -e " .. code)
    assert.equal(1, compiled.code)
    local line = compiled.stderr:match("^cozy%-migrate lua: scripts/cozy/runner/discovery%.lua:(%d+): attempt to index a nil value")
    assert.truthy(line, compiled.stderr)
    local source = source_lines("scripts/cozy/runner/discovery.lua")
    assert.matches("filename:sub", source[tonumber(line)], 1, true)
    assert.matches("scripts/cozy/runner/discovery.lua:" .. line .. ": in function 'cozy.runner.discovery.classify'",
      compiled.stderr, 1, true)
    assert.equal(text.stderr, compiled.stderr)
    assert.equal(text.code, compiled.code)
  end)

  it("reads COZY_MIGRATE_SCRIPTS's files as text only: a binary chunk there is refused", function()
    local dir = shell.tmpdir()
    assert(os.execute("cp -r scripts " .. q(dir .. "/scripts")))
    files.write(dir .. "/scripts/cozy/cli.lua", string.dump(assert(loadfile("scripts/cozy/cli.lua"))))
    local res = run("COZY_MIGRATE_SCRIPTS=" .. q(dir .. "/scripts"), "--version")
    files.rm_rf(dir)
    assert.equal(1, res.code)
    assert.equal("", res.stdout)
    assert.matches("error loading module 'cozy.cli'", res.stderr, 1, true)
    assert.matches("attempt to load a binary chunk (mode is 't')", res.stderr, 1, true)
  end)
end)

describe("the built-in migrations", function()
  it("carry their text and its sha256, computed at build time: the file's, as OpenSSL computes it", function()
    local sys = require "cozy.sys"
    local builtin = sys.builtin_migrations()
    assert.is_true(#builtin > 0)
    for _, b in ipairs(builtin) do
      assert.equal(assert(files.read(b.path)), b.source, b.path)
      assert.equal(sys.sha256(b.source), b.sha256, b.path)
      assert.equal(files.capture("sha256sum " .. q(b.path)):match("^%x+"), b.sha256, b.path)
    end
  end)

  it("load as the chunk their text compiles to, in the environment given", function()
    for _, b in ipairs(require("cozy.sys").builtin_migrations()) do
      local env = {}
      local chunk = assert(b.load(env))
      local from_text = assert(load(b.source, "@" .. b.path, "t", env))
      -- same compiler, same chunk name, debug information kept: the same bytes
      assert.equal(string.dump(from_text), string.dump(chunk), b.path)
      local name, value = debug.getupvalue(chunk, 1)
      assert.equal("_ENV", name)
      assert.equal(env, value)
      assert.are_not.equal(b.load(env), chunk) -- a fresh function each time
    end
  end)

  it("run in the sandbox as their text would: file and line in what they raise", function()
    local sandbox = require "cozy.sandbox"
    for _, b in ipairs(require("cozy.sys").builtin_migrations()) do
      -- the environment the sandbox compiles the file in, as it hands it over
      local given
      local def = assert(sandbox.load(b.source, b.path, nil, function(env)
        given = env
        return b.load(env)
      end))
      -- a migration states its work as run, or as walk (run in every mode)
      local body = def.run or def.walk
      local info = debug.getinfo(body, "S")
      -- or as a rule (cozy.rule) or a recipe (docs/engine-api.md, "Rules",
      -- "Recipes"), whose walk is the engine's code, as cozy.obj's functions
      -- are: its file is the engine module's
      local engine = info.source:match("^@(scripts/cozy/%a+%.lua)$")
      local recipe = engine == "scripts/cozy/recipe.lua" or engine == "scripts/cozy/rule.lua"
      local file = recipe and engine or b.path
      if recipe then
        assert.matches(engine == "scripts/cozy/rule.lua" and '"cozy.rule"' or 'require("cozy.recipe")', b.source,
          1, true, b.path)
      else
        assert.equal("@" .. b.path, info.source)
        assert.matches("function", source_lines(b.path)[info.linedefined], 1, true, b.path)
      end
      -- the sandbox's environment, not the engine's
      assert.is_table(given, b.path)
      assert.are_not.equal(_G, given)
      assert.is_nil(given.io)
      assert.is_nil(given.os.execute)
      -- and run's own, when it (or a function it reaches) uses a global at
      -- all, is that one: a run that only calls the file's local functions
      -- and upvalues has no _ENV of its own, which is no defect
      local function env_of(f, seen)
        if seen[f] then return nil end
        seen[f] = true
        local callees = {}
        for i = 1, math.huge do
          local name, value = debug.getupvalue(f, i)
          if name == nil then break end
          if name == "_ENV" then return value end
          if type(value) == "function" then callees[#callees + 1] = value end
        end
        for _, g in ipairs(callees) do
          local env = env_of(g, seen)
          if env then return env end
        end
      end
      local env = env_of(body, {})
      if env ~= nil and not recipe then assert.equal(given, env, b.path) end
      -- what a migration raises names its file and line (run without a ctx fails at once)
      local ok, err = pcall(body, nil)
      assert.is_false(ok)
      assert.matches("^" .. file:gsub("%p", "%%%0") .. ":%d+: ", err, nil, b.path)
    end
  end)
end)

describe("a migrations directory", function()
  it("holds text only: a migration file in bytecode form is refused (exit 2, naming it)", function()
    local dumped = string.dump(assert(load([[return { description = "d", run = function() end }]])))
    local dir = shell.migration_dir { ["1-bytecode.lua"] = dumped }
    local res = run("-u COZY_MIGRATE_MIGRATIONS", ("list --no-builtin --migrations %s"):format(q(dir)))
    files.rm_rf(dir)
    assert.equal(2, res.code)
    assert.equal("", res.stdout)
    assert.matches("ERROR attempt to load a binary chunk (mode is 't') file=" .. dir .. "/1-bytecode.lua kind=invalid",
      res.stderr, 1, true)
  end)
end)
