-- The command line: parses the contract of README.md and --help, and dispatches to one
-- module per command (cozy.cmd.<name>), each returning an exit status.
--
-- Hand-written rather than Debian's lua-argparse: the conventions below are
-- kubectl's (pflag/cobra: options before or after the command, `-n ns`,
-- `-nns`, `-n=ns`, `-v 6`/`--v=6`, `COMMAND --help`, `help COMMAND`, Go
-- durations), and argparse has no options before a subcommand that are
-- also accepted after it, no pflag-style `-n=ns`, and its own error and
-- help formats; it would also be one more runtime dependency for a binary
-- that embeds all its Lua (the image carries no Lua packages). What it
-- would give, generated help, comes from the tables below instead.
local text = require "cozy.text"
local errors = require "cozy.errors"
local sys = require "cozy.sys"

local cli = {}

-- Exit statuses (docs/operations.md): 0 done, 1 a migration or API call failed,
-- 2 usage/configuration/invalid migration set, 3 lock not taken within --lock-timeout.
cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_LOCKED = 0, 1, 2, 3

-- kubectl's -v levels that mean something here (docs/operations.md, "Verbosity"):
-- 1-5 debug lines; 6 and up one line per API request (method, path, status,
-- duration); 8 and up its bodies too, Secret data redacted, cut at 1 KiB; 9 whole.
-- A bare -v (no level; kubectl has none) keeps its old meaning, debug: level 4.
cli.V_DEBUG, cli.V_REQUESTS, cli.V_BODIES, cli.V_WHOLE_BODIES = 4, 6, 8, 9

-- The commands, in --help's order: synopsis (after the command's name) and what it does.
local command_list = {
  { "run", "[--target N] [--[server-]dry-run] [--plan FILE]", "apply pending migrations" },
  { "plan", "[--target N] [--save FILE] [-o text|json]",
    "rehearse run over the live cluster, nothing written" },
  { "status", "[-o text|json]", "version, target, pending, lock, last failure, history" },
  { "check", "[--migration N] [-o text|json]", "read-only preflight and each pending check()" },
  { "list", "[-o text|json]", "migrations known to this build" },
  { "new", "[--number NN] [NN-]NAME", "scaffold migrations/NN-NAME.lua and its spec" },
  { "rbac", "[--all] [--target N] [--preflight] [-o yaml|json]",
    "the least-privilege RBAC of the pending range" },
  { "stamp", "N --reason TEXT [--force] [--dry-run]",
    "set the version to N by hand (baseline, manual repair),\n"
    .. "under the lock, recorded in the history with who and why" },
  { "lua", "[SCRIPT [ARGS...]] | lua -e CODE", "Lua 5.4 interpreter with the engine's modules" },
  { "help", "[COMMAND]", "this help, or COMMAND's" },
}
local commands = {}
for _, c in ipairs(command_list) do commands[c[1]] = { synopsis = c[2], summary = c[3] } end

