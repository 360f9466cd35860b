-- A small renderer for the subset of Helm's Go templates deploy/helm uses
-- (no helm binary on these machines): text with {{ }} actions and their
-- {{- -}} trimming, comments, define/include, if/else if/else/end, with,
-- variables ($x := ...), fields (.Values.a.b, $x.a), parenthesised
-- pipelines and the functions below. Anything else raises, naming it, so a
-- template the renderer does not understand fails its spec instead of
-- rendering wrong.
--
--   local tpl = require "spec.support.helm_template"
--   local text = tpl.render_chart("deploy/helm", { values = {...}, namespace = "cozy-system",
--     lookup = function(api_version, kind, namespace, name) return obj_or_nil end })
local M = {}

---------------------------------------------------------------------------
-- Lexing and parsing

local function tokenize_action(src, where)
  local toks, i = {}, 1
  while i <= #src do
    local c = src:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif c == '"' then
      local j, buf = i + 1, {}
      while true do
        local ch = src:sub(j, j)
        if ch == "" then error(where .. ": unterminated string") end
        if ch == "\\" then
          local n = src:sub(j + 1, j + 1)
          buf[#buf + 1] = ({ n = "\n", t = "\t", ['"'] = '"', ["\\"] = "\\" })[n] or n
          j = j + 2
        elseif ch == '"' then
          break
        else
          buf[#buf + 1] = ch
          j = j + 1
        end
      end
      toks[#toks + 1] = { t = "string", v = table.concat(buf) }
      i = j + 1
    elseif c == "(" or c == ")" or c == "|" then
      toks[#toks + 1] = { t = c }
      i = i + 1
    elseif src:sub(i, i + 1) == ":=" then
      toks[#toks + 1] = { t = ":=" }
      i = i + 2
    else
      local word = src:match("^[^%s()|]+", i)
      if word:match("^%-?%d+$") then
        toks[#toks + 1] = { t = "number", v = math.tointeger(tonumber(word)) }
      elseif word == "true" or word == "false" then
        toks[#toks + 1] = { t = "bool", v = word == "true" }
      elseif word:match("^%$") then
        toks[#toks + 1] = { t = "var", v = word }
      elseif word:match("^%.") then
        toks[#toks + 1] = { t = "field", v = word }
      elseif word:match("^[%a_][%w_]*$") then
        toks[#toks + 1] = { t = "ident", v = word }
      else
        error(("%s: cannot parse %q"):format(where, word))
      end
      i = i + #word
    end
  end
  return toks
end

-- Splits template text into text pieces and actions, applying trim markers.
local function lex(text, name)
  local items, pos = {}, 1
  while true do
    local s = text:find("{{", pos, true)
    if not s then
      items[#items + 1] = { kind = "text", v = text:sub(pos) }
      break
    end
    local e = text:find("}}", s + 2, true)
    if not e then error(name .. ": unclosed action") end
    local body = text:sub(s + 2, e - 1)
    local ltrim, rtrim = body:match("^%- ") ~= nil, body:match(" %-$") ~= nil
    if ltrim then body = body:sub(3) end
    if rtrim then body = body:sub(1, -3) end
    local before = text:sub(pos, s - 1)
    if ltrim then before = before:gsub("%s+$", "") end
    items[#items + 1] = { kind = "text", v = before }
    body = body:match("^%s*(.-)%s*$")
    if not body:match("^/%*.*%*/$") then
      items[#items + 1] = { kind = "action", v = body, where = name }
    end
    pos = e + 2
    if rtrim then pos = text:find("[^%s]", pos) or (#text + 1) end
  end
  return items
end

-- Parses a pipeline from toks[i..]; returns node, next index.
local parse_pipeline

local function parse_operand(toks, i, where)
  local t = toks[i]
  if t == nil then error(where .. ": missing operand") end
  if t.t == "(" then
    local node, j = parse_pipeline(toks, i + 1, where)
    if not toks[j] or toks[j].t ~= ")" then error(where .. ": missing )") end
    return node, j + 1
  end
  return t, i + 1
end

function parse_pipeline(toks, i, where)
  local cmds = {}
  local cmd = {}
  while toks[i] and toks[i].t ~= ")" do
    if toks[i].t == "|" then
      cmds[#cmds + 1] = cmd
      cmd = {}
      i = i + 1
    else
      local node
      node, i = parse_operand(toks, i, where)
      cmd[#cmd + 1] = node
    end
  end
  cmds[#cmds + 1] = cmd
  return { t = "pipeline", cmds = cmds }, i
end

local function parse_action_pipeline(src, where)
  local toks = tokenize_action(src, where)
  local assign
  if toks[1] and toks[1].t == "var" and toks[2] and toks[2].t == ":=" then
    assign = toks[1].v
    table.remove(toks, 1)
    table.remove(toks, 1)
  end
  local node, j = parse_pipeline(toks, 1, where)
  if toks[j] then error(where .. ": unexpected " .. toks[j].t) end
  node.assign = assign
  return node
end

-- Builds the tree: { kind = "list", items }, with if/with/define nodes.
local function parse(items, name, defines)
  local pos = 1
  local function block(stop_words)
    local list = {}
    while pos <= #items do
      local it = items[pos]
      pos = pos + 1
      if it.kind == "text" then
        list[#list + 1] = it
      else
        local word, rest = it.v:match("^(%a+)%s*(.*)$")
        if word == "end" or word == "else" then
          if not stop_words then error(name .. ": unexpected " .. word) end
          return list, word, rest
        elseif word == "if" or word == "with" then
          local node = { kind = word, cond = parse_action_pipeline(rest, name) }
          local body, stop, stop_rest = block(true)
          node.body = body
          local tail = node
          while stop == "else" do
            if stop_rest:match("^if%s") then
              local nested = { kind = "if", cond = parse_action_pipeline(stop_rest:sub(4), name) }
              nested.body, stop, stop_rest = block(true)
              tail.else_body = { nested }
              tail = nested
            else
              tail.else_body, stop, stop_rest = block(true)
            end
          end
          list[#list + 1] = node
        elseif word == "define" then
          local dname = rest:match('^"([^"]+)"$')
          if not dname then error(name .. ": bad define") end
          local body, stop = block(true)
          if stop ~= "end" then error(name .. ": define without end") end
          defines[dname] = body
        elseif word == "range" or word == "template" or word == "block" then
          error(name .. ": '" .. word .. "' is not supported by this renderer")
        else
          list[#list + 1] = { kind = "action", pipe = parse_action_pipeline(it.v, name) }
        end
      end
    end
    if stop_words then error(name .. ": missing {{ end }}") end
    return list
  end
  return block(false)
end

---------------------------------------------------------------------------
-- Evaluation

local function truthy(v)
  if v == nil or v == false or v == 0 or v == "" then return false end
  if type(v) == "table" and next(v) == nil then return false end
  return true
end
M.truthy = truthy

local function walk(v, path)
  for part in path:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = v[part]
  end
  return v
end

local yaml_block

local function yaml_scalar(v)
  if type(v) == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c)
      if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" elseif c == "\n" then return "\\n" end
      return ("\\u%04x"):format(c:byte())
    end) .. '"'
  elseif v == nil then
    return "null"
  end
  return tostring(v)
end

local function is_list(t) return #t > 0 end

-- Block YAML as helm's toYaml writes it (keys sorted), strings quoted.
function yaml_block(v, indent, out)
  local pad = (" "):rep(indent)
  if type(v) ~= "table" then
    out[#out + 1] = pad .. yaml_scalar(v)
  elseif is_list(v) then
    for _, item in ipairs(v) do
      if type(item) == "table" and next(item) ~= nil then
        local sub = {}
        yaml_block(item, 0, sub)
        for k, line in ipairs(sub) do
          out[#out + 1] = pad .. (k == 1 and "- " or "  ") .. line
        end
      else
        out[#out + 1] = pad .. "- " .. (type(item) == "table" and "{}" or yaml_scalar(item))
      end
    end
  else
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local val = v[k]
      if type(val) == "table" and next(val) ~= nil then
        out[#out + 1] = pad .. k .. ":"
        yaml_block(val, is_list(val) and indent or indent + 2, out)
      elseif type(val) == "table" then
        out[#out + 1] = pad .. k .. ": {}"
      else
        out[#out + 1] = pad .. k .. ": " .. yaml_scalar(val)
      end
    end
  end
  return out
end

local function to_int(v)
  if type(v) == "number" then return math.tointeger(v) or math.floor(v) end
  if type(v) == "string" then return math.tointeger(tonumber(v)) or 0 end
  return 0
end

local function compare_values(a, b)
  if type(a) ~= type(b) then error(("incompatible types for comparison: %s and %s"):format(type(a), type(b))) end
  return a, b
end

local function indent_text(n, s)
  local pad = (" "):rep(n)
  return pad .. tostring(s):gsub("\n", "\n" .. pad)
end

local Renderer = {}
Renderer.__index = Renderer

function Renderer:funcs()
  local r = self
  return {
    ["and"] = function(...)
      local args = table.pack(...)
      for i = 1, args.n do if not truthy(args[i]) then return args[i] end end
      return args[args.n]
    end,
    ["or"] = function(...)
      local args = table.pack(...)
      for i = 1, args.n do if truthy(args[i]) then return args[i] end end
      return args[args.n]
    end,
    ["not"] = function(v) return not truthy(v) end,
    eq = function(a, b) return a == b end,
    ne = function(a, b) return a ~= b end,
    lt = function(a, b) a, b = compare_values(a, b) return a < b end,
    le = function(a, b) a, b = compare_values(a, b) return a <= b end,
    gt = function(a, b) a, b = compare_values(a, b) return a > b end,
    ge = function(a, b) a, b = compare_values(a, b) return a >= b end,
    int = to_int,
    toString = function(v) return v == nil and "" or tostring(v) end,
    quote = function(v) return yaml_scalar(v == nil and "" or tostring(v)) end,
    default = function(d, v) if truthy(v) then return v end return d end,
    required = function(msg, v) if v == nil then error(msg) end return v end,
    toYaml = function(v) return table.concat(yaml_block(v, 0, {}), "\n") end,
    nindent = function(n, s) return "\n" .. indent_text(n, s) end,
    indent = function(n, s) return indent_text(n, s) end,
    lookup = function(api_version, kind, namespace, name)
      local obj = r.lookup and r.lookup(api_version, kind, namespace, name)
      return obj or {}
    end,
    include = function(name, dot)
      local body = r.defines[name]
      if not body then error("include of undefined template " .. name) end
      return r:exec(body, dot, { vars = {}, parent = nil })
    end,
  }
end

function Renderer:operand(node, dot, scope)
  if node.t == "string" or node.t == "number" or node.t == "bool" then return node.v end
  if node.t == "pipeline" then return self:pipeline(node, dot, scope) end
  if node.t == "field" then
    if node.v == "." then return dot end
    return walk(dot, node.v:sub(2))
  end
  if node.t == "var" then
    local name, path = node.v:match("^(%$[%w_]*)(.*)$")
    local s = scope
    while s and s.vars[name] == nil do s = s.parent end
    if not s then
      if name == "$" then return self.root end
      error("undefined variable " .. name)
    end
    local v = s.vars[name]
    if path ~= "" then v = walk(v, path:sub(2)) end
    return v
  end
  if node.t == "ident" then error("function " .. node.v .. " used as a value") end
  error("unexpected " .. tostring(node.t))
end

function Renderer:pipeline(node, dot, scope)
  local value, have = nil, false
  for _, cmd in ipairs(node.cmds) do
    local head = cmd[1]
    if head and head.t == "ident" then
      local fn = self.fn[head.v]
      if not fn then error("function " .. head.v .. " is not supported by this renderer") end
      local args = {}
      for k = 2, #cmd do args[#args + 1] = self:operand(cmd[k], dot, scope) end
      local n = #cmd - 1
      if have then n = n + 1; args[n] = value end
      value = fn(table.unpack(args, 1, n))
    else
      if #cmd ~= 1 then error("a value cannot take arguments") end
      value = self:operand(head, dot, scope)
    end
    have = true
  end
  return value
end

function Renderer:exec(list, dot, scope)
  local out = {}
  for _, node in ipairs(list) do
    if node.kind == "text" then
      out[#out + 1] = node.v
    elseif node.kind == "action" then
      local v = self:pipeline(node.pipe, dot, scope)
      if node.pipe.assign then
        scope.vars[node.pipe.assign] = v
      elseif v ~= nil then
        out[#out + 1] = tostring(v)
      end
    elseif node.kind == "if" or node.kind == "with" then
      local inner = { vars = {}, parent = scope }
      local v = self:pipeline(node.cond, dot, inner)
      if node.cond.assign then inner.vars[node.cond.assign] = v end
      if truthy(v) then
        out[#out + 1] = self:exec(node.body, node.kind == "with" and v or dot, inner)
      elseif node.else_body then
        out[#out + 1] = self:exec(node.else_body, dot, { vars = {}, parent = scope })
      end
    end
  end
  return table.concat(out)
end

-- Renders every template of a chart directory; returns { [file] = text }.
-- opts: values (merged over values.yaml by the caller), namespace, lookup,
-- read_values(path) -> table (values.yaml parser).
function M.render_chart(dir, opts)
  local r = setmetatable({ defines = {}, lookup = opts.lookup }, Renderer)
  r.fn = r:funcs()
  local files = {}
  local p = io.popen("ls " .. dir .. "/templates")
  for name in p:lines() do files[#files + 1] = name end
  p:close()
  table.sort(files)
  local trees = {}
  for _, name in ipairs(files) do
    local f = assert(io.open(dir .. "/templates/" .. name))
    local text = f:read("a")
    f:close()
    trees[name] = parse(lex(text, name), name, r.defines)
  end
  r.root = { Values = opts.values, Release = { Namespace = opts.namespace, Name = opts.release or "cozystack" } }
  local rendered = {}
  for _, name in ipairs(files) do
    if not name:match("^_") then
      rendered[name] = r:exec(trees[name], r.root, { vars = { ["$"] = r.root }, parent = nil })
    end
  end
  return rendered
end

return M
