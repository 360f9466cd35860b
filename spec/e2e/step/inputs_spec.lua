-- A migration's declared inputs: `parameters` read from the runner's
-- environment (default, set, refused before the step starts with exit 2),
-- `files` read through ctx.files (read, JSON, a listing; a path out of the
-- declared directory refused, by "..", by a symlink), both shown by `list`
-- and `check`. On either server (COZY_SPEC_SERVER=real).
local fake = require("spec.helpers").server
local files = require("spec.helpers").files
local json = require "cozy.json"
local cli = require("spec.helpers").cli

local PARAM = [[
return {
  description = "records its parameter",
  parameters = {
    { name = "SPEC_MODE", default = "false", allowed = { "true", "false" }, description = "what the step records" },
    { name = "SPEC_FREE", description = "any text, no default" },
  },
  permissions = { { verb = "create", resource = "configmaps" } },
  check = function() end,
  run = function(ctx)
    ctx.log:info("step body running")
    %s
    ctx.kube:resource("v1", "configmaps"):create{ apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "seen", namespace = "cozy-system" },
      data = { mode = ctx.params.SPEC_MODE, free = ctx.params.SPEC_FREE or "(absent)" } }
  end,
}
]]

local FILES = [[
return {
  description = "reads its files",
  parameters = { { name = "SPEC_DATA_DIR", default = "/nonexistent", description = "the data directory" } },
  files = { data = "$SPEC_DATA_DIR" },
  permissions = { { verb = "create", resource = "configmaps" } },
  check = function() end,
  run = function(ctx)
    local data = {
      text = ctx.files:read("data", "a.txt"),
      value = tostring(ctx.files:json("data", "sub/b.json").value),
      listed = table.concat(ctx.files:list("data", ".json"), ","),
      exists = tostring(ctx.files:exists("data", "sub")),
    }
    %s
    ctx.kube:resource("v1", "configmaps"):create{ apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = "seen", namespace = "cozy-system" }, data = data }
  end,
}
]]

local function seen(srv)
  local cm = srv:object("ConfigMap", "cozy-system", "seen")
  return cm and cm.data
end

