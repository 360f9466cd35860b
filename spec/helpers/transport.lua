-- The transport e2e specs' part of the harness (spec/README.md): a TLS + token
-- API server with the transport fixture, a client with fast retries, and
-- request-log filters. Their logger is the harness's (harness.capture_log).
local fake = require "spec.support.fake"
local kube = require "cozy.kube"
local cli = require "spec.helpers.cli"
local files = require "spec.helpers.files"
local harness = require "spec.helpers"

local transport_harness = {}

transport_harness.TOKEN = "tok-6f1d2c9a-very-secret"
transport_harness.FIXTURE = "spec/fixtures/transport/base.json"

function transport_harness.start(opts)
  opts = opts or {}
  return fake.start { fixtures = opts.fixtures or { transport_harness.FIXTURE }, tls = true,
    token = opts.token or transport_harness.TOKEN, latency_ms = opts.latency_ms }
end

-- In the calling describe block: the harness's server for the block
-- (harness.fake: the fake, or the real one under COZY_SPEC_SERVER=real, reset
-- before each test to transport_harness.FIXTURE, its log and faults cleared) with the
-- transport token, then each(srv) before each test (a fresh client, a temp
-- dir, ...). Returns the harness (h.srv, h:requests(), h:fired()...).
function transport_harness.fresh_server(each)
  local h = harness.fake { fixtures = { transport_harness.FIXTURE }, token = transport_harness.TOKEN }
  if each then require("busted").before_each(function() each(h.srv) end) end
  return h
end

-- Connect to srv with fast retries so the specs stay quick.
function transport_harness.connect(srv, opts)
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
function transport_harness.api_requests(srv, method, pattern)
  local out = {}
  for _, e in ipairs(srv:requests()) do
    if (method == nil or e.method == method) and (pattern == nil or tostring(e.path):find(pattern)) then
      out[#out + 1] = e
    end
  end
  return out
end

function transport_harness.object(srv, ns, name)
  return srv:object("ConfigMap", ns, name)
end

transport_harness.write_file = files.write
transport_harness.read_file = files.read

function transport_harness.tmpdir()
  return files.tmpdir("cozy-transport")
end

-- Runs the binary with a shell-syntax argument string (and `env`, shell
-- assignments); returns exit code, stdout, stderr.
function transport_harness.run(env, args)
  local r = cli.shell(("env %s %s %s"):format(env or "", cli.bin, args))
  return r.code, r.stdout, r.stderr
end

transport_harness.fake = fake
return transport_harness
