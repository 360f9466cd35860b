-- `cozy-migrate list`: the migrations this build (or --migrations DIR) knows.
local cozy_text = require "cozy.text"
local files = require "cozy.runner.files"
local json = require "cozy.json"
local parameters = require "cozy.runner.parameters"
local tools = require "cozy.runner.tools"

-- marks a table as a JSON array (cozy.json); the identity before it exists
local as_array = json.array or function(t) return t end
local runner = require "cozy.runner"

local M = {}

function M.run(opts)
  return runner.protect(opts, function(log)
    local set = runner.discover(opts)
    if opts.output == "json" then
      local items = {}
      for _, m in ipairs(set.migrations) do
        items[#items + 1] = { number = m.number, name = m.name, kind = m.kind,
          description = m.description, sha256 = m.sha256, file = m.file,
          parameters = m.kind == "lua" and as_array(parameters.describe(m)) or nil,
          files = m.kind == "lua" and as_array(files.describe(m)) or nil,
          tools = m.tools and as_array(m.tools) or nil }
      end
      io.stdout:write(cozy_text.json({ origin = set.origin, migrations = as_array(items) }), "\n")
    else
      local out = {}
      if #set.migrations == 0 then out[1] = ("no migrations (%s)"):format(set.origin) end
      for _, m in ipairs(set.migrations) do
        out[#out + 1] = ("%-4d %-32s %-6s %s  %s"):format(m.number, m.name, m.kind, m.sha256,
          m.description)
        for _, p in ipairs(m.kind == "lua" and parameters.describe(m) or {}) do
          out[#out + 1] = "     parameter " .. parameters.text(p)
        end
        for _, f in ipairs(m.kind == "lua" and files.describe(m) or {}) do
          out[#out + 1] = ("     file %s: %s (read-only)"):format(f.name, f.declared)
        end
        for _, t in ipairs(m.kind == "lua" and tools.describe(m) or {}) do
          out[#out + 1] = "     tool " .. t
        end
      end
      io.stdout:write(cozy_text.lines(out))
    end
    log:debug("listed migrations", { count = #set.migrations, origin = set.origin })
    return 0
  end)
end

return M
