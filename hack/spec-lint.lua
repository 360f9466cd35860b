-- The spec rules a linter can hold (spec/README.md, "What every spec holds
-- to"), checked by hack/lint.sh over spec/:
--   layout   a Lua file outside spec/helpers, spec/support and spec/fixtures
--            is a *_spec.lua: helpers live in the one harness, spec/helpers;
--            an e2e spec lives in the folder of its feature (spec/e2e/<feature>/)
--   error    has_error / error_matches / assert.error(s) name the error
--            they expect (a second argument); no assert.is_false(pcall(...))
--   ceiling  no `took <`, `elapsed <`, `monotime() - t <`: assert what
--            happened, not how fast (a lower bound is fine)
--   sleep    no os.execute("sleep ..."): poll a condition (cli.poll)
--   entry    a spec requires the harness through its one entry point,
--            `require "spec.helpers"`, never spec.support.* or
--            spec.helpers.* itself (harness.server, harness.cli...); and no
--            Lua file here names a module `local support =` (it stood for
--            three different ones): a module goes by the name it has in
--            spec.helpers
-- A line may opt out with a comment `spec-lint: allow <why>`.
-- Usage (from the repository root): lua5.4 hack/spec-lint.lua [file...]

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function spec_files()
  local out = {}
  local p = assert(io.popen("find spec -name '*.lua' -not -path 'spec/support/go/*' | sort"))
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- The end of the call whose argument list opens at `i` (just after its
-- "("), and how many arguments it has at the top level: strings, long
-- strings and comments skipped, nested brackets counted.
local function call_arguments(s, i)
  local depth, commas, any = 1, 0, false
  while i <= #s do
    local c = s:sub(i, i)
    local long = s:match("^%[(=*)%[", i)
    if s:sub(i, i + 1) == "--" then
      local level = s:match("^%-%-%[(=*)%[", i)
      local close = level and s:find("]" .. level .. "]", i, true) or s:find("\n", i, true)
      i = (close or #s) + (level and #level + 2 or 1)
    elseif long then
      i = (s:find("]" .. long .. "]", i, true) or #s) + #long + 2
      any = true
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= #s and s:sub(j, j) ~= c do j = j + (s:sub(j, j) == "\\" and 2 or 1) end
      i, any = j + 1, true
    else
      if c == "(" or c == "{" or c == "[" then
        depth = depth + 1
      elseif c == ")" or c == "}" or c == "]" then
        depth = depth - 1
        if depth == 0 then return i, any and commas + 1 or 0 end
      elseif c == "," and depth == 1 then
        commas = commas + 1
      end
      if not c:match("%s") then any = true end
      i = i + 1
    end
  end
  return #s, any and commas + 1 or 0
end

local function line_of(s, at)
  local n = 1
  for _ in s:sub(1, at):gmatch("\n") do n = n + 1 end
  return n
end

local ERROR_CALLS = { "has_error", "has_errors", "assert%.errors?", "has%.errors?", "error_matches" }
local CEILINGS = { "%f[%w_]took%s*<", "%f[%w_]elapsed%s*<", "monotime%(%)%s*%-%s*[%w_%.]+%s*<",
  "now_ms%(%)%s*%-%s*[%w_%.]+%s*<" }
-- A require of a harness module other than the entry point, in any form:
-- require "m", require("m"), require 'm', require [[m]].
local HARNESS_REQUIRE = "require%s*%(?%s*[\"'%[]=*%[?(spec%.[%w_]+[%.%w_]*)"
local ENTRY = "spec.helpers"
local ENTRY_NAMES = { ["spec.support.fake"] = "server", ["spec.support.hostile"] = "hostile" }

local function entry_name(module)
  return ENTRY_NAMES[module] or module:match("^spec%.helpers%.([%w_]+)$") or "?"
end

local BARE_PCALL = { "assert%.is_false%(%s*pcall%(", "assert%.falsy%(%s*pcall%(", "assert%(%s*not%s+pcall%(" }

local function check(path, findings)
  local function report(line, rule, what)
    findings[#findings + 1] = ("%s:%d: [%s] %s"):format(path, line, rule, what)
  end
  if not path:match("_spec%.lua$") and not path:match("^spec/helpers/") and not path:match("^spec/support/")
      and not path:match("^spec/fixtures/") then
    report(1, "layout", "not a spec: helpers belong in spec/helpers, fixtures in spec/fixtures")
  end
  if path:match("^spec/e2e/[^/]+$") then
    report(1, "layout", "an e2e spec outside a feature's folder: move it to spec/e2e/<feature>/ (spec/README.md)")
  end
  local s = read(path)
  local lines = {}
  for l in (s .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = l end
  local function allowed(n) return (lines[n] or ""):find("spec-lint: allow", 1, true) ~= nil end
  for n, l in ipairs(lines) do
    if not allowed(n) and not l:match("^%s*%-%-") and l:find("%f[%w_]local%s+support%s*=") then
      report(n, "entry", "`local support =` names no module: call it what spec.helpers calls it (cli, "
        .. "transport, campaign...): " .. l:match("^%s*(.-)%s*$"))
    end
  end
  if not path:match("_spec%.lua$") then return end
  for n, l in ipairs(lines) do
    if not allowed(n) and not l:match("^%s*%-%-") then
      for module in l:gmatch(HARNESS_REQUIRE) do
        if module ~= ENTRY and (module:match("^spec%.support%.") or module:match("^spec%.helpers%.")) then
          report(n, "entry", ('%s required directly: require "%s" and use its .%s'):format(module, ENTRY,
            entry_name(module)))
        end
      end
    end
  end
  for _, name in ipairs(ERROR_CALLS) do
    local from = 1
    while true do
      local a, b = s:find("%f[%w_]" .. name .. "%s*%(", from)
      if not a then break end
      local _, n = call_arguments(s, b + 1)
      local line = line_of(s, a)
      if n < 2 and not allowed(line) then
        report(line, "error", "an error assertion that names no error: " .. lines[line]:match("^%s*(.-)%s*$"))
      end
      from = b + 1
    end
  end
  for n, l in ipairs(lines) do
    if not allowed(n) and not l:match("^%s*%-%-") then
      for _, p in ipairs(BARE_PCALL) do
        if l:find(p) then report(n, "error", "a failure asserted without its error: " .. l:match("^%s*(.-)%s*$")) end
      end
      for _, p in ipairs(CEILINGS) do
        if l:find(p) then report(n, "ceiling", "a wall-clock ceiling: " .. l:match("^%s*(.-)%s*$")) end
      end
      if l:find("os%.execute%(%s*[\"']sleep") then
        report(n, "sleep", "a sleep where a condition can be polled (cli.poll): " .. l:match("^%s*(.-)%s*$"))
      end
    end
  end
end

local findings = {}
local files = #arg > 0 and arg or spec_files()
for _, path in ipairs(files) do check(path, findings) end
for _, f in ipairs(findings) do print(f) end
if #findings > 0 then
  print(("spec-lint: %d finding(s); spec/README.md says why"):format(#findings))
  os.exit(1)
end
