-- `cozy-migrate plan [--target N] [--server-dry-run]`: what run would
-- change; nothing is written (with --server-dry-run the writes go to the
-- server with dryRun=All, which validates and persists nothing).
local runner = require "cozy.runner"

local M = {}

function M.run(opts)
  return runner.execute(opts, "plan")
end

return M
