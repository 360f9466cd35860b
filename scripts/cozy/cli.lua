-- The command line: parses the contract of README.md and --help, and dispatches to one
-- module per command (cozy.cmd.<name>), each returning an exit status.
local text = require "cozy.text"
local errors = require "cozy.errors"
local sys = require "cozy.sys"

local cli = {}

-- Exit statuses (docs/operations.md): 0 done, 1 a migration or API call failed,
-- 2 usage/configuration/invalid migration set, 3 lock not taken within --lock-timeout.
cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_LOCKED = 0, 1, 2, 3

cli.usage = [==[
Usage: cozy-migrate COMMAND [OPTIONS]

Commands:
  run     [--target N] [--dry-run] [--server-dry-run]   apply pending migrations
  plan    [--target N] [--server-dry-run]               what run would change, nothing written
  status  [--output text|json]                          version, target, pending, lock, history
  check   [--migration N] [--output text|json]          read-only preflight and each pending check()
          [--service-account NAME]                      review NAME's permissions (SubjectAccessReview), not ours
  list    [--output text|json]                          migrations known to this build
  new NAME                                              scaffold migrations/NN-NAME.lua and its spec
  rbac    [--all] [--target N] [--preflight] [--output yaml|json]
                                                        the least-privilege RBAC of the pending range
  lua [SCRIPT [ARGS...]] | lua -e CODE                  Lua 5.4 interpreter with the engine's modules

Common options:
  --kubeconfig PATH         kubeconfig file (else $KUBECONFIG, in-cluster, ~/.kube/config)
  --context NAME            kubeconfig context (else current-context)
  --namespace NS            namespace of the version ConfigMap and the lock
                            (else $NAMESPACE, in-cluster the service account's namespace, cozy-system)
  --migrations DIR          add DIR's migrations (legacy scripts NN, NN-name) to the built-in ones
                            (else $COZY_MIGRATE_MIGRATIONS, else /migrations when it exists)
  --no-builtin              leave the built-in migrations out (DIR's set alone)
  --log-format text|json    log line format (default text)
  --request-timeout SECONDS per-request timeout (default 30)
  --lock-timeout SECONDS    how long to wait for another runner's lock (default 300)
  --concurrency N           changes of a batch (update_each) in flight at once (run, plan; 1-64, default 8)
  --step-timeout SECONDS    time limit of each migration's run or check, or legacy script (run,
                            plan, check; default: the migration's `timeout`, else 1800)
  --qps N --burst N         client-side rate limit on API requests (default 1000 per second, bursts of 2000)
  -v                        more detail (repeatable)
  --version                 print the version and exit
  --help                    print this help and exit

Environment:
  NAMESPACE                   default for --namespace
  TARGET_VERSION              default for --target (else the highest migration + 1)
  CURRENT_VERSION             only cross-checked against the ConfigMap; a mismatch is logged
  KUBECONFIG                  kubeconfig files, as kubectl reads them
  POD_NAME                    the lock holder's identity (else host-pid)
  COZY_MIGRATE_LEASE_SECONDS  lock lease duration (default 30, renewed every third)
  COZY_MIGRATE_PAGE_LIMIT     objects per list page (default 500)
  COZY_MIGRATE_MIGRATIONS     default for --migrations (empty: no directory, not even /migrations)
  KUBERNETES_SERVICE_HOST/PORT  in-cluster API server (with the service account's token, ca.crt, namespace)
  COZY_MIGRATE_SERVICEACCOUNT_DIR  the service account's directory (tests; else the pod's)
  HTTPS_PROXY, HTTP_PROXY, NO_PROXY  proxy for the API server, as kubectl uses them

Exit status: 0 done or nothing to do; 1 a migration or an API call failed,
a run was stopped (SIGTERM, lost lock) or check found a blocking finding;
2 usage, configuration or an invalid migration set; 3 the lock could not be
taken within --lock-timeout (held by another runner, or refused by the server).
See docs/operations.md.
]==]

local commands = {
  run = true, plan = true, status = true, check = true, list = true, new = true, rbac = true,
}

-- option name -> kind: "flag", "count", or a value parser. Numbers are plain
-- decimal (no hex, no exponent, no sign): what an operator types.
local function decimal(v)
  if type(v) ~= "string" or not (v:match("^%d+$") or v:match("^%d+%.%d+$") or v:match("^%.%d+$")) then
    return nil
  end
  return tonumber(v)
end

local function number_value(name)
  return function(v)
    local n = decimal(v)
    if n == nil then
      errors.raise("usage", ("%s expects a non-negative number, in plain decimal, got %q"):format(name, v))
    end
    return n
  end
end

local function integer_value(name)
  return function(v)
    local n = v:match("^%d+$") and math.tointeger(tonumber(v))
    if not n then
      errors.raise("usage", ("%s expects a non-negative integer, in plain decimal, got %q"):format(name, v))
    end
    return n
  end
end

-- Rates: zero would switch the client's limiter off, which is for tests only.
local function positive_value(name)
  return function(v)
    local n = decimal(v)
    if n == nil or n <= 0 or n == math.huge then
      errors.raise("usage", ("%s expects a positive number, in plain decimal, got %q"):format(name, v))
    end
    return n
  end
end

local function one_of(name, ...)
  local allowed = { ... }
  return function(v)
    for _, a in ipairs(allowed) do
      if a == v then return v end
    end
    errors.raise("usage", ("%s must be one of %s, got %q"):format(name, table.concat(allowed, "|"), v))
  end
end

local function string_value(v) return v end

local options = {
  ["--kubeconfig"] = string_value,
  ["--context"] = string_value,
  ["--namespace"] = string_value,
  ["--migrations"] = string_value,
  ["--log-format"] = one_of("--log-format", "text", "json"),
  ["--request-timeout"] = number_value("--request-timeout"),
  ["--lock-timeout"] = number_value("--lock-timeout"),
  ["--step-timeout"] = positive_value("--step-timeout"),
  ["--concurrency"] = function(v)
    local n = v:match("^%d+$") and math.tointeger(tonumber(v))
    if not n or n < 1 or n > 64 then
      errors.raise("usage", ("--concurrency expects an integer from 1 to 64, in plain decimal, got %q"):format(v))
    end
    return n
  end,
  ["--qps"] = positive_value("--qps"),
  ["--burst"] = positive_value("--burst"),
  ["--target"] = integer_value("--target"),
  ["--migration"] = integer_value("--migration"),
  ["--output"] = one_of("--output", "text", "json"),
  ["--dry-run"] = "flag",
  ["--server-dry-run"] = "flag",
  ["--service-account"] = string_value,
  ["--no-builtin"] = "flag",
  ["--all"] = "flag",
  ["--preflight"] = "flag",
  ["-v"] = "count",
}

-- An option whose values differ for one command.
local command_values = {
  rbac = { ["--output"] = one_of("--output", "yaml", "json") },
}

-- Which command-specific options each command accepts (common ones always).
local command_options = {
  run = { ["--target"] = true, ["--dry-run"] = true, ["--server-dry-run"] = true, ["--step-timeout"] = true,
    ["--concurrency"] = true },
  plan = { ["--target"] = true, ["--server-dry-run"] = true, ["--step-timeout"] = true, ["--concurrency"] = true },
  status = { ["--output"] = true, ["--target"] = true },
  check = { ["--migration"] = true, ["--output"] = true, ["--target"] = true, ["--step-timeout"] = true,
    ["--service-account"] = true },
  list = { ["--output"] = true },
  new = {},
  rbac = { ["--all"] = true, ["--target"] = true, ["--preflight"] = true, ["--output"] = true },
}
local common = {
  ["--kubeconfig"] = true, ["--context"] = true, ["--namespace"] = true,
  ["--migrations"] = true, ["--no-builtin"] = true, ["--log-format"] = true, ["--request-timeout"] = true,
  ["--lock-timeout"] = true, ["--qps"] = true, ["--burst"] = true, ["-v"] = true,
}

local function key(opt)
  return (opt:gsub("^%-+", ""):gsub("%-", "_"))
end

-- Parses argv (1-based, without the program name). Returns command, opts, args;
-- raises a cozy.errors error of kind "usage" on misuse.
function cli.parse(argv)
  local command = argv[1]
  if command == nil then errors.raise("usage", "no command given") end
  if not commands[command] then
    errors.raise("usage", ("unknown command %q"):format(command))
  end
  local opts, args = { v = 0 }, {}
  local i = 2
  while i <= #argv do
    local a = argv[i]
    local name, inline = a:match("^(%-%-[%w-]+)=(.*)$")
    name = name or a
    local kind = (command_values[command] or {})[name] or options[name]
    if a == "--" then
      for j = i + 1, #argv do args[#args + 1] = argv[j] end
      break
    elseif kind == nil then
      if a:sub(1, 1) == "-" and a ~= "-" then
        errors.raise("usage", ("unknown option %q"):format(a))
      end
      args[#args + 1] = a
    else
      if not (common[name] or command_options[command][name]) then
        errors.raise("usage", ("option %s does not apply to '%s'"):format(name, command))
      end
      if kind == "flag" then
        if inline then errors.raise("usage", ("option %s takes no value"):format(name)) end
        opts[key(name)] = true
      elseif kind == "count" then
        opts.v = opts.v + 1
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = argv[i]
          if v == nil then errors.raise("usage", ("option %s needs a value"):format(name)) end
        end
        opts[key(name)] = kind(v)
      end
    end
    i = i + 1
  end
  -- only `new` takes an argument (its NAME); anything else is a mistake
  local takes = command == "new" and 1 or 0
  if #args > takes then
    errors.raise("usage", ("unexpected argument %q for '%s'"):format(args[takes + 1], command))
  end
  return command, opts, args
end

-- Entry point from core/main.c: argv[0] is the program name.
function cli.main(argv)
  local first = argv[1]
  if first == "--version" then
    io.stdout:write("cozy-migrate ", sys.version, " (", _VERSION, ")\n")
    return cli.EXIT_OK
  elseif first == "--help" or first == "-h" or first == "help" then
    io.stdout:write(cli.usage)
    return cli.EXIT_OK
  elseif first == "lua" then
    return require("cozy.cmd.lua").run(argv)
  end
  local rest = table.move(argv, 1, #argv, 1, {})
  local ok, command, opts, args = pcall(cli.parse, rest)
  if not ok then
    local err = command
    if errors.is(err, "usage") then
      io.stderr:write("cozy-migrate: ", text.safe(err.message), "\n", "Try 'cozy-migrate --help'.\n")
      return cli.EXIT_USAGE
    end
    error(err, 0)
  end
  -- a collector cycle starts once the heap has grown by half past what the
  -- last one kept (Lua's default waits until it doubles): a Job's memory limit
  -- is sized for what a migration holds. At 20,000 VMs migration 59 peaks at
  -- 42.5 MiB with it; 120 would save 6 MiB more for 40% more collector work
  -- (bench/README.md)
  collectgarbage("incremental", 150)
  local found, impl = pcall(require, "cozy.cmd." .. command)
  if not found then
    if tostring(impl):find("module 'cozy.cmd." .. command .. "' not found", 1, true) then
      io.stderr:write("cozy-migrate: command '", command, "' is not available in this build\n")
      return cli.EXIT_USAGE
    end
    error(impl, 0)
  end
  return impl.run(opts, args)
end

return cli
