-- A migration's declared tools: `tools = { "etcd-migrate" }` in its table,
-- run with ctx:tool(name, argv [, opts]) (docs/engine-api.md, "Tools").
--
-- Found at discovery, each on PATH by the exec plugin's lookup
-- (sys.find_command: an empty or relative PATH element is refused, as
-- client-go refuses it), so a run executes the very file discovery found;
-- a missing tool is the migration's defect: the run that reaches it is
-- refused before it starts (exit 2), `list` and `check` name it.
--
-- A call runs the tool as a legacy script runs (cozy.runner.legacy,
-- core/proc.c): an argument vector, no shell; its own process group under
-- the step's time limit, stopped with the step (SIGTERM, then SIGKILL after
-- the grace) and by the lock's bounds; a guardian (core/guardian.c) kills
-- the group and removes its kubeconfig should the runner die; stdin is
-- /dev/null; KUBECONFIG names a private kubeconfig of the engine's one
-- cluster, user and namespace (NAMESPACE too). Its stdout and stderr are log
-- lines as they come (through the log's output edge: credentials redacted).
--
-- Modes: in `run` every call runs. In `plan` and `check` only a call that
-- marks the invocation as the tool's own dry run (dry_run = true) runs: in a
-- rehearsal (plan, run --dry-run) isolated as a legacy script is (its own
-- network namespace whose one address is the rehearsal's endpoint), under
-- --server-dry-run and in check with the kubeconfig (the tool's own dry run
-- is what keeps it from writing). Any other call is refused, not run: in a
-- plan the step is "not rehearsed" (and nothing after it), in check it is a
-- read-only refusal.
local errors = require "cozy.errors"
local validate = require "cozy.validate"
local proc = require "cozy.proc"
local sys = require "cozy.sys"
local text = require "cozy.text"

local tools = {}

-- Bounds of a declaration and of a call.
tools.MAX_TOOLS = 16
tools.MAX_NAME = 64
tools.MAX_ARGS = 1024
-- captured stdout (opts.capture): more than a tool's report should print;
-- past it the capture stops (result.truncated), the log goes on
tools.CAPTURE_BYTES = 1024 * 1024
-- the longest stderr line a failure quotes
tools.QUOTE_BYTES = 300

-- A tool is named as a command: no slash (a path would bypass the lookup),
-- no shell or option syntax.
local function bad_name(name)
  return type(name) ~= "string" or #name == 0 or #name > tools.MAX_NAME
    or not name:find("^[%w][%w._+-]*$")
end

-- A tool's access to the cluster: what it does there cannot be derived from
-- the migration, so its declaration says it, as `kubectl auth can-i` words
-- a request: "VERBS RESOURCE [-n NAMESPACE]", VERBS comma-separated
-- lowercase words, RESOURCE plural (core) or plural.group:
--   tools = { ["etcd-migrate"] = { "get,list,delete etcdclusters.etcd.aenix.io",
--     "get,patch deployments.apps -n cozy-etcd-operator" } }
-- Returns the permissions it grants, or nil and why.
local function access_permissions(line)
  if type(line) ~= "string" then return nil, "a string \"VERBS RESOURCE [-n NAMESPACE]\"" end
  local verbs, resource, rest = line:match("^(%S+) +(%S+)(.*)$")
  local namespace = rest and rest:match("^ +%-n +([%w.-]+)$")
  if verbs == nil or (rest ~= "" and namespace == nil) then
    return nil, "\"VERBS RESOURCE [-n NAMESPACE]\" (\"get,list etcdclusters.etcd.aenix.io\")"
  end
  local ok, plural, group = pcall(require("cozy.recipe").resource_name, resource)
  if not ok then return nil, ("a resource name as kubectl takes it: %s"):format(resource) end
  local out = {}
  for verb in (verbs .. ","):gmatch("([^,]*),") do
    if not verb:find("^%l+$") then return nil, ("a verb is a lowercase word: %q"):format(verb) end
    out[#out + 1] = { verb = verb, group = group, resource = plural, namespace = namespace }
  end
  return out
end

-- The declared names, sorted, of either form: an array of names (a tool
-- that makes no request of its own) or name -> its access lines.
local function names_of(declared)
  local names = {}
  for k, v in pairs(declared) do names[#names + 1] = math.type(k) == "integer" and v or k end
  table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
  return names
end

-- Validates def.tools (raising through invalid(message)); discovery calls it.
-- Returns the permissions the tools' access grants (discovery adds them to
-- the migration's: the gate, `check` and `rbac` take them from there).
function tools.validate(def, invalid)
  if def.tools == nil then return {} end
  local why = validate.why("tools", def.tools, "table",
    { says = "an array of command names, or name -> its access to the cluster" })
  if why then invalid(why) end
  local n, seen, granted = 0, {}, {}
  for k, v in pairs(def.tools) do
    n = n + 1
    local name, access = v, nil
    if math.type(k) ~= "integer" then name, access = k, v end
    local where = math.type(k) == "integer" and ("tools[%d]"):format(k) or "tools." .. tostring(k)
    why = validate.why(where, name, function(x) return not bad_name(x) end,
      { says = ("a command name (letters, digits, '.', '_', '+', '-'; no '/'; at most %d bytes)")
        :format(tools.MAX_NAME) })
    if why then invalid(why) end
    if seen[name] then invalid(("%s: %s is declared twice"):format(where, name)) end
    seen[name] = true
    if access ~= nil then
      why = validate.why(where, access, "table", { says = "an array of access lines" })
      if why then invalid(why) end
      for i, line in pairs(access) do
        local perms, bad = access_permissions(line)
        if math.type(i) ~= "integer" then perms, bad = nil, "an array of access lines" end
        if perms == nil then invalid(("%s[%s]: %s"):format(where, tostring(i), bad)) end
        for _, p in ipairs(perms) do granted[#granted + 1] = p end
      end
    end
  end
  if n > tools.MAX_TOOLS then invalid(("tools: at most %d tools"):format(tools.MAX_TOOLS)) end
  return granted
end

-- Finds migration m's declared tools on PATH: m.tools = { { name =, path = }
-- or { name =, missing = why } ... }; a missing one makes m's defect (what
-- discovery.pending refuses).
function tools.resolve(m)
  local declared = m.definition and m.definition.tools
  if declared == nil then return end
  m.tools = {}
  local missing = {}
  for _, name in ipairs(names_of(declared)) do
    local path, why = sys.find_command(name)
    -- its access lines as declared (nil: it makes no request of its own)
    local access = declared[name]
    if path then
      m.tools[#m.tools + 1] = { name = name, path = path, access = access }
    else
      local relative = why and why:match("^relative: (.*)$")
      why = relative
        and ("found in PATH as %s, relative to the current directory (an empty or relative PATH "
        .. "element): not run; put its directory in PATH as an absolute path"):format(relative)
        or ("not found in PATH (%s)"):format(text.safe(os.getenv("PATH") or ""))
      m.tools[#m.tools + 1] = { name = name, missing = why, access = access }
      missing[#missing + 1] = ("%s %s"):format(name, why)
    end
  end
  if #missing > 0 then
    m.defect = ("declared tool %s: install it in the image or correct `tools`")
      :format(table.concat(missing, "; "))
  end
end

-- "name (path)" or "name (missing)", then what it may do on the cluster
-- ("; may get,list etcdclusters.etcd.aenix.io, ..."), for list and check.
function tools.describe(m)
  local out = {}
  for _, t in ipairs(m.tools or {}) do
    local line = t.path and ("%s (%s)"):format(t.name, t.path) or ("%s (missing)"):format(t.name)
    if #(t.access or {}) > 0 then line = line .. "; may " .. table.concat(t.access, ", ") end
    out[#out + 1] = line
  end
  return out
end

local call_keys = { dry_run = true, capture = true, allow_failure = true,
  kubeconfig_flag = "string" }
local WHERE = "ctx:tool(name, argv [, opts])"

local function check_call(m, name, argv, o)
  validate.args(3, WHERE, { { "name", name, "string" }, { "argv", argv, "table", { optional = true,
    says = "an array of strings" } }, { "opts", o, "table", true } })
  local found
  for _, t in ipairs(m.tools or {}) do
    if t.name == name then found = t end
  end
  if found == nil then
    error(("ctx.tool: %s is not declared in the migration's tools"):format(text.safe(name)), 3)
  end
  argv = argv or {}
  local n = 0
  for _ in next, argv do n = n + 1 end
  if n > tools.MAX_ARGS then error(("ctx.tool: at most %d arguments"):format(tools.MAX_ARGS), 3) end
  local args = { found.path }
  for i = 1, n do
    local a = rawget(argv, i)
    if math.type(a) == "integer" or math.type(a) == "float" then a = tostring(a) end
    -- a NUL would end the argument where the kernel reads it: refused, not cut
    validate.arg(3, "ctx:tool", ("argv[%d]"):format(i), a,
      function(v) return type(v) == "string" and not v:find("\0", 1, true) end,
      { says = "a string without NUL bytes (argv is an array)" })
    args[#args + 1] = a
  end
  local opts = {}
  for k, v in next, o or {} do
    if not call_keys[k] then
      error(("ctx.tool: unknown option %s (dry_run, capture, allow_failure, kubeconfig_flag)")
        :format(text.safe(tostring(k))), 3)
    end
    if call_keys[k] == "string" then
      -- an option of the tool: "--kubeconfig" or "--kubeconfig=" ("-k" ...)
      validate.arg(3, "ctx:tool", "option " .. k, v,
        function(x) return type(x) == "string" and x:find("^%-%-?[%w][%w-]*=?$") ~= nil end,
        { says = "a command-line option, as \"--kubeconfig\" or \"--kubeconfig=\"" })
    else
      validate.arg(3, "ctx:tool", "option " .. k, v, "boolean")
    end
    opts[k] = v
  end
  return found, args, opts
end

-- Why a tool's run failed, raised: stopped by the runner (the kinds a
-- legacy script's stop has) or its own non-zero exit.
local function failure(name, how, code, stopped, limit, last_stderr)
  local ended = ("%s %d"):format(how == "exit" and "exited with status" or "was killed by signal",
    code)
  if last_stderr then
    ended = ("%s, its last stderr line: %q")
      :format(ended, text.safe_prefix(last_stderr, tools.QUOTE_BYTES, "..."))
  end
  if stopped == "lock" then
    errors.raise("lost",
      ("tool %s stopped: the lock may no longer be ours (not renewed in time): its process "
      .. "group was stopped (it %s)"):format(name, ended), { exit = code })
  elseif stopped == "deadline" then
    errors.raise("timeout",
      ("tool %s ran past the step's time limit of %ss: its process group was stopped "
      .. "(it %s)"):format(name, tostring(limit), ended), { exit = code })
  elseif stopped == "signal" then
    errors.raise("interrupted", ("tool %s stopped by signal %s: it %s")
      :format(name, tostring(proc.signalled() or "?"), ended), { exit = code })
  end
  errors.raise("failed", ("tool %s %s"):format(name, ended), { exit = code })
end

-- The ctx.tool of a step. opts:
--   m          the migration (m.tools from tools.resolve)
--   mode       "run" | "plan" | "check"
--   log        the step's logger
--   namespace  the engine's namespace
--   kubeconfig, context   the engine's (nil: found as the engine finds them)
--   lock       the lease.Holder the step runs under, or nil
--   rehearse   a rehearsal's client (plan, run --dry-run), or nil
--   running    the step's { tool = }: the name of the tool under way
--   stop       the step's on_stop (step.stopper), raised when a stop ended the tool
--   deadline   function() -> the sys.monotime() by which the tool must end,
--              and the limit in seconds (for the message)
--   unrehearsed  function(why): a plan's call that was refused or could not
--              be isolated (the step is not rehearsed)
-- Returns function(name, argv, opts) -> { status =, signal =, stdout =, truncated = }.
function tools.caller(opts)
  local m, log = opts.m, opts.log
  return function(name, argv, call_opts)
    local _, args, o = check_call(m, name, argv, call_opts)
    if opts.mode ~= "run" and not o.dry_run then
      local why = ("tool %s run without dry-run marking"):format(name)
      if opts.mode == "check" then
        errors.raise("readonly",
          ("%s: not run in check, which writes nothing (mark the tool's own dry run "
          .. "with dry_run = true)"):format(why))
      end
      opts.unrehearsed(why)
      errors.raise("failed", ("not rehearsed: %s: not run"):format(why), { not_rehearsed = why })
    end
    local legacy = require "cozy.runner.legacy"
    local rehearse = opts.mode == "plan" and opts.rehearse or nil
    local ep <close> = rehearse and require("cozy.endpoint").new() or nil
    local kubeconfig <close> = legacy.private_kubeconfig { kubeconfig = opts.kubeconfig,
      context = opts.context, namespace = opts.namespace, endpoint = ep }
    local unset = kubeconfig.source ~= "in-cluster"
      and { KUBERNETES_SERVICE_HOST = true, KUBERNETES_SERVICE_PORT = true } or nil
    if ep then unset = legacy.REHEARSAL_UNSET end
    local env = legacy.environment({ KUBECONFIG = kubeconfig.path, NAMESPACE = opts.namespace },
      unset)
    -- a tool that reads only a kubeconfig file named on its command line
    -- (etcd-migrate's --kubeconfig): the same private kubeconfig, appended to
    -- argv as "--flag PATH" or, for a flag ending in "=", "--flag=PATH"
    if o.kubeconfig_flag then
      local flag = o.kubeconfig_flag
      if flag:sub(-1) == "=" then
        args[#args + 1] = flag .. kubeconfig.path
      else
        args[#args + 1], args[#args + 2] = flag, kubeconfig.path
      end
    end
    local tlog = log:with { tool = name }
    tlog:info("running tool", { argv = table.concat(args, " ", 2), dry_run = o.dry_run or nil,
      isolated = ep and true or nil })
    -- the step's stop names the tool while it runs (step.stopper)
    local _ <close> = setmetatable({}, { __close = function() opts.running.tool = nil end })
    opts.running.tool = name
    local captured, bytes, truncated, last_stderr = {}, 0, false, nil
    local deadline, limit = opts.deadline()
    local t0 = sys.monotime()
    local how, code, stopped = proc.spawn(args, env, function(stream, line)
      if stream == "stderr" then
        tlog:warn(line, { stream = stream })
        if line:find("%S") then last_stderr = line end
        return
      end
      tlog:info(line, { stream = stream })
      if o.capture and not truncated then
        if bytes + #line + 1 > tools.CAPTURE_BYTES then
          truncated = true
        else
          captured[#captured + 1] = line
          bytes = bytes + #line + 1
        end
      end
    end, { deadline = deadline, remove = { kubeconfig.path, kubeconfig.dir },
      lock = opts.lock and function() return opts.lock:child_bounds() end,
      endpoint = ep and { server = ep, port = legacy.ENDPOINT_PORT,
        serve = require("cozy.kube.overlay_endpoint").server(rehearse, tlog) } })
    if how == "refused" then
      local why = ("tool %s could not be isolated: %s"):format(name, code)
      opts.unrehearsed(why)
      errors.raise("failed", ("not rehearsed: %s; it was not run")
        :format(why), { not_rehearsed = why })
    end
    tlog:info("tool ended",
      { status = how == "exit" and code or nil, signal = how == "signal" and code or nil,
        seconds = ("%.2f"):format(sys.monotime() - t0) })
    if truncated then
      tlog:warn(("tool stdout past %d bytes: the capture stops there (result.truncated)")
        :format(tools.CAPTURE_BYTES))
    end
    -- stopped with the step: raised as the step's watch raises it (naming
    -- the tool), whether or not its hook fired first
    if (stopped == "signal" or stopped == "deadline") and opts.stop then
      local reason, detail = proc.pending_stop()
      if reason then opts.stop(reason, detail) end
    end
    if stopped or how ~= "exit" or (code ~= 0 and not o.allow_failure) then
      failure(name, how, code, stopped, limit, last_stderr)
    end
    return { status = code,
      stdout = o.capture and (#captured > 0 and table.concat(captured, "\n") .. "\n" or "")
      or nil, truncated = o.capture and truncated or nil }
  end
end

return tools
