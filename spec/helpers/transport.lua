-- The transport e2e specs' part of the harness (spec/README.md): a TLS + token
-- API server with the transport fixture, a client with fast retries, and
-- request-log filters. Their logger is the harness's (harness.capture_log).
local fake = require "spec.support.fake"
local kube = require "cozy.kube"
local cli = require "spec.helpers.cli"
local files = require "spec.helpers.files"
local harness = require "spec.helpers"

local support = {}

support.TOKEN = "tok-6f1d2c9a-very-secret"
support.FIXTURE = "spec/fixtures/transport/base.json"

function support.start(opts)
  opts = opts or {}
  return fake.start { fixtures = opts.fixtures or { support.FIXTURE }, tls = true,
    token = opts.token or support.TOKEN, latency_ms = opts.latency_ms }
end

-- In the calling describe block: one API server for the whole block (the
-- fake, or the real one under COZY_SPEC_SERVER=real), and before each test
-- its state reset to support.FIXTURE, its faults (the fake's) and request log
-- cleared, then each(srv) (a fresh client, a temp dir, ...).
function support.fresh_server(each)
  local busted = require "busted" -- the hooks, as spec/helpers registers them
  local srv
  busted.setup(function() srv = support.start() end)
  busted.teardown(function() if srv then srv:stop() end end)
  busted.before_each(function()
    srv:reset { support.FIXTURE }
    if not srv.real then srv:clear_faults() end
    srv:clear_requests()
    if each then each(srv) end
  end)
end

-- Connect to srv with fast retries so the specs stay quick.
function support.connect(srv, opts)
  opts = opts or {}
  local o = {
    kubeconfig = srv.kubeconfig,
    request_timeout = 5,
    retry = { max_attempts = 6, max_time = 30, base_delay = 0.05, max_delay = 2 },
    log = opts.log or harness.capture_log().log,
  }
  for k, v in pairs(opts) do o[k] = v end
  return kube.connect(o)
end

-- Request log entries for API paths (not discovery), optionally filtered.
function support.api_requests(srv, method, pattern)
  local out = {}
  for _, e in ipairs(srv:requests()) do
    if (method == nil or e.method == method) and (pattern == nil or tostring(e.path):find(pattern)) then
      out[#out + 1] = e
    end
  end
  return out
end

function support.object(srv, ns, name)
  return srv:object("ConfigMap", ns, name)
end

support.write_file = files.write
support.read_file = files.read

function support.tmpdir()
  return files.tmpdir("cozy-transport")
end

-- Runs the binary with a shell-syntax argument string (and `env`, shell
-- assignments); returns exit code, stdout, stderr.
function support.run(env, args)
  local r = cli.shell(("env %s %s %s"):format(env or "", cli.bin, args))
  return r.code, r.stdout, r.stderr
end

support.fake = fake
return support
