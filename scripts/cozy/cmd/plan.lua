-- `cozy-migrate plan [--target N] [--server-dry-run]`: what run would
-- change; nothing is written (with --server-dry-run the writes go to the
-- server with dryRun=All, which validates and persists nothing).
--
-- The runner hands each event of the plan to a reporter; this module prints
-- them on stdout, as text for people or (with --log-format json) as one JSON
-- object per line: {"type": "plan" | "bootstrap" | "step" | "write" |
-- "legacy" | "failure" | "summary", ...}.
local cozy_text = require "cozy.text"
local json = require "cozy.json"
local runner = require "cozy.runner"

local M = {}

local function query_text(q)
  if type(q) ~= "table" then return q or "" end
  local parts = {}
  for k, v in pairs(q) do parts[#parts + 1] = k .. "=" .. tostring(v) end
  table.sort(parts)
  return table.concat(parts, "&")
end

local text = {
  bootstrap = function(e)
    return ("plan: no %s/%s: would create it at version %d"):format(e.namespace, e.configmap, e.version)
  end,
  plan = function(e)
    if e.steps == 0 then return ("plan: version %d, target %d: nothing to do"):format(e.current, e.target) end
    return ("plan: version %d -> %d, %d step(s)%s"):format(e.current, e.target, e.steps,
      e.server_dry_run and ", writes sent with dryRun=All" or ", nothing written")
  end,
  step = function(e)
    return ("step %d -> %d: %s (%s) %s"):format(e.from, e.to, e.name, e.kind, e.description)
  end,
  write = function(e)
    local q = query_text(e.query)
    local line = ("  %s %s%s%s"):format(e.method, e.path, q ~= "" and ("?" .. q) or "",
      e.content_type and ("  (" .. e.content_type .. ")") or "")
    if e.body ~= nil then line = line .. "\n    " .. json.encode(e.body) end
    return line
  end,
  legacy = function(e)
    return ("  legacy script %s would run here; its writes cannot be shown"):format(e.file)
  end,
  failure = function(e)
    return ("  step %d would fail against the current cluster: %s"):format(e.number, e.error)
  end,
  summary = function(e)
    return ("plan: %d step(s), %d write(s)%s"):format(e.steps, e.writes,
      e.failures > 0 and (", %d step(s) would fail"):format(e.failures) or "")
  end,
}

-- A reporter printing plan events on stdout in the run's log format.
function M.printer(opts)
  local as_json = opts.log_format == "json"
  return function(e)
    if as_json then
      io.stdout:write(json.encode(cozy_text.safe_value(e)), "\n")
    else
      io.stdout:write(cozy_text.safe(text[e.type](e)), "\n")
    end
    io.stdout:flush()
  end
end

function M.run(opts)
  return runner.execute(opts, "plan", M.printer(opts))
end

return M
