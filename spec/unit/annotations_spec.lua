-- The migration API's LuaCATS annotations (as lua-language-server reads
-- them; docs/authoring.md, "Editor completion"): every function cozy.obj,
-- cozy.match, cozy.recipe, cozy.base64 and cozy.validate export has an
-- annotation block naming each of its parameters, and every field of a ctx
-- built as the runner builds it
-- (and of the tables it hands out: ctx.kube, a resource, a pager, ctx.log, a
-- progress bar, a queue, a join) is declared in types/cozy/ctx.lua, each
-- function with its block, and nothing is declared there that ctx lacks. A
-- function added without one fails here.
local context = require "cozy.runner.context"
local files = require("spec.helpers").files

-- A source's annotations: `defs[var][name]` = { params = {...}, block = {lines} }
-- for each `function var.name(...)` / `function var:name(...)`, block being
-- the `---` lines just above it; `classes[class]` = { var =, fields = {} }.
local function parse(text)
  local defs, classes = {}, {}
  local block, class = {}, nil
  for line in (text .. "\n"):gmatch("(.-)\n") do
    local var, sep, name, params = line:match("^function ([%w_]+)([.:])([%w_]+)%((.-)%)")
    if var then
      local list = {}
      for p in params:gmatch("[^,%s]+") do list[#list + 1] = p end
      defs[var] = defs[var] or {}
      defs[var][name] = { params = list, block = block, method = sep == ":" }
    end
    local c = line:match("^%-%-%-@class ([%w_.]+)")
    if c then class = c; classes[c] = classes[c] or { fields = {} } end
    local field = line:match("^%-%-%-@field ([%w_]+)")
    if field and class then classes[class].fields[field] = true end
    local v = line:match("^local ([%w_]+) = {}")
    if v and class then classes[class].var, class = v, nil end
    if line:find("^%-%-%-") then
      block[#block + 1] = line
    else
      block = {}
    end
  end
  return defs, classes
end

-- Why def (a parse result, or nil) is not an annotated function with params
-- `params` (nil: take the def's own), or nil when it is.
local function unannotated(def, params)
  if def == nil then return "no definition" end
  local tags = table.concat(def.block, "\n") .. "\n"
  if #def.block == 0 then return "no annotation block" end
  for _, p in ipairs(params or def.params) do
    local pattern = "%-%-%-@param " .. p:gsub("%p", "%%%0") .. "%??[%s]"
    if not tags:find(pattern) then return ("no ---@param %s"):format(p) end
  end
  return nil
end

-- A function's own parameter names (`...` for a vararg).
local function params_of(fn)
  local out, info = {}, debug.getinfo(fn, "u")
  for i = 1, info.nparams do out[i] = debug.getlocal(fn, i) end
  if info.isvararg then out[#out + 1] = "..." end
  return out
end

-- The exported functions of module `mod` (loaded) without an annotation
-- block in `text`, whose table is `var`, each with why.
local function module_gaps(mod, text, var)
  local defs = parse(text)
  local gaps = {}
  for name, v in pairs(mod) do
    if type(v) == "function" then
      local why = unannotated(defs[var] and defs[var][name], params_of(v))
      if why then gaps[#gaps + 1] = ("%s.%s: %s"):format(var, name, why) end
    end
  end
  table.sort(gaps)
  return gaps
end

local MODULES = {
  { "cozy.obj", "scripts/cozy/obj.lua", "obj" },
  { "cozy.match", "scripts/cozy/match.lua", "match" },
  { "cozy.recipe", "scripts/cozy/recipe.lua", "recipe" },
  { "cozy.rule", "scripts/cozy/rule.lua", "rule" },
  { "cozy.base64", "scripts/cozy/base64.lua", "base64" },
  { "cozy.validate", "scripts/cozy/validate.lua", "validate" },
}

describe("LuaCATS annotations of the modules migrations require", function()
  for _, m in ipairs(MODULES) do
    it(("%s: every exported function has a block naming each parameter"):format(m[1]), function()
      local mod = require(m[1])
      local count = 0
      for _, v in pairs(mod) do if type(v) == "function" then count = count + 1 end end
      assert.is_true(count > 0)
      assert.same({}, module_gaps(mod, assert(files.read(m[2])), m[3]))
    end)
  end

  it("a function whose block is removed, or whose parameter is not named, is found", function()
    local obj = require "cozy.obj"
    local text = assert(files.read("scripts/cozy/obj.lua"))
    -- the block above obj.get gone
    local lines = {}
    for line in (text .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
    for i, line in ipairs(lines) do
      if line:find("^function obj%.get%(") then
        while lines[i - 1]:find("^%-%-%-") do table.remove(lines, i - 1); i = i - 1 end
        break
      end
    end
    local without = table.concat(lines, "\n")
    assert.same({ "obj.get: no annotation block" }, module_gaps(obj, without, "obj"))
    -- a ---@param of obj.key gone
    local unnamed = text:gsub("%-%-%-@param o cozy%.Object\n(%-%-%-@return string key)", "%1", 1)
    assert.same({ "obj.key: no ---@param o" }, module_gaps(obj, unnamed, "obj"))
  end)
end)

-- A stand-in for the step's client view and logger: enough for context.new
-- and each facade to be built as the runner builds them (nothing is sent).
local function any_call() return function() return nil end end
local function stub_resource()
  return setmetatable({ api_version = "v1", plural = "configmaps", namespaced = true, kind = "ConfigMap" },
    { __index = function(_, k)
      if k == "list" then return function() return { next = any_call() } end end
      return any_call()
    end })
end
local function stub_logger()
  local logger = {}
  function logger.progress() return { step = any_call(), done = any_call() } end
  function logger.with() return logger end
  return setmetatable(logger, { __index = function() return any_call() end })
end

local function built_ctx()
  local view = { namespace = "cozy-system", server = "https://127.0.0.1:1", stats = { requests = 0 } }
  function view.resource() return stub_resource() end
  -- the step executor always gives a tool caller (cozy.runner.step)
  return context.new { view = view, log = stub_logger(), namespace = "cozy-system", from = 1, to = 2, mode = "run",
    findings = {}, tool = function() end }
end

describe("LuaCATS annotations of ctx (types/cozy/ctx.lua)", function()
  local defs, classes = parse(assert(files.read("types/cozy/ctx.lua")))

  -- Each field of `t` (a facade, read with pairs as a migration may) as class
  -- `class` declares it: a function with an annotated definition, anything
  -- else a ---@field.
  local function gaps_of(t, class)
    local c = assert(classes[class], "no ---@class " .. class)
    local gaps, n = {}, 0
    for k, v in pairs(t) do
      n = n + 1
      local why
      if type(v) == "function" then
        why = unannotated(defs[c.var] and defs[c.var][k])
      elseif not c.fields[k] then
        why = "no ---@field"
      end
      if why then gaps[#gaps + 1] = ("%s.%s: %s"):format(class, k, why) end
    end
    assert.is_true(n > 0, class .. " has no fields")
    -- and nothing declared that ctx does not have: completion offers only what is there
    for name in pairs(defs[c.var] or {}) do
      if t[name] == nil then gaps[#gaps + 1] = ("%s.%s: declared, not in ctx"):format(class, name) end
    end
    table.sort(gaps)
    return gaps
  end

  local ctx = built_ctx()
  local res = ctx.kube:resource("v1", "configmaps")
  local tables = {
    { "ctx", ctx, "cozy.Ctx" },
    { "ctx.kube", ctx.kube, "cozy.Kube" },
    { "a resource (ctx.kube:resource)", res, "cozy.Resource" },
    { "a pager (resource:list)", res:list(), "cozy.Pager" },
    { "ctx.log", ctx.log, "cozy.Log" },
    { "a progress bar (ctx.progress)", ctx:progress("x", 1), "cozy.Progress" },
    { "a queue (ctx.queue)", ctx:queue(), "cozy.Queue" },
    { "a join (ctx.join)", ctx:join({}, {}, { key = function() end }), "cozy.Join" },
    { "a rule's selection (s.name)", (function()
      local held
      require "cozy.rule" { description = "d", select = { x = { "configmaps" } },
        walk = function(_, s) held = s.x end }.walk(ctx)
      return held
    end)(), "cozy.Selection" },
  }
  for _, case in ipairs(tables) do
    it(("%s: each field declared, each function annotated (%s)"):format(case[1], case[3]), function()
      assert.same({}, gaps_of(case[2], case[3]))
    end)
  end

  it("a ctx field without its definition is found", function()
    local text = assert(files.read("types/cozy/ctx.lua"))
    local cut = text:gsub("\n%-%-%- A finding:.-function Ctx:finding%b()[^\n]*\n", "\n", 1)
    assert.is_true(#cut < #text)
    defs, classes = parse(cut)
    assert.same({ "cozy.Ctx.finding: no definition" }, gaps_of(ctx, "cozy.Ctx"))
    defs, classes = parse(text)
  end)
end)
