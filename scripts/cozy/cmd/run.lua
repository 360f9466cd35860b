-- `cozy-migrate run [--target N] [--dry-run] [--server-dry-run]`: applies the
-- pending migrations. --dry-run is `plan`; --server-dry-run plans with the
-- server judging each write (dryRun=All), and prints the plan too.
local plan = require "cozy.cmd.plan"
local runner = require "cozy.runner"

local M = {}

function M.run(opts)
  if opts.dry_run or opts.server_dry_run then
    return runner.execute(opts, "plan", plan.printer(opts))
  end
  return runner.execute(opts, "run")
end

return M
