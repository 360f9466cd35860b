-- `cozy-migrate new NAME` end to end, in a temporary copy of what a source
-- tree gives a spec (.busted, spec/helpers, spec/support, an empty
-- migrations/): the scaffold validates; its spec, run by busted on the
-- harness, fails until the migration makes its first real change, saying so;
-- uncommenting the one example line makes it pass.
local cli = require("spec.helpers").cli
local files = require("spec.helpers").files

local q = files.quote

local BIN = q(files.absolute(cli.bin))

describe("cozy-migrate new", function()
  local tree
  before_each(function() tree = cli.spec_tree() end)
  after_each(function() files.rm_rf(tree) end)

  local function in_tree(cmdline) return cli.in_tree(tree, cmdline) end
  local function busted(spec) return cli.busted_in(tree, spec) end

  it("scaffolds a valid migration whose spec fails until its first real change; one line makes it pass", function()
    local r = in_tree(BIN .. " new label-tenants")
    assert.equal(0, r.code, r.stderr)
    -- the next number after the built-in set
    local builtin = cli.run { "list", "--output", "json" }
    assert.equal(0, builtin.code, builtin.stderr)
    local highest = 0
    for n in builtin.stdout:gmatch('"number":%s*(%d+)') do highest = math.max(highest, tonumber(n)) end
    assert.is_true(highest >= 59)
    local base = ("%d-label-tenants"):format(highest + 1)
    local migration = "migrations/" .. base .. ".lua"
    local spec = "spec/migrations/" .. base .. "_spec.lua"
    assert.equal(migration .. "\n" .. spec .. "\n", r.stdout)

    local list = in_tree(BIN .. " list --no-builtin --migrations migrations")
    assert.equal(0, list.code, list.stderr)
    assert.matches(base, list.stdout, 1, true)

    -- fresh: the spec fails, and says what to do
    r = busted(spec)
    assert.equal(1, r.code, r.stdout .. r.stderr)
    assert.matches("2 successes / 3 failures / 0 errors", r.stdout, 1, true)
    assert.matches("changed no object of its fixture: write its first real change in " .. migration, r.stdout, 1, true)
    assert.matches("check reported nothing about a fixture that run changes", r.stdout, 1, true)
    assert.matches("plan showed no write", r.stdout, 1, true)

    -- the one-line edit: uncomment the example change
    local path = tree .. "/" .. migration
    local text = assert(files.read(path))
    local edited, n = text:gsub("\n  %-%- (if not obj%.metadata%.labels%.done [^\n]*)", "\n  %1")
    assert.equal(1, n)
    files.write(path, edited)

    r = busted(spec)
    assert.equal(0, r.code, r.stdout .. r.stderr)
    assert.matches("5 successes / 0 failures / 0 errors", r.stdout, 1, true)
  end)

  it("writes both files or neither, and refuses a bad name", function()
    local r = in_tree(BIN .. " new once")
    assert.equal(0, r.code, r.stderr)
    local migration, spec = r.stdout:match("^(%S+)\n(%S+)\n$")
    -- without the migration the same number is next again, and its spec is in the way
    assert.is_true(os.remove(tree .. "/" .. migration))
    r = in_tree(BIN .. " new once")
    assert.equal(1, r.code)
    assert.equal(("cozy-migrate: %s already exists\n"):format(spec), r.stderr)
    assert.is_nil(files.read(tree .. "/" .. migration))
    r = in_tree(BIN .. " new Bad_Name")
    assert.equal(2, r.code)
    assert.matches("invalid migration name", r.stderr)
    r = in_tree(BIN .. " new")
    assert.equal(2, r.code)
    assert.matches("usage: cozy%-migrate new %[%-%-number NN%] %[NN%-%]NAME", r.stderr)
  end)

  it("takes the number given as NN-NAME, and refuses one that is taken", function()
    -- a number below the highest that the binary has not built in (a port of an
    -- older platform script keeps its number), whatever the build compiles in
    local taken = {}
    for _, m in ipairs(require("cozy.json").decode(cli.run { "list", "--output", "json" }.stdout).migrations) do
      taken[m.number] = true
    end
    local n = 49
    while taken[n] do n = n - 1 end
    local r = in_tree(BIN .. " new " .. n .. "-tenant-labels")
    assert.equal(0, r.code, r.stderr)
    assert.equal(("migrations/%d-tenant-labels.lua\nspec/migrations/%d-tenant-labels_spec.lua\n"):format(n, n), r.stdout)
    local list = in_tree(BIN .. " list --no-builtin --migrations migrations --output json")
    assert.matches('"number":' .. n, list.stdout, 1, true)
    r = in_tree(BIN .. " new " .. n .. "-other")
    assert.equal(2, r.code)
    assert.equal(("cozy-migrate: migration number %d is taken (%d-tenant-labels.lua)\n"):format(n, n), r.stderr)
    r = in_tree(BIN .. " new 59-vmi-hotplug-again")
    assert.equal(2, r.code)
    assert.equal("cozy-migrate: migration number 59 is taken (59-vmi-hotplug.lua)\n", r.stderr)
    r = in_tree(BIN .. " new " .. n .. "-")
    assert.equal(2, r.code)
    assert.matches("invalid migration name", r.stderr)
  end)

  it("takes the number as --number NN, before or after the name, and refuses two numbers", function()
    local taken = {}
    for _, m in ipairs(require("cozy.json").decode(cli.run { "list", "--output", "json" }.stdout).migrations) do
      taken[m.number] = true
    end
    local n = 49
    while taken[n] or taken[n - 1] do n = n - 1 end
    local r = in_tree(BIN .. " new --number " .. n .. " tenant-labels")
    assert.equal(0, r.code, r.stderr)
    assert.equal(("migrations/%d-tenant-labels.lua\nspec/migrations/%d-tenant-labels_spec.lua\n"):format(n, n), r.stdout)
    r = in_tree(BIN .. " new pvc-labels --number " .. (n - 1))
    assert.equal(0, r.code, r.stderr)
    assert.equal(("migrations/%d-pvc-labels.lua\nspec/migrations/%d-pvc-labels_spec.lua\n"):format(n - 1, n - 1), r.stdout)
    r = in_tree(BIN .. " new --number " .. n .. " other")
    assert.equal(2, r.code)
    assert.equal(("cozy-migrate: migration number %d is taken (%d-tenant-labels.lua)\n"):format(n, n), r.stderr)
    r = in_tree(BIN .. " new --number 7 8-two")
    assert.equal(2, r.code)
    assert.equal("cozy-migrate: --number 7 and 8-two name two numbers\n", r.stderr)
    r = in_tree(BIN .. " new --number x y")
    assert.equal(2, r.code)
    assert.matches('--number expects a non-negative integer, in plain decimal, got "x"', r.stderr, 1, true)
    r = in_tree(BIN .. " new --help")
    assert.equal(0, r.code)
    assert.matches("--number NN", r.stdout, 1, true)
  end)
end)

describe("cozy-migrate new beside existing migrations", function()
  local dir
  before_each(function()
    dir = cli.tmpdir()
    os.execute(("mkdir -p %s/migrations && cp %s/two/*.lua %s/migrations/"):format(dir, "spec/fixtures/runner/", dir))
  end)
  after_each(function() os.execute("rm -rf " .. cli.quote(dir)) end)

  it("scaffolds the next number and its spec, which list accepts", function()
    local r = cli.run({ "new", "add-labels", "--migrations", dir .. "/migrations" })
    assert.equal(0, r.code, r.stderr)
    assert.truthy(cli.slurp(dir .. "/migrations/3-add-labels.lua"))
    assert.truthy(cli.slurp(dir .. "/spec/migrations/3-add-labels_spec.lua"))
    local l = cli.run({ "list", "--no-builtin", "--migrations", dir .. "/migrations" })
    assert.equal(0, l.code, l.stderr)
    assert.matches("3%-add%-labels", l.stdout)
  end)

  it("refuses a bad name and an existing file", function()
    assert.equal(2, cli.run({ "new", "Bad_Name", "--migrations", dir .. "/migrations" }).code)
    assert.equal(2, cli.run({ "new", "--migrations", dir .. "/migrations" }).code)
  end)
end)
