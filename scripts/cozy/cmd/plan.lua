-- `cozy-migrate plan [--target N] [--server-dry-run]`: what run would
-- change, rehearsed: every pending step runs in order over an overlay
-- of the live cluster (a legacy script in a network namespace whose only
-- address is the engine's overlay endpoint), each write sent with dryRun=All for the server to
-- judge, nothing written (docs/operations.md, "Rehearsals"). With
-- --server-dry-run each step runs against the cluster as it is, its writes
-- sent with dryRun=All.
--
-- The runner hands each event of the plan to a reporter; this module prints
-- them on stdout, as text for people or (with --log-format json) as one JSON
-- object per line: {"type": "plan" | "bootstrap" | "step" | "write" |
-- "legacy" | "failure" | "rehearsed" | "not_rehearsed" | "summary", ...}.
local cozy_text = require "cozy.text"
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
      e.server_dry_run and ", writes sent with dryRun=All"
        or ", rehearsed over the live cluster (writes sent with dryRun=All), nothing written")
  end,
  step = function(e)
    return ("step %d -> %d: %s (%s) %s"):format(e.from, e.to, e.name, e.kind, e.description)
  end,
  write = function(e)
    local q = query_text(e.query)
    local line = ("  %s %s%s%s"):format(e.method, e.path, q ~= "" and ("?" .. q) or "",
      e.content_type and ("  (" .. e.content_type .. ")") or "")
    local out = { line }
    if e.body ~= nil then out[#out + 1] = "    " .. cozy_text.json(e.body) end
    if e.verdict == "refused" then
      out[#out + 1] = "    refused by the server: " .. tostring(e.message)
    elseif e.verdict == "not validated" then
      out[#out + 1] = "    not validated by the server: " .. tostring(e.message)
    elseif e.verdict then
      out[#out + 1] = "    admitted by the server" .. (e.validated_as and (" (validated as " .. e.validated_as .. ")") or "")
    end
    if e.inexact then out[#out + 1] = "    inexact: " .. e.inexact end
    return out
  end,
  legacy = function(e)
    if e.rehearsal then
      return ("  legacy script %s: rehearsed in a network namespace of its own, its requests served from the "
        .. "rehearsal"):format(e.file)
    end
    return ("  legacy script %s would run here; its writes cannot be shown"):format(e.file)
  end,
  failure = function(e)
    if e.rehearsal then return ("  step %d (%s) would fail: %s"):format(e.number, e.name, e.error) end
    return ("  step %d would fail against the current cluster: %s"):format(e.number, e.error)
  end,
  rehearsed = function(e)
    if e.exact then return "  rehearsed exactly" end
    local out = { "  rehearsed inexactly:" }
    for _, why in ipairs(e.why) do out[#out + 1] = "    " .. why end
    return out
  end,
  not_rehearsed = function(e)
    return ("step %d: %s (%s): not rehearsed: %s"):format(e.number, e.name, e.kind, e.why)
  end,
  summary = function(e)
    local line = ("plan: %d step(s), %d write(s)%s"):format(e.steps, e.writes,
      e.failures > 0 and (", %d step(s) would fail"):format(e.failures) or "")
    local r = e.rehearsal
    if r == nil then return line end
    return { line, ("rehearsal: steps %d exact, %d inexact, %d not rehearsed; writes %d admitted, %d refused, "
      .. "%d not validated; objects %d created, %d changed, %d deleted"):format(r.steps_exact, r.steps_inexact,
      r.steps_not_rehearsed, r.writes_admitted, r.writes_refused, r.writes_not_validated, r.created, r.changed,
      r.deleted) }
  end,
}

-- A reporter printing plan events on stdout in the run's log format.
function M.printer(opts)
  local as_json = opts.log_format == "json"
  return function(e)
    if as_json then
      io.stdout:write(cozy_text.json(e), "\n")
    else
      local shown = text[e.type](e)
      io.stdout:write(cozy_text.lines(type(shown) == "table" and shown or { shown }))
    end
    io.stdout:flush()
  end
end

function M.run(opts)
  return runner.execute(opts, "plan", M.printer(opts))
end

return M
