-- `cozy-migrate run [--target N] [--dry-run] [--server-dry-run]`
local runner = require "cozy.runner"

local M = {}

function M.run(opts)
  return runner.execute(opts, opts.dry_run and "plan" or "run")
end

return M