-- Every option, in --help's order: name, shorthand, metavar, description.
local option_list = {
  { "--kubeconfig", nil, "PATH", "kubeconfig file (else $KUBECONFIG, ~/.kube/config, in-cluster)" },
  { "--context", nil, "NAME", "kubeconfig context (else current-context)" },
  { "--namespace", "-n", "NS", "namespace of the version ConfigMap and the lock\n"
    .. "(else $NAMESPACE, the context's namespace (in-cluster the service "
    .. "account's), cozy-system)" },
  { "--migrations", nil, "DIR",
    "add DIR's migrations (legacy scripts NN, NN-name) to the built-in ones\n"
    .. "(else $COZY_MIGRATE_MIGRATIONS, else /migrations when it exists)" },
  { "--no-builtin", nil, nil, "leave the built-in migrations out (DIR's set alone)" },
  { "--log-format", nil, "text|json", "log line format (default text)" },
  { "--request-timeout", nil, "DURATION", "per-request timeout (default 30s)" },
  { "--lock-timeout", nil, "DURATION", "how long to wait for another runner's lock (default 5m)" },
  { "--qps", nil, "N", "client-side rate limit on API requests (default 1000 per second)" },
  { "--burst", nil, "N", "bursts above --qps (default 2000)" },
  { "--v", "-v", "LEVEL", "log detail, kubectl's levels: 1-5 debug lines; 6 each API request\n"
    .. "(method, path, status, duration); 8 bodies too (Secret data redacted,\n"
    .. "cut at 1 KiB), 9 whole; -v alone: 4 (debug)" },
  { "--help", "-h", nil, "print the help (of COMMAND, after it) and exit" },
  { "--version", nil, nil, "print the version and exit" },
  -- command options
  { "--target", nil, "N", "the version to reach (else $TARGET_VERSION, else highest + 1)" },
  { "--dry-run", nil, nil, "client dry run: reads sent, writes printed, not sent" },
  { "--server-dry-run", nil, nil,
    "no rehearsal: each step against the cluster as it is, writes sent with dryRun=All" },
  { "--save", nil, "FILE", "save the rehearsal (what it read, what it wrote) for run --plan" },
  { "--plan", nil, "FILE", "run only as FILE planned: refuse if what it read changed, stop\n"
    .. "before a write it does not hold" },
  { "--concurrency", nil, "N", "changes of a batch in flight at once (1-64, default 8)" },
  { "--step-timeout", nil, "DURATION",
    "time limit of each step's run or check, legacy scripts too\n"
    .. "(default: the migration's `timeout`, else 30m)" },
  { "--strict-stamp", nil, nil, "fail the run when a step leaves the version unstamped (a legacy\n"
    .. "script exiting 0 without stamping, ctx.leave_version); default: WARN,\n"
    .. "record it and go on to the next step, as run-migrations.sh does" },
  { "--migration", nil, "N", "check only migration N" },
  { "--service-account", nil, "NAME", "review NAME's permissions (SubjectAccessReview), not ours" },
  { "--output", "-o", "FORMAT", "text|json (rbac: yaml|json)" },
  { "--all", nil, nil, "every known migration's RBAC (no cluster needed)" },
  { "--preflight", nil, nil, "the check Job's read-only variant" },
  { "--reason", nil, "TEXT", "why the version is set by hand (kept in the history record)" },
  { "--force", nil, nil, "let stamp move the version down" },
  { "--number", nil, "NN",
    "the new migration's number (as NN-NAME gives it; default: the next free)" },
}
local option_help, shorthands = {}, {}
for _, o in ipairs(option_list) do
  option_help[o[1]] = o
  if o[2] then shorthands[o[2]:sub(2)] = o[1] end
end

-- option name -> kind: "flag", "verbosity", or a value parser. Numbers are plain
-- decimal (no hex, no exponent, no sign): what an operator types.
local function decimal(v)
  if type(v) ~= "string"
    or not (v:match("^%d+$") or v:match("^%d+%.%d+$") or v:match("^%.%d+$")) then
    return nil
  end
  return tonumber(v)
end

local function integer_value(name)
  return function(v)
    local n = v:match("^%d+$") and math.tointeger(tonumber(v))
    if not n then
      errors.raise("usage", ("%s expects a non-negative integer, in plain decimal, got %q")
        :format(name, v))
    end
    return n
  end
end

-- Rates: zero would switch the client's limiter off, which is for tests only.
local function positive_value(name)
  return function(v)
    local n = decimal(v)
    if n == nil or n <= 0 or n == math.huge then
      errors.raise("usage", ("%s expects a positive number, in plain decimal, got %q")
        :format(name, v))
    end
    return n
  end
end

-- Durations as kubectl's --request-timeout takes them (Go's
-- time.ParseDuration: 5s, 1m30s, 500ms, 1.5h; units h m s ms us µs ns),
-- or plain decimal seconds as before. Returns seconds.
local unit_seconds = { h = 3600, m = 60, s = 1, ms = 1e-3, us = 1e-6, ["µs"] = 1e-6, ns = 1e-9 }

