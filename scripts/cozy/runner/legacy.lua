-- Legacy migrations: files `NN` or `NN-name`, as today's run-migrations.sh
-- runs them (whatever their mode: it runs `chmod +x` before each one). Each gets our environment
-- plus what those scripts expect: NAMESPACE, CURRENT_VERSION (the version this script moves
-- from), TARGET_VERSION, and KUBECONFIG naming a kubeconfig of the engine's
-- one cluster, user and namespace (below). They run from their own directory. Their stdout and
-- stderr become log lines as they are written. They stamp N+1 themselves; the runner verifies it.
--
-- Each runs in its own process group, under the step's time limit
-- (--step-timeout, else the 1,800 s default): on that limit, on the
-- runner's SIGTERM/SIGINT/SIGHUP, and once the script itself exits, the whole
-- group gets SIGTERM, then SIGKILL after a grace (core/proc.c), so a
-- background child (`kubectl port-forward &`) cannot hold the run. It runs
-- under the lock, and only while the lock is certainly ours: SIGTERM once
-- renewals fall behind, SIGKILL before another runner could take the Lease
-- over (lease.Holder:child_bounds), so no second copy of a script starts
-- while this one may still run. A guardian process (core/guardian.c) keeps
-- the same times and kills the group, and removes the script's kubeconfig,
-- should the runner die (SIGKILL) or freeze.
local errors = require "cozy.errors"
local proc = require "cozy.proc"
local stamp = require "cozy.runner.stamp"
local step = require "cozy.runner.step"
local sys = require "cozy.sys"
local text = require "cozy.text"

local legacy = {}

