-- `cozy-migrate list`: the migrations this build (or --migrations DIR) knows.
local json = require "cozy.json"

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
          description = m.description, sha256 = m.sha256, file = m.file }
      end
      io.stdout:write(json.encode({ origin = set.origin, migrations = as_array(items) }), "\n")
    else
      if #set.migrations == 0 then
        io.stdout:write("no migrations (", set.origin, ")\n")
      end
      for _, m in ipairs(set.migrations) do
        io.stdout:write(("%-4d %-32s %-6s %s  %s\n"):format(m.number, m.name, m.kind, m.sha256, m.description))
      end
    end
    log:debug("listed migrations", { count = #set.migrations, origin = set.origin })
    return 0
  end)
end

return M
