-- A legacy script in a rehearsal runs in a network namespace of its own
-- whose only reachable address is the engine's endpoint (core/proc.c's
-- opts.endpoint, core/endpoint.c): the runner serves it while the script
-- runs; where no namespace can be had, the script is not run at all.
local harness = require "spec.helpers"
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local q = files.quote
local DRIVER = "spec/fixtures/legacy_netns/driver.lua"

-- Runs `script` (shell text) under the driver, wrapped by `wrap` (a command
-- prefix, e.g. setpriv); returns the driver's result and its directory.
local function spawn(script, wrap)
  local dir = cli.tmpdir()
  files.sh("chmod 0777 " .. q(dir)) -- an unprivileged script writes there too
  files.write(dir .. "/script.sh", script)
  local r = cli.shell(("%s %s lua %s %s %s"):format(wrap or "", q(cli.bin), q(DRIVER), q(dir .. "/script.sh"),
    q(dir)))
  return r, dir
end

local CURL = 'curl -sS --max-time 5 --cacert "$CA" '

describe("a legacy script with the rehearsal's endpoint", function()
  local h = harness.fake {}

  local function reaches_only_the_endpoint(wrap)
    h:mark()
    local r, dir = spawn(table.concat({
      -- /proc/net is the process's own namespace's (sysfs shows where it was mounted)
      "awk 'NR > 2 { printf \"%s \", $1 }' /proc/net/dev; echo",
      CURL .. '-H "Authorization: Bearer $TOKEN" -X POST --data-binary @- https://127.0.0.1:$PORT/api/v1/x?y=1 <<E',
      "hello",
      "E",
      "echo",
      CURL .. "https://127.0.0.1:$PORT/api; echo",
      CURL .. "-k " .. q(h.srv.url .. "/api") .. " || echo unreachable-live",
      CURL .. "http://1.1.1.1/ || echo unreachable-outside",
      "touch \"$DIR/ran\"",
    }, "\n"), wrap)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    -- only the loopback in its namespace
    assert.matches("stdout lo: \n", r.stdout, 1, true)
    -- the request reached the runner's serve, body and all, and its answer came back
    assert.matches("served POST /api/v1/x?y=1 hello\n", r.stdout, 1, true)
    assert.matches("stdout POST /api/v1/x?y=1 6\n", r.stdout, 1, true)
    -- without the endpoint's token: 401, never served
    assert.matches("wants its own bearer token", r.stdout, 1, true)
    assert.not_matches("served GET /api ", r.stdout, 1, true)
    -- the live server and the outside are unreachable, and the live server saw nothing
    assert.matches("stdout unreachable-live\n", r.stdout, 1, true)
    assert.matches("stdout unreachable-outside\n", r.stdout, 1, true)
    assert.same({}, h:requests())
    assert.matches("spawn exit 0\n", r.stdout, 1, true)
    assert.truthy(files.read(dir .. "/ran"))
    files.rm_rf(dir)
  end

  it("reaches the runner's endpoint and nothing else (privileged: a network namespace)", function()
    reaches_only_the_endpoint()
  end)

  it("the same as root without any capability (a user namespace)", function()
    reaches_only_the_endpoint("setpriv --bounding-set=-all --inh-caps=-all")
  end)

  it("the same as an unprivileged user (a user namespace; its uid kept)", function()
    local r = spawn("id -u", "setpriv --reuid=65532 --regid=65532 --clear-groups")
    assert.matches("stdout 65532\n", r.stdout, 1, true)
    assert.matches("spawn exit 0\n", r.stdout, 1, true)
  end)

  it("answers a chunked request body 400, clearly, without serving it", function()
    local r = spawn(CURL .. '-H "Authorization: Bearer $TOKEN" -H "Transfer-Encoding: chunked" '
      .. "-X POST --data-binary x https://127.0.0.1:$PORT/api/v1/x; echo")
    assert.matches("does not take chunked request bodies", r.stdout, 1, true)
    assert.not_matches("served", r.stdout, 1, true)
  end)

  it("turns away a client that is not TLS and headers too large, and goes on serving", function()
    local r = spawn(table.concat({
      "curl -sS --max-time 5 http://127.0.0.1:$PORT/api/v1/plain >/dev/null 2>&1 || echo plain-refused",
      CURL .. '-H "Authorization: Bearer $TOKEN" -H "X-Big: $(head -c 70000 /dev/zero | tr "\\0" a)" '
        .. "https://127.0.0.1:$PORT/api/v1/big; echo",
      CURL .. '-H "Authorization: Bearer $TOKEN" https://127.0.0.1:$PORT/api/v1/after; echo',
    }, "\n"))
    assert.matches("stdout plain-refused\n", r.stdout, 1, true)
    assert.matches("the request's headers are too large", r.stdout, 1, true)
    assert.not_matches("served GET /api/v1/plain", r.stdout, 1, true)
    assert.not_matches("served GET /api/v1/big", r.stdout, 1, true)
    assert.matches("served GET /api/v1/after \n", r.stdout, 1, true)
    assert.matches("spawn exit 0\n", r.stdout, 1, true)
  end)

  it("does not run the script where no network namespace can be had", function()
    -- a user namespace of the spec's own that may create none, and no CAP_SYS_ADMIN: as in most pods
    local dir = cli.tmpdir()
    files.write(dir .. "/script.sh", 'touch "$DIR/ran"\n')
    local r = cli.shell(("unshare -Ur sh -c %s"):format(q(("echo 0 >/proc/sys/user/max_user_namespaces && "
      .. "exec setpriv --bounding-set=-all --inh-caps=-all %s lua %s %s %s"):format(q(cli.bin), q(DRIVER),
      q(dir .. "/script.sh"), q(dir)))))
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("spawn refused no network namespace could be had (with a user namespace: No space left on "
      .. "device; without one: Operation not permitted)", r.stdout, 1, true)
    assert.is_nil(files.read(dir .. "/ran"))
    files.rm_rf(dir)
  end)
end)