function cli.duration(v)
  local n = decimal(v)
  if n ~= nil then return n end
  if type(v) ~= "string" or v == "" then return nil end
  local total, pos = 0, 1
  while pos <= #v do
    local num, unit, after = v:match("^(%d*%.?%d*)(%a+)()", pos)
    if num == nil then -- "µ" is not %a
      num, unit, after = v:match("^(%d*%.?%d*)(µs)()", pos)
    end
    local x = num and decimal(num)
    if x == nil or not unit_seconds[unit] then return nil end
    total = total + x * unit_seconds[unit]
    pos = after
  end
  return total
end

local function duration_value(name, positive)
  return function(v)
    local n = cli.duration(v)
    if n == nil or n == math.huge or (positive and n <= 0) then
      errors.raise("usage", ("%s expects a %sduration (5s, 1m30s, 500ms) or plain seconds, got %q")
        :format(name, positive and "positive " or "", v))
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
    errors.raise("usage", ("%s must be one of %s, got %q")
      :format(name, table.concat(allowed, "|"), v))
  end
end

local function string_value(v) return v end

local options = {
  ["--kubeconfig"] = string_value,
  ["--context"] = string_value,
  ["--namespace"] = string_value,
  ["--migrations"] = string_value,
  ["--log-format"] = one_of("--log-format", "text", "json"),
  ["--request-timeout"] = duration_value("--request-timeout"),
  ["--lock-timeout"] = duration_value("--lock-timeout"),
  ["--step-timeout"] = duration_value("--step-timeout", true),
  ["--concurrency"] = function(v)
    local n = v:match("^%d+$") and math.tointeger(tonumber(v))
    if not n or n < 1 or n > 64 then
      errors.raise("usage",
        ("--concurrency expects an integer from 1 to 64, in plain decimal, got %q"):format(v))
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
  ["--save"] = string_value,
  ["--plan"] = string_value,
  ["--strict-stamp"] = "flag",
  ["--service-account"] = string_value,
  ["--no-builtin"] = "flag",
  ["--all"] = "flag",
  ["--preflight"] = "flag",
  ["--reason"] = string_value,
  ["--force"] = "flag",
  ["--number"] = integer_value("--number"),
  ["--v"] = "verbosity",
  ["--help"] = "flag",
  ["--version"] = "flag",
}

-- An option whose values differ for one command.
local command_values = {
  rbac = { ["--output"] = one_of("--output", "yaml", "json") },
}

-- Which command-specific options each command accepts (common ones always), in help's order.
local command_options = {
  run = { "--target", "--dry-run", "--server-dry-run", "--plan", "--step-timeout", "--strict-stamp",
    "--concurrency" },
  plan = { "--target", "--server-dry-run", "--save", "--step-timeout", "--strict-stamp",
    "--concurrency", "--output" },
  status = { "--output", "--target" },
  check = { "--migration", "--output", "--target", "--step-timeout", "--service-account" },
  list = { "--output" },
  new = { "--number" },
  rbac = { "--all", "--target", "--preflight", "--output" },
  stamp = { "--reason", "--force", "--dry-run" },
  lua = {},
  help = {},
}
cli.command_options = command_options
for _, list in pairs(command_options) do
  for _, name in ipairs(list) do list[name] = true end
end
local common_list = { "--kubeconfig", "--context", "--namespace", "--migrations", "--no-builtin",
  "--log-format", "--request-timeout", "--lock-timeout", "--qps", "--burst", "--v", "--help",
  "--version" }