-- What `#!/bin/sh` means to the platform's scripts: POSIX sh with
-- `pipefail` (set -euo pipefail heads 25 of its 55), as busybox ash gives it
-- in the platform's Alpine image. dash, Debian's /bin/sh, refuses pipefail,
-- so the same script would fail on a Debian image or workstation. bash in
-- POSIX mode has pipefail and is on both (Essential in Debian, installed in
-- the platform's image); busybox is on neither by default. So a script whose
-- interpreter is sh, or that has no `#!` line (which a shell runs with sh),
-- runs under it wherever cozy-migrate runs.
legacy.POSIX_SH = { "/bin/bash", "--posix" }

local function is_sh(interpreter, arg)
  return interpreter == "/bin/sh" or interpreter == "/usr/bin/sh"
    or (interpreter == "/usr/bin/env" or interpreter == "/bin/env") and arg == "sh"
end

-- The argv that runs script m, as the kernel would read its `#!` line (one
-- interpreter and at most one argument), with sh read as legacy.POSIX_SH;
-- a file without the run bit runs through its interpreter all the same.
function legacy.command(m)
  -- the script runs from its own directory: a relative path would not hold there
  local path = m.path:sub(1, 1) == "/" and m.path or (sys.realpath(m.path) or m.path)
  local line = m.source:match("^#!([^\n]*)")
  local interpreter, arg
  if line then interpreter, arg = line:match("^%s*(%S+)%s*(.-)%s*$") end
  if interpreter == nil or is_sh(interpreter, arg) then
    return { legacy.POSIX_SH[1], legacy.POSIX_SH[2], path }
  end
  if m.executable then return { path } end
  local argv = { interpreter }
  if arg ~= "" then argv[#argv + 1] = arg end
  argv[#argv + 1] = path
  return argv
end

-- The child's environment: ours, with `set` overriding (name -> value) and
-- the names in `unset` (name -> true) left out.
function legacy.environment(set, unset)
  local env, seen = {}, {}
  for name in pairs(unset or {}) do seen[name] = true end
  for name, value in pairs(set) do
    env[#env + 1] = name .. "=" .. value
    seen[name] = true
  end
  -- ours: read through /proc, the one place the whole environment is listed
  local f = io.open("/proc/self/environ", "rb")
  if f then
    local all = f:read("a")
    f:close()
    for entry in all:gmatch("([^%z]+)") do
      local name = entry:match("^([^=]+)=")
      if name and not seen[name] then env[#env + 1] = entry end
    end
  end
  table.sort(env)
  return env
end

-- One cluster for the engine and its scripts. The engine locked and reads
-- the cluster of its configuration (--kubeconfig, $KUBECONFIG, ~/.kube/config
-- or in-cluster, at --context); a script's kubectl would choose again, by
-- the kubeconfig's current-context, with the context's namespace or none.
-- So each script gets a kubeconfig of exactly one cluster, user (token,
-- token file, client certificate or exec plugin, as the engine has them)
-- and context, the current one, whose namespace is the engine's, written
-- by the C core (core/kubeconfig_write.c: secrets never pass through Lua),
-- mode 0600 in a private directory that goes when the script has ended.
-- Returns a to-be-closed handle: .path, .dir, .source.
-- In a rehearsal (opts.endpoint): the endpoint's server, CA and token only.
local function private_kubeconfig(opts)
  local transport = require "cozy.transport"
  local path, dir, source = transport.write_kubeconfig { kubeconfig = opts.kubeconfig,
    context = opts.context, namespace = opts.namespace, endpoint = opts.endpoint,
    port = opts.endpoint and legacy.ENDPOINT_PORT }
  if path == nil then
    local e = dir
    if type(e) == "table" then
      errors.raise("config", e.message, { file = e.file, field = e.field })
    end
    errors.raise("failed", ("legacy script: cannot write its kubeconfig: %s"):format(tostring(e)))
  end
  return setmetatable({ path = path, dir = dir, source = source }, { __close = function(k)
    os.remove(k.path)
    os.remove(k.dir)
  end })
end
-- a migration's declared tools get theirs the same way (cozy.runner.tools)
legacy.private_kubeconfig = private_kubeconfig

-- The port of a rehearsal's endpoint in the script's own network namespace,
-- where nothing else listens: the API server's usual one.
legacy.ENDPOINT_PORT = 6443

-- What a rehearsed script must not have: the in-cluster address (its
-- namespace could not reach it anyway; a tool would try and fail unclearly)
-- and proxies (the endpoint is the one address, reached directly).
local REHEARSAL_UNSET = { KUBERNETES_SERVICE_HOST = true, KUBERNETES_SERVICE_PORT = true,
  KUBERNETES_SERVICE_PORT_HTTPS = true, HTTPS_PROXY = true, HTTP_PROXY = true, ALL_PROXY = true,
  NO_PROXY = true, https_proxy = true, http_proxy = true, all_proxy = true, no_proxy = true }
legacy.REHEARSAL_UNSET = REHEARSAL_UNSET

-- The longest stderr line a failure quotes.
legacy.QUOTE_BYTES = 300

-- Why a script failed: kind "timeout" or "interrupted" when the runner
-- stopped it (how it ended is said too), else "failed". Its last stderr
-- line is quoted: a script's cause (`kubectl`'s "Error from server ...",
-- `set -u`'s "unbound variable") is there, not in its exit status.
local function failure(m, how, code, stopped, limit, last_stderr)
  local ended = ("%s %d"):format(how == "exit" and "exited with status" or "was killed by signal",
    code)
  if last_stderr then
    local line = text.safe_prefix(last_stderr, legacy.QUOTE_BYTES, "...")
    ended = ("%s, its last stderr line: %q"):format(ended, line)
  end
  if stopped == "lock" then
    errors.raise("lost",
      ("legacy script %s stopped: the lock may no longer be ours (not renewed in time): its "
      .. "process group was stopped (it %s)"):format(m.file, ended), { exit = code })
  elseif stopped == "deadline" then
    errors.raise("timeout",
      ("legacy script %s ran past its time limit of %ss: its process group was stopped "
      .. "(it %s)"):format(m.file, tostring(limit), ended), { exit = code })
  elseif stopped == "signal" then
    errors.raise("interrupted", ("legacy script %s stopped by signal %s: it %s")
      :format(m.file, tostring(proc.signalled() or "?"), ended), { exit = code })
  end
  errors.raise("failed", ("legacy script %s %s"):format(m.file, ended), { exit = code })
end

-- Runs migration m (kind "legacy"). opts: namespace, from, target,
-- kubeconfig and context (the engine's --kubeconfig and --context, or nil:
-- found as the engine finds them), log, timeout (--step-timeout, or nil:
-- the default), lock (the lease.Holder it runs under, or nil), rehearse
-- (a rehearsal's client: the script runs in a network namespace of its own
-- whose one address is the rehearsal's endpoint, its requests served by that
-- client; cozy.kube.overlay_endpoint), forward (a run's client bound to a
-- plan: the same endpoint, each request forwarded to the cluster through
-- that client, each write held to the plan's). Raises unless the script
-- exits 0 in time; where no namespace can be had, raises with field
-- `unisolated` (why) and the script is not run; in a bound run, raises
-- naming the first write the plan does not hold (the script was stopped
-- there). Returns the number of writes the engine sent for the script
-- (nil when it talked to the cluster itself).
function legacy.run(m, opts)
  local vars = {
    NAMESPACE = opts.namespace,
    CURRENT_VERSION = tostring(opts.from),
    TARGET_VERSION = tostring(opts.target),
  }
  local through = opts.rehearse or opts.forward
  local ep <close> = through and require("cozy.endpoint").new() or nil
  local kubeconfig <close> = private_kubeconfig { kubeconfig = opts.kubeconfig,
    context = opts.context, namespace = opts.namespace, endpoint = ep }
  vars.KUBECONFIG = kubeconfig.path
  -- outside a cluster's pod configuration, a tool that reads the in-cluster
  -- variables (client-go's InClusterConfig) would reach the pod's cluster,
  -- not the engine's: they are left out (in-cluster, they name the same one)
  local unset = kubeconfig.source ~= "in-cluster"
    and { KUBERNETES_SERVICE_HOST = true, KUBERNETES_SERVICE_PORT = true } or nil
  if ep then unset = REHEARSAL_UNSET end
  local log = opts.log
  log:info("running legacy script",
    { file = m.file, through = opts.forward and "the engine (run --plan)" or nil })
  -- from its own directory, so `$(dirname "$0")/lib/...` and plain `lib/...` both work
  local dir = m.path:match("^(.*)/[^/]*$") or "."
  local limit = step.timeout(m, opts.timeout)
  local last_stderr
  local serve, tally
  if ep then
    serve, tally = require("cozy.kube.overlay_endpoint").server(through, log,
      { forward = opts.forward ~= nil })
  end
  local how, code, stopped = proc.spawn(legacy.command(m), legacy.environment(vars, unset),
    function(stream, line)
    if stream == "stderr" then
      log:warn(line, { stream = stream })
      if line:find("%S") then last_stderr = line end
    else
      log:info(line, { stream = stream })
    end
  end, { cwd = dir, deadline = sys.monotime() + limit, remove = { kubeconfig.path, kubeconfig.dir },
    lock = opts.lock and function() return opts.lock:child_bounds() end,
    endpoint = ep and { server = ep, port = legacy.ENDPOINT_PORT, serve = serve } })
  if how == "refused" then
    if opts.forward then
      -- its writes would reach the cluster unseen: no script of a bound run talks to it directly
      errors.raise("failed",
        ("legacy script %s not run: a run bound to a plan (--plan) holds a script's writes "
        .. "to the plan's by serving its requests itself, in a network namespace of the "
        .. "script's own, and %s; "
        .. "run without --plan where scripts cannot be isolated")
          :format(m.file, code), { unisolated = code })
    end
    errors.raise("failed", ("legacy script %s not run: %s")
      :format(m.file, code), { unisolated = code })
  end
  local differed = opts.forward and opts.forward.binding and opts.forward.binding.stopped
  if differed then
    -- whatever the script did after: its group was stopped, and nothing more was sent
    errors.raise("failed", ("legacy script %s stopped: %s; its process group was stopped")
      :format(m.file, differed))
  end
  if how ~= "exit" or code ~= 0 or stopped then
    failure(m, how, code, stopped, limit, last_stderr)
  end
  return tally and tally.writes or nil
end

-- Runs legacy step m (from -> from+1) and reads what it stamped. opts as
-- for legacy.run, plus cms (the ConfigMaps resource), at (the version
-- stamped before it ran: below `from` when an earlier step left it) and
-- strict (--strict-stamp). Returns the ConfigMap as the script left it,
-- whether the script stamped from+1, and its writes (legacy.run's count).
-- A script that exits 0 with the version where it was did not stamp: by
-- default that is what run-migrations.sh lets pass (the platform's
-- best-effort scripts leave the version on purpose so that the next
-- upgrade retries them), and the runner goes on; under --strict-stamp it
-- fails the run. A version other than `at` or from+1 is nobody's rule: the
-- script wrote a version it does not own, and that always fails closed.
function legacy.step(m, cms, opts)
  local to = opts.from + 1
  local at = opts.at or opts.from
  local writes = legacy.run(m, opts)
  local after = stamp.read(cms, opts.namespace)
  local v = after and stamp.version_of(after)
  if v == to then return after, true, writes end
  if v == at and not opts.strict then return after, false, writes end
  errors.raise("failed", ("legacy script %s exited 0 but did not stamp %d (version is %s)%s")
    :format(m.file, to, tostring(v), v == at and " and --strict-stamp is set" or ""),
    { migration = m.name })
end

return legacy
