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
-- "legacy" | "failure" | "rehearsed" | "not_rehearsed" | "object" |
-- "summary", ...}. With `-o json` (plan only) it prints one JSON document
-- at the end instead: the same events gathered per step (docs/operations.md,
-- "What a plan shows").
local cozy_text = require "cozy.text"
local request = require "cozy.kube.request"
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
    return ("plan: no %s/%s: would create it at version %d")
      :format(e.namespace, e.configmap, e.version)
  end,
  plan = function(e)
    if e.steps == 0 then
      return ("plan: version %d, target %d: nothing to do"):format(e.current, e.target)
    end
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
    local out = { line, "    " .. M.write_object(e) }
    if e.body ~= nil then out[#out + 1] = "    " .. cozy_text.json(e.body) end
    if e.verdict == "refused" then
      out[#out + 1] = "    refused by the server: " .. tostring(e.message)
    elseif e.verdict == "not validated" then
      out[#out + 1] = "    not validated by the server: " .. tostring(e.message)
    elseif e.verdict then
      out[#out + 1] = "    admitted by the server"
        .. (e.validated_as and (" (validated as " .. e.validated_as .. ")") or "")
    end
    if e.inexact then out[#out + 1] = "    inexact: " .. e.inexact end
    return out
  end,
  legacy = function(e)
    if e.rehearsal then
      return ("  legacy script %s: rehearsed in a network namespace of its own, its requests "
        .. "served from the "
        .. "rehearsal"):format(e.file)
    end
    return ("  legacy script %s would run here; its writes cannot be shown"):format(e.file)
  end,
  failure = function(e)
    if e.rehearsal then
      return ("  step %d (%s) would fail: %s"):format(e.number, e.name, e.error)
    end
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
  object = function(e)
    local out = { ("object %s: %s"):format(e.action, M.object_name(e)) }
    if e.terminating then out[#out + 1] = "  terminating: kept by its finalizers" end
    if e.inexact then out[#out + 1] = "  inexact: " .. e.inexact end
    if e.before_unknown then out[#out + 1] = "  no diff: " .. e.before_unknown end
    for _, l in ipairs(e.diff or {}) do out[#out + 1] = l end
    return out
  end,
  summary = function(e)
    local line = ("plan: %d step(s), %d write(s)%s"):format(e.steps, e.writes,
      e.failures > 0 and (", %d step(s) would fail"):format(e.failures) or "")
    local r = e.rehearsal
    if r == nil then return line end
    return { line,
      ("rehearsal: steps %d exact, %d inexact, %d not rehearsed; writes %d admitted, %d refused, "
        .. "%d not validated; objects %d created, %d changed, %d deleted")
        :format(r.steps_exact, r.steps_inexact, r.steps_not_rehearsed, r.writes_admitted,
          r.writes_refused, r.writes_not_validated, r.created, r.changed, r.deleted),
      table.unpack(M.why_lines(e.why)) }
  end,
}

-- "Kind namespace/name" (or "Kind name") of the object an event names.
function M.object_name(e)
  local kind = e.kind or e.resource or "?"
  return kind .. " "
    .. ((e.namespace and e.namespace ~= "") and (e.namespace .. "/" .. (e.name or "?"))
    or (e.name or "?"))
end

-- The object a write is about, from its path and body: "object: ConfigMap
-- cozy-system/old" (the name a server generates: "(name generated)").
function M.write_target(e)
  local a = request.attributes(e.method, e.path, "")
  if a.unroutable or a.non_resource or a.resource == nil then return nil end
  local md = type(e.body) == "table" and type(e.body.metadata) == "table" and e.body.metadata or {}
  local name = a.name or (type(md.name) == "string" and md.name) or nil
  local ns = a.resource ~= "namespaces"
    and (a.namespace or (type(md.namespace) == "string" and md.namespace)) or nil
  local kind = e.kind or (type(e.body) == "table" and type(e.body.kind) == "string" and e.body.kind)
    or nil
  if kind == nil or kind == "Status" or kind == "DeleteOptions" then
    kind = a.resource .. ((a.group ~= nil and a.group ~= "") and ("." .. a.group) or "")
  end
  return { kind = kind, namespace = ns, name = name or "(name generated)",
    subresource = a.subresource }
end

function M.write_object(e)
  local t = M.write_target(e)
  if t == nil then return "object: none (not a resource path)" end
  return "object: " .. M.object_name(t) .. (t.subresource and (" (" .. t.subresource .. ")") or "")
end

-- The why of each inexact and not rehearsed step, gathered for the summary.
local function why_collector()
  local why = { inexact = {}, not_rehearsed = {} }
  return why, function(e)
    if e.type == "rehearsed" and not e.exact then
      why.inexact[#why.inexact + 1] = { number = e.number, name = e.name, why = e.why }
    elseif e.type == "not_rehearsed" then
      why.not_rehearsed[#why.not_rehearsed + 1] = { number = e.number, name = e.name, why = e.why }
    elseif e.type == "summary" and e.rehearsal then
      e.why = why
    end
  end
end

function M.why_lines(why)
  local out = {}
  for _, s in ipairs(why and why.inexact or {}) do
    for _, w in ipairs(s.why or {}) do
      out[#out + 1] = ("  inexact: step %d (%s): %s"):format(s.number, s.name, w)
    end
  end
  for _, s in ipairs(why and why.not_rehearsed or {}) do
    out[#out + 1] = ("  not rehearsed: step %d (%s): %s"):format(s.number, s.name, s.why)
  end
  return out
end

-- `-o json`: the plan's events gathered into one document, printed at the
-- end with the exit status: { plan, bootstrap, steps = [ { number, name,
-- kind, from, to, description, writes = [...], rehearsed, failure,
-- legacy, not_rehearsed } ], objects = [...], summary, exit }.
local function document()
  local doc = { steps = {}, objects = {} }
  local by_number, current = {}, nil
  local function step_of(number, name, kind)
    local s = by_number[number]
    if s == nil then
      s = { number = number, name = name, kind = kind, writes = {} }
      by_number[number] = s
      doc.steps[#doc.steps + 1] = s
    end
    return s
  end
  local take = {
    plan = function(e) doc.plan = e end,
    bootstrap = function(e) doc.bootstrap = e end,
    step = function(e)
      current = step_of(e.number, e.name, e.kind)
      current.from, current.to, current.description = e.from, e.to, e.description
    end,
    write = function(e)
      e.object = M.write_target(e)
      local s = e.step and by_number[e.step] or current
      if s then s.writes[#s.writes + 1] = e else
        doc.writes = doc.writes or {}
        doc.writes[#doc.writes + 1] = e
      end
    end,
    legacy = function(e) step_of(e.number, e.name, "legacy").legacy = e end,
    failure = function(e) step_of(e.number, e.name).failure = e end,
    rehearsed = function(e)
      step_of(e.number, e.name).rehearsed = { exact = e.exact, why = e.why }
    end,
    not_rehearsed = function(e) step_of(e.number, e.name, e.kind).not_rehearsed = e.why end,
    object = function(e) doc.objects[#doc.objects + 1] = e end,
    summary = function(e) doc.summary = e end,
  }
  return function(e)
    local f = take[e.type]
    if f then f(e) end
  end, function(status)
    doc.exit = status
    io.stdout:write(cozy_text.json(doc), "\n")
    io.stdout:flush()
  end
end

-- A reporter printing plan events on stdout in the run's log format (as
-- one document at the end with `-o json`), and the function that ends the
-- output once the run's exit status is known.
function M.printer(opts)
  local as_json = opts.log_format == "json"
  local _, gather_why = why_collector()
  if opts.output == "json" then
    local take, finish = document()
    return function(e)
      gather_why(e)
      take(e)
    end, finish
  end
  if opts.output == "text" then as_json = false end
  return function(e)
    gather_why(e)
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
  local printer, finish = M.printer(opts)
  local status = runner.execute(opts, "plan", printer)
  if finish then finish(status) end
  return status
end

return M
