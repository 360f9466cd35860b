-- `cozy-migrate check [--migration N] [--output text|json]`: read-only
-- preflight. The API answers; this runner may do what the run needs (its
-- own ConfigMap and Lease, plus each pending migration's declared
-- `permissions`), asked with SelfSubjectAccessReview; each pending
-- migration's check(ctx) and its findings (info, warn, block).
-- Exit 0 when nothing blocks, 1 when a finding blocks, 2 for usage or an
-- invalid set. check(ctx) runs through the step executor in mode "check":
-- a write raises (the check fails with a blocking finding) and is never sent.
local cozy_text = require "cozy.text"
local discovery = require "cozy.runner.discovery"
local errors = require "cozy.errors"
local files = require "cozy.runner.files"
local json = require "cozy.json"
local parameters = require "cozy.runner.parameters"
local rbac = require "cozy.rbac"
local runner = require "cozy.runner"
local stamp = require "cozy.runner.stamp"
local step = require "cozy.runner.step"
local termination = require "cozy.runner.termination"
local tools = require "cozy.runner.tools"

local as_array = json.array or function(t) return t end

local M = {}

-- About this runner (SelfSubjectAccessReview), or with --service-account
-- NAME about that account of the namespace (SubjectAccessReview: the
-- read-only preflight Job reviews the migration Job's account).
local function access_review(client, p, namespace, subject)
  local plural, kind = "selfsubjectaccessreviews", "SelfSubjectAccessReview"
  if subject then plural, kind = "subjectaccessreviews", "SubjectAccessReview" end
  local reviews = client:resource("authorization.k8s.io/v1", plural, { namespaced = false })
  local spec = { resourceAttributes = { namespace = namespace, verb = p.verb, group = p.group or "",
    resource = p.resource, subresource = p.subresource, name = p.name } }
  if subject then
    spec.user = ("system:serviceaccount:%s:%s"):format(subject.namespace, subject.name)
    spec.groups = { "system:serviceaccounts", "system:serviceaccounts:" .. subject.namespace,
      "system:authenticated" }
  end
  local res = reviews:create{ apiVersion = "authorization.k8s.io/v1", kind = kind, metadata = {},
    spec = spec }
  return res.status and res.status.allowed == true, res.status and res.status.reason
end

local function perm_text(p)
  return ("%s %s%s%s"):format(p.verb, p.resource, p.subresource and ("/" .. p.subresource) or "",
    (p.group and p.group ~= "") and ("." .. p.group) or "")
end

-- Which migrations a check looks at: --migration N, else the pending ones.
local function checked_migrations(c, set, cm, target)
  local opts = c.opts
  if opts.migration then
    local m = set.by_number[opts.migration]
    if not m then
      errors.raise("usage",
        ("no migration %d (have: %s)"):format(opts.migration, discovery.numbers(set)))
    end
    return { m }
  elseif cm == nil then
    c.finding("engine", "info",
      ("no %s ConfigMap: a fresh install, run would stamp %d and run nothing")
      :format(stamp.CONFIGMAP, target))
    return {}
  end
  local pok, pending = pcall(discovery.pending, set, c.report.current, target)
  if not pok then
    c.finding("engine", "block", errors.text(pending))
    return {}
  end
  return pending
end

-- Permissions: what `run` needs, as `cozy-migrate rbac` grants it (objects
-- named, the Lease's takeover included); reviewing ourselves, check()
-- needs what only it reads too. Each asked of the server (an access review).
local function review_permissions(c, checked)
  local opts, namespace = c.opts, c.namespace
  local wanted = {}
  for _, p in ipairs(rbac.engine_permissions(false)) do
    wanted[#wanted + 1] = { p = p, ns = namespace, source = "engine" }
  end
  local mode = opts.service_account and "run" or "check"
  for _, m in ipairs(checked) do
    for _, p in ipairs(discovery.permissions_for(m.definition, mode)) do
      wanted[#wanted + 1] = { p = p, ns = p.namespace, source = m.name }
    end
  end
  for _, w in ipairs(wanted) do
    local aok, allowed, reason = pcall(access_review, c.client, w.p, w.ns,
      opts.service_account and { namespace = namespace, name = opts.service_account } or nil)
    local entry = { migration = w.source, verb = w.p.verb, group = w.p.group or "",
      resource = w.p.resource, namespace = w.ns, allowed = aok and allowed or false }
    c.report.permissions[#c.report.permissions + 1] = entry
    if not aok then
      c.finding(w.source, "warn", ("could not ask whether %s is allowed: %s"):format(perm_text(w.p),
        errors.text(allowed)))
    elseif not allowed and w.p.best_effort then
      c.finding(w.source, "warn", ("not allowed: %s in namespace %s%s: the run goes on without it")
        :format(perm_text(w.p), tostring(w.ns),
          reason and reason ~= "" and (" (" .. reason .. ")") or ""))
    elseif not allowed then
      c.finding(w.source, "block", ("not allowed: %s%s%s"):format(perm_text(w.p),
        w.ns and (" in namespace " .. w.ns) or " in all namespaces",
        reason and reason ~= "" and (" (" .. reason .. ")") or ""))
    end
  end
end

-- A Lua migration's declared parameters (their values, from this
-- environment) and files, in the report; a value its declaration refuses is
-- a blocking finding, as the run would refuse it (exit 2).
local function review_inputs(c, m)
  local ok, values, sources = pcall(parameters.resolve, m)
  local roots
  if ok then ok, roots = pcall(files.resolve, m, values) end
  if not ok then
    c.finding(m.name, "block", errors.text(values or roots))
    values, sources, roots = nil, nil, nil
  end
  local declared = parameters.describe(m, values, sources)
  local paths = files.describe(m, roots)
  if #declared > 0 or #paths > 0 then
    c.report.inputs[#c.report.inputs + 1] = { migration = m.name, parameters = as_array(declared),
      files = as_array(paths) }
  end
  return ok
end

-- Each migration's check(ctx), through the step executor: read-only, a
-- write raises and nothing is sent.
local function run_checks(c, checked)
  for _, m in ipairs(checked) do
    if m.kind == "legacy" then
      c.finding(m.name, "info", "legacy script: no check available")
    elseif not review_inputs(c, m) then
      c.finding(m.name, "info", "check() not run: its parameters are refused")
    else
      -- its declared tools, as discovery found them on PATH
      if m.tools then
        c.finding(m.name, "info", "tools: " .. table.concat(tools.describe(m), ", "))
      end
      local cok, err, result = step.execute(m,
        { client = c.client, log = c.log, namespace = c.namespace, mode = "check",
          timeout = c.opts.step_timeout,
        tools = { kubeconfig = c.opts.kubeconfig, context = c.opts.context } })
      for _, f in ipairs(result.findings) do c.finding(m.name, f.severity, f.message, f.fields) end
      if not result.defined then
        c.finding(m.name, "info", "no check() defined")
      elseif not cok then
        c.finding(m.name, "block", "check() failed: " .. errors.text(err))
      end
    end
  end
end

function M.collect(opts, log)
  local set = runner.discover(opts)
  local namespace = runner.namespace(opts)
  local target = runner.target(opts, set)
  local client = runner.connect(opts, log)
  local report = { namespace = namespace, target = target, findings = {}, permissions = {},
    inputs = {} }
  local c = { opts = opts, log = log, client = client, namespace = namespace, report = report }
  function c.finding(source, severity, message, fields)
    report.findings[#report.findings + 1] = { migration = source, severity = severity,
      message = message, fields = fields }
  end

  -- reachable? asked with few retries: a preflight should answer quickly
  local probe = runner.connect(opts, log, { retry = "probe" })
  local ok, version = pcall(probe.get_path, probe, "/version")
  report.reachable = ok
  if not ok then
    c.finding("engine", "block", "API server not reachable: " .. errors.text(version))
    return report
  end
  report.server_version = type(version) == "table" and version.gitVersion or nil

  local cm = stamp.read(client:resource("v1", "configmaps", { kind = "ConfigMap" }), namespace)
  report.current = cm and stamp.version_of(cm) or json.null
  local checked = checked_migrations(c, set, cm, target)
  review_permissions(c, checked)
  run_checks(c, checked)
  return report
end

-- "N finding(s): B block, W warn, I info"
local function counted(findings)
  local n = { info = 0, warn = 0, block = 0 }
  for _, f in ipairs(findings) do n[f.severity] = n[f.severity] + 1 end
  return ("%d finding(s): %d block, %d warn, %d info"):format(#findings, n.block, n.warn, n.info)
end

local function text(r)
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add("namespace: %s  version: %s  target: %d  api: %s", r.namespace,
    r.current == json.null and "none" or tostring(r.current), r.target,
    r.reachable and ("reachable" .. (r.server_version and (" (" .. r.server_version .. ")") or ""))
      or "UNREACHABLE")
  for _, p in ipairs(r.permissions) do
    add("  %-7s %s %s%s%s", p.allowed and "allowed" or "DENIED", p.verb, p.resource,
      p.group ~= "" and ("." .. p.group) or "",
      p.namespace and (" in " .. p.namespace) or " (all namespaces)")
  end
  for _, i in ipairs(r.inputs or {}) do
    for _, p in ipairs(i.parameters) do
      add("  %s: parameter %s", i.migration, parameters.text(p))
    end
    for _, f in ipairs(i.files) do
      add("  %s: file %s: %s%s (read-only)", i.migration, f.name, f.declared,
        f.path and f.path ~= f.declared and (" = " .. f.path) or "")
    end
  end
  for _, f in ipairs(r.findings) do
    local fields = ""
    if f.fields then
      local parts = {}
      for k, v in pairs(f.fields) do
        parts[#parts + 1] = tostring(k) .. "="
          .. (type(v) == "table" and cozy_text.json(v) or tostring(v))
      end
      table.sort(parts)
      fields = "  " .. table.concat(parts, " ")
    end
    add("[%s] %s: %s%s", f.severity:upper(), f.migration, f.message, fields)
  end
  out[#out + 1] = counted(r.findings)
  return out
end

local function first_block(findings)
  for _, f in ipairs(findings) do
    if f.severity == "block" then return f end
  end
  return nil
end

-- The pod's termination message of a check (the preflight Job): passed or
-- blocked, with the first blocking finding, and the counts.
function M.line(r)
  local first = first_block(r.findings)
  return ("check %s; %s"):format(first and ("blocked: " .. first.migration .. ": " .. first.message)
    or "passed", counted(r.findings))
end

function M.run(opts)
  local line
  return runner.protect(opts, function(log)
    local r = M.collect(opts, log)
    r.blocked = first_block(r.findings) ~= nil
    line = M.line(r)
    r.findings = as_array(r.findings)
    r.permissions = as_array(r.permissions)
    r.inputs = as_array(r.inputs)
    if opts.output == "json" then
      io.stdout:write(cozy_text.json(r), "\n")
    else
      io.stdout:write(cozy_text.lines(text(r)))
    end
    return r.blocked and 1 or 0
  end, function(status, err) termination.finish(status, err, line) end)
end

return M