cli.common_options = common_list
local common = {}
for _, name in ipairs(common_list) do common[name] = true end
local command_specific = {}
for _, o in ipairs(option_list) do
  if not common[o[1]] then command_specific[#command_specific + 1] = o[1] end
end

-- Which commands take the option named, in --help's order ("run, plan").
local function takers(name)
  local t = {}
  for _, c in ipairs(command_list) do
    if command_options[c[1]][name] then t[#t + 1] = c[1] end
  end
  return table.concat(t, ", ")
end

local function option_lines(names, with_commands)
  local out = {}
  for _, name in ipairs(names) do
    local o = option_help[name]
    local head = (o[2] and (o[2] .. ", ") or "") .. o[1] .. (o[3] and (" " .. o[3]) or "")
    local first = true
    for line in o[4]:gmatch("[^\n]+") do
      out[#out + 1] = ("  %-28s  %s"):format(first and head or "", line)
      first = false
    end
    if with_commands then out[#out] = out[#out] .. " [" .. takers(name) .. "]" end
  end
  return table.concat(out, "\n") .. "\n"
end

local function command_lines()
  local out = {}
  for _, c in ipairs(command_list) do
    local first = true
    for line in c[3]:gmatch("[^\n]+") do
      if first then
        out[#out + 1] = ("  %-6s %-50s %s"):format(c[1], c[2], line)
      else
        out[#out + 1] = (" "):rep(60) .. line
      end
      first = false
    end
  end
  return table.concat(out, "\n") .. "\n"
end

cli.usage = "Usage: cozy-migrate [OPTIONS] COMMAND [OPTIONS]\n\nCommands:\n" .. command_lines()
  .. "\nCommon options (before or after the command):\n" .. option_lines(common_list)
  .. "\nCommand options [the commands that take them]:\n" .. option_lines(command_specific, true)
  .. [==[

Durations: 5s, 1m30s, 500ms, 1.5h (as kubectl's), or plain seconds.
Values: --opt VALUE or --opt=VALUE; -n NS, -nNS or -n=NS. `--` ends the options.
'cozy-migrate COMMAND --help' or 'cozy-migrate help COMMAND': COMMAND's options.

Environment:
  NAMESPACE                   default for --namespace
  TARGET_VERSION              default for --target (else the highest migration + 1)
  CURRENT_VERSION             only cross-checked against the ConfigMap; a mismatch is logged
  KUBECONFIG                  kubeconfig files, as kubectl reads them
]==] -- three lines of the help run past 100 columns: strings, to keep the text as it is
  .. "  POD_NAME                    the runner's identity: lock, history, Events (else host-pid);"
  .. " its pod gets the Events too\n"
  .. "  POD_NAMESPACE               that pod's namespace, for its Events (else --namespace's)\n"
  .. "  COZY_MIGRATE_TERMINATION_LOG  a run's or check's last line goes there if it exists"
  .. " (default /dev/termination-log)\n"
  .. [==[
  COZY_MIGRATE_LEASE_SECONDS  lock lease duration (default 30, renewed every third)
  COZY_MIGRATE_PAGE_LIMIT     objects per list page (default 500)
  COZY_MIGRATE_FINALLY_SECONDS  a migration's finally deadline (default 30, 1 to 300)
  COZY_MIGRATE_MIGRATIONS     default for --migrations (empty: no directory, not even /migrations)
]==]
  .. "  KUBERNETES_SERVICE_HOST/PORT  in-cluster API server (with the service account's token,"
  .. " ca.crt, namespace)\n"
  .. [==[
  COZY_MIGRATE_SERVICEACCOUNT_DIR  the service account's directory (tests; else the pod's)
  HTTPS_PROXY, HTTP_PROXY, NO_PROXY  proxy for the API server, as kubectl uses them

Exit status: 0 done or nothing to do; 1 a migration or an API call failed,
a run was stopped (SIGTERM, SIGINT, SIGHUP, lost lock), check found a blocking finding,
or run --plan found the cluster or a write not as planned;
2 usage, configuration, an invalid migration set or an unusable --plan file;
3 the lock could not be taken within --lock-timeout (held by another runner,
or refused by the server).
See docs/operations.md.
]==]

-- COMMAND's help: its synopsis, what it does, its own options, and the common ones' names.
function cli.command_usage(command)
  local c = commands[command]
  local out = { ("Usage: cozy-migrate %s %s\n\n"):format(command, c.synopsis) }
  for line in c.summary:gmatch("[^\n]+") do out[#out + 1] = line .. "\n" end
  if #command_options[command] > 0 then
    out[#out + 1] = "\nOptions:\n" .. option_lines(command_options[command])
  end
  if command ~= "lua" and command ~= "help" then
    out[#out + 1] = "\nCommon options ('cozy-migrate --help' describes them):\n  "
      .. table.concat(common_list, " ") .. "\n"
  end
  return table.concat(out)
end

local function key(opt)
  return (opt:gsub("^%-+", ""):gsub("%-", "_"))
end

-- An argument as (option name, inline value): "--name=value", pflag's
-- shorthands "-n ns", "-nns", "-n=ns", or (nil) not an option.
local function split(a)
  if a:sub(1, 1) ~= "-" or a == "-" or a == "--" then return nil end
  local name, inline = a:match("^(%-%-[%w-]+)=(.*)$")
  if name then return name, inline end
  local short, rest = a:match("^%-(%a)(.*)$")
  if short and shorthands[short] then
    if rest == "" then return shorthands[short], nil end
    return shorthands[short], (rest:gsub("^=", "", 1))
  end
  return a, nil
end

-- Whether the option named takes the next argument as its value. A bare -v
-- takes it only when it is a level: `-v 6 status`, `-v status`.
local function takes_next(name, inline, nxt)
  local kind = options[name]
  if inline ~= nil or kind == nil or kind == "flag" then return false end
  if kind == "verbosity" then return nxt ~= nil and nxt:match("^%d+$") ~= nil end
  return true
end

-- The command: the first argument that is neither an option nor an option's
-- value (options may come before it, as kubectl's global flags do).
local function find_command(argv)
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then return nil end
    local name, inline = split(a)
    if name == nil then return a, i end
    if takes_next(name, inline, argv[i + 1]) then i = i + 1 end
    i = i + 1
  end
end

-- `--help` anywhere before a `--`: the help of the command, if there is one.
local function help_asked(argv, command)
  for i = 1, #argv do
    if argv[i] == "--" then return false end
    if split(argv[i]) == "--help" then
      if command ~= nil and not commands[command] then
        errors.raise("usage", ("unknown command %q"):format(command))
      end
      return true
    end
  end
  return false
end

-- No command is `--version` or a usage error; an unknown one and options
-- before `lua` (which takes its own) are usage errors.
local function check_command(argv, command)
  if command == nil then
    for i = 1, #argv do
      if argv[i] == "--version" then return "version" end
    end
    errors.raise("usage", "no command given")
  end
  if not commands[command] then
    errors.raise("usage", ("unknown command %q"):format(command))
  end
  if command == "lua" then
    errors.raise("usage",
      "'lua' takes no options before it: cozy-migrate lua [SCRIPT [ARGS...]] | lua -e CODE")
  end
end

-- -v LEVEL, -v=LEVEL, --v=LEVEL, -vLEVEL, or -v alone (debug): into opts.v.
-- Returns the index of the last word it read.
local function read_verbosity(name, inline, argv, i, opts)
  local level = inline
  if level == nil and takes_next(name, nil, argv[i + 1]) then
    i = i + 1
    level = argv[i]
  end
  if level == nil then
    opts.v = math.max(opts.v, cli.V_DEBUG)
    return i
  end
  local n = level:match("^%d+$") and math.tointeger(tonumber(level))
  if not n then
    errors.raise("usage", ("-v expects a level, a non-negative integer (as kubectl's -v=6), got %q")
      :format(level))
  end
  opts.v = n
  return i
end

-- The option argv[i] (named `name`, with its `--opt=VALUE` value `inline`)
-- of `command`, read into opts. Returns the index of the last word it read.
local function read_option(command, argv, i, name, inline, opts)
  local kind = (command_values[command] or {})[name] or options[name]
  if kind == nil then
    errors.raise("usage", ("unknown option %q"):format(argv[i]))
  end
  if not (common[name] or command_options[command][name]) then
    errors.raise("usage", ("option %s does not apply to '%s'"):format(name, command))
  end
  if kind == "flag" then
    if inline then errors.raise("usage", ("option %s takes no value"):format(name)) end
    opts[key(name)] = true
    return i
  elseif kind == "verbosity" then
    return read_verbosity(name, inline, argv, i, opts)
  end
  local v = inline
  if v == nil then
    i = i + 1
    v = argv[i]
    if v == nil then errors.raise("usage", ("option %s needs a value"):format(name)) end
  end
  opts[key(name)] = kind(v)
  return i
end

-- What the words after the options may be: `help` one command, `new` its
-- NAME, `stamp` its N, every other command none.
local function check_arguments(command, opts, args)
  if command == "help" then
    if #args > 1 then
      errors.raise("usage", ("unexpected argument %q for 'help'"):format(args[2]))
    end
    if args[1] ~= nil and not commands[args[1]] then
      errors.raise("usage", ("unknown command %q"):format(args[1]))
    end
    return "help", opts, args
  end
  if opts.version then return "version", opts, {} end
  local takes = (command == "new" or command == "stamp") and 1 or 0
  if #args > takes then
    errors.raise("usage", ("unexpected argument %q for '%s'"):format(args[takes + 1], command))
  end
  return command, opts, args
end

-- Parses argv (1-based, without the program name). Returns command, opts, args;
-- raises a cozy.errors error of kind "usage" on misuse. `--help` anywhere (and
-- `help [COMMAND]`) returns "help", opts, { COMMAND }; `--version`, "version".
-- Options go before or after the command, as kubectl's; `--` ends them.
function cli.parse(argv)
  local command, at = find_command(argv)
  if help_asked(argv, command) then return "help", { v = 0 }, { command } end
  if check_command(argv, command) == "version" then return "version", { v = 0 }, {} end
  local opts, args = { v = 0 }, {}
  argv = table.move(argv, 1, #argv, 1, {})
  table.remove(argv, at) -- the command itself
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local name, inline = split(a)
    if a == "--" then
      table.move(argv, i + 1, #argv, #args + 1, args)
      break
    elseif name == nil then
      args[#args + 1] = a
    else
      i = read_option(command, argv, i, name, inline, opts)
    end
    i = i + 1
  end
  return check_arguments(command, opts, args)
end

-- Entry point from core/main.c: argv[0] is the program name.
function cli.main(argv)
  if argv[1] == "lua" then
    -- lua5.4 has no --help; ours answers it as every other command does
    if argv[2] == "--help" and argv[3] == nil then
      io.stdout:write(cli.command_usage("lua"))
      return cli.EXIT_OK
    end
    return require("cozy.cmd.lua").run(argv)
  end
  local rest = table.move(argv, 1, #argv, 1, {})
  local ok, command, opts, args = pcall(cli.parse, rest)
  if not ok then
    local err = command
    if errors.is(err, "usage") then
      io.stderr:write("cozy-migrate: ", text.line(err.message), "\n",
        "Try 'cozy-migrate --help'.\n")
      return cli.EXIT_USAGE
    end
    error(err, 0)
  end
  if command == "version" then
    io.stdout:write("cozy-migrate ", sys.version, " (", _VERSION, ")\n")
    return cli.EXIT_OK
  elseif command == "help" then
    io.stdout:write(args[1] and cli.command_usage(args[1]) or cli.usage)
    return cli.EXIT_OK
  end
  -- a collector cycle starts once the heap has grown by half past what the
  -- last one kept (Lua's default waits until it doubles): a Job's memory limit
  -- is sized for what a migration holds. At 20,000 VMs migration 59 peaks at
  -- 42.5 MiB with it; 120 would save 6 MiB more for 40% more collector work
  -- (bench/README.md). A rehearsal collects generationally instead (cozy.runner).
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