describe("a migration's parameters", function()
  local srv
  setup(function() srv = fake.start { fixtures = {}, tls = true, token = "t" } end)
  teardown(function() srv:stop() end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function run(env, body)
    local dir = cli.migration_dir { ["1-param.lua"] = PARAM:format(body or "") }
    finally(function() files.rm_rf(dir) end)
    return cli.run(cli.args(srv, dir, "run"), env), dir
  end

  it("takes its default when the environment does not set it, and is absent without one", function()
    local r = run({ SPEC_MODE = false, SPEC_FREE = false })
    assert.equal(0, r.code, r.stderr)
    assert.same({ mode = "false", free = "(absent)" }, seen(srv))
    assert.equal(2, cli.version(srv))
  end)

  it("takes the environment's value; set but empty reads as unset", function()
    local r = run({ SPEC_MODE = "true", SPEC_FREE = "any text" })
    assert.equal(0, r.code, r.stderr)
    assert.same({ mode = "true", free = "any text" }, seen(srv))
    srv:reset(cli.fixture(1))
    r = run({ SPEC_MODE = "", SPEC_FREE = false })
    assert.equal(0, r.code, r.stderr)
    assert.same({ mode = "false", free = "(absent)" }, seen(srv))
  end)

  it("refuses a value not allowed before the lock and the step: exit 2, nothing started", function()
    local r = run({ SPEC_MODE = "maybe" })
    assert.equal(2, r.code, r.stderr)
    assert.matches('migration 1-param: parameter SPEC_MODE="maybe" is not allowed (allowed: "true", "false")',
      r.stderr, 1, true)
    assert.not_matches("step body running", r.stderr, 1, true)
    assert.not_matches("step started", r.stderr, 1, true)
    assert.is_nil(cli.get_lease(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("refuses a value with a line break the same way (a value is one line)", function()
    local r = run({ SPEC_FREE = "two\nlines" })
    assert.equal(2, r.code, r.stderr)
    assert.matches("migration 1-param: parameter SPEC_FREE must be one line", r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
  end)

  it("ctx.params is read-only: a step that assigns to it fails", function()
    local r = run({}, 'ctx.params.SPEC_MODE = "true"')
    assert.equal(1, r.code, r.stderr)
    assert.matches("ctx.params", r.stderr, 1, true)
    assert.is_nil(seen(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("list shows each parameter, in text and JSON", function()
    local dir = cli.migration_dir { ["1-param.lua"] = PARAM:format("") }
    finally(function() files.rm_rf(dir) end)
    local r = cli.run({ "list", "--no-builtin", "--migrations", dir })
    assert.equal(0, r.code, r.stderr)
    assert.matches('parameter SPEC_MODE default "false" allowed "true", "false" - what the step records', r.stdout,
      1, true)
    assert.matches("parameter SPEC_FREE - any text, no default", r.stdout, 1, true)
    r = cli.run({ "list", "--no-builtin", "--migrations", dir, "-o", "json" })
    local l = json.decode(r.stdout)
    assert.same({ name = "SPEC_MODE", default = "false", allowed = { "true", "false" },
      description = "what the step records" }, l.migrations[1].parameters[1])
  end)

  it("check shows each value and where it came from; a refused value blocks", function()
    local dir = cli.migration_dir { ["1-param.lua"] = PARAM:format("") }
    finally(function() files.rm_rf(dir) end)
    local r = cli.run(cli.args(srv, dir, "check", "-o", "json"), { SPEC_MODE = "true" })
    assert.equal(0, r.code, r.stderr)
    local report = json.decode(r.stdout)
    assert.equal("1-param", report.inputs[1].migration)
    local p = report.inputs[1].parameters[1]
    assert.same({ "SPEC_MODE", "true", "env" }, { p.name, p.value, p.source })
    r = cli.run(cli.args(srv, dir, "check"), { SPEC_MODE = false })
    assert.matches('1-param: parameter SPEC_MODE = "false" (default)', r.stdout, 1, true)
    r = cli.run(cli.args(srv, dir, "check"), { SPEC_MODE = "maybe" })
    assert.equal(1, r.code, r.stdout)
    assert.matches('[BLOCK] 1-param: migration 1-param: parameter SPEC_MODE="maybe" is not allowed', r.stdout, 1, true)
    assert.same({}, cli.writes(srv))
  end)

  it("an invalid declaration refuses the set (exit 2): a name that is not an environment name, "
    .. "a default not allowed, the engine's own variable", function()
    local cases = {
      { '{ name = "spec_mode", description = "d" }', "name must be an environment variable name" },
      { '{ name = "X", default = "c", allowed = { "a", "b" }, description = "d" }', 'default "c" is not one of allowed' },
      { '{ name = "TARGET_VERSION", description = "d" }', "the name is the engine's own" },
      { '{ name = "COZY_MIGRATE_X", description = "d" }', "the name is the engine's own" },
    }
    for _, c in ipairs(cases) do
      local dir = cli.migration_dir { ["1-bad.lua"] = ("return { description = 'x', parameters = { %s }, "
        .. "run = function() end }"):format(c[1]) }
      local r = cli.run({ "list", "--no-builtin", "--migrations", dir })
      files.rm_rf(dir)
      assert.equal(2, r.code, r.stderr)
      assert.matches(c[2], r.stderr, 1, true)
    end
  end)
end)

describe("a migration's files", function()
  local srv, data
  setup(function()
    srv = fake.start { fixtures = {}, tls = true, token = "t" }
    data = files.tmpdir("cozy-files-spec")
    files.write(data .. "/a.txt", "hello\n")
    os.execute("mkdir -p " .. files.quote(data .. "/sub"))
    files.write(data .. "/sub/b.json", '{"value": 42}')
    files.write(data .. "/c.json", "{}")
    -- a symlink inside the directory that leads out of it
    os.execute(("ln -s /etc/hostname %s"):format(files.quote(data .. "/out.json")))
  end)
  teardown(function()
    srv:stop()
    files.rm_rf(data)
  end)
  before_each(function() srv:reset(cli.fixture(1)) end)

  local function run(body, env)
    local dir = cli.migration_dir { ["1-files.lua"] = FILES:format(body or "") }
    finally(function() files.rm_rf(dir) end)
    return cli.run(cli.args(srv, dir, "run"), env or { SPEC_DATA_DIR = data })
  end

  it("reads a declared directory's file, its JSON, lists it (a symlink out of it left out)", function()
    local r = run()
    assert.equal(0, r.code, r.stderr)
    assert.same({ text = "hello\n", value = "42", listed = "c.json", exists = "directory" }, seen(srv))
  end)

  it("refuses '..' out of the declared directory: the step fails, nothing written", function()
    local r = run('ctx.files:read("data", "../x")')
    assert.equal(1, r.code, r.stderr)
    assert.matches('ctx.files: "../x": ".." is not allowed in a path', r.stderr, 1, true)
    assert.is_nil(seen(srv))
    assert.equal(1, cli.version(srv))
  end)

  it("refuses a symlink that resolves out of the declared directory", function()
    local r = run('ctx.files:read("data", "out.json")')
    assert.equal(1, r.code, r.stderr)
    assert.matches("resolves to /etc/hostname, outside the declared data", r.stderr, 1, true)
    assert.is_nil(seen(srv))
  end)

  it("refuses an absolute path and a key the table does not declare", function()
    local r = run('ctx.files:read("data", "/etc/hostname")')
    assert.equal(1, r.code, r.stderr)
    assert.matches('"/etc/hostname" is absolute', r.stderr, 1, true)
    r = run('ctx.files:read("etc")')
    assert.equal(1, r.code, r.stderr)
    assert.matches("ctx.files: etc is not a declared file", r.stderr, 1, true)
  end)

  it("the sandbox still has no io, no os.getenv, no os.execute", function()
    local r = run('assert(io == nil and os.getenv == nil and os.execute == nil, "io or os reachable")')
    assert.equal(0, r.code, r.stderr)
  end)

  it("a path from a parameter must be absolute: a relative one is refused before the step (exit 2)", function()
    local r = run(nil, { SPEC_DATA_DIR = "relative/dir" })
    assert.equal(2, r.code, r.stderr)
    assert.matches('files.data comes from parameter SPEC_DATA_DIR, whose value "relative/dir" is not an absolute path',
      r.stderr, 1, true)
    assert.equal(1, cli.version(srv))
  end)

  it("list and check show the declared path and what it resolves to", function()
    local dir = cli.migration_dir { ["1-files.lua"] = FILES:format("") }
    finally(function() files.rm_rf(dir) end)
    local r = cli.run({ "list", "--no-builtin", "--migrations", dir })
    assert.matches("file data: $SPEC_DATA_DIR (read-only)", r.stdout, 1, true)
    r = cli.run(cli.args(srv, dir, "check"), { SPEC_DATA_DIR = data })
    assert.equal(0, r.code, r.stdout)
    assert.matches(("1-files: file data: $SPEC_DATA_DIR = %s (read-only)"):format(data), r.stdout, 1, true)
  end)

  it("a files entry naming an undeclared parameter refuses the set (exit 2)", function()
    local dir = cli.migration_dir { ["1-bad.lua"] = "return { description = 'x', files = { d = '$NOPE' }, "
      .. "run = function() end }" }
    local r = cli.run({ "list", "--no-builtin", "--migrations", dir })
    files.rm_rf(dir)
    assert.equal(2, r.code, r.stderr)
    assert.matches("files.d names parameter NOPE, which `parameters` does not declare", r.stderr, 1, true)
  end)
end)
