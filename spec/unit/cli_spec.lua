-- The command-line contract (README.md, docs/operations.md): parsing, exit statuses, --help/--version.
local cli = require "cozy.cli"

local shell = require "spec.helpers.cli"

-- Runs the binary; returns exit status, stdout, stderr.
local function run(args, stdin)
  local r = shell.shell(("%s %s <%s"):format(shell.quote(shell.bin), args, stdin or "/dev/null"))
  assert(r.code < 128, "killed by a signal")
  return r.code, r.stdout, r.stderr
end

describe("cli.parse", function()
  it("parses a command with common and command options", function()
    local cmd, opts, args = cli.parse({ "run", "--target", "61", "--dry-run", "--namespace=ns1", "-v", "-v" })
    assert.equal("run", cmd)
    assert.same({ target = 61, dry_run = true, namespace = "ns1", v = 2 }, opts)
    assert.same({}, args)
  end)

  it("keeps positional arguments", function()
    local cmd, _, args = cli.parse({ "new", "my-change" })
    assert.equal("new", cmd)
    assert.same({ "my-change" }, args)
  end)

  for _, case in ipairs({
    { { "frob" }, "unknown command" },
    { {}, "no command" },
    { { "run", "--bogus" }, "unknown option" },
    { { "run", "--output", "json" }, "does not apply" },
    { { "run", "--target" }, "needs a value" },
    { { "run", "--target", "x" }, "non%-negative integer" },
    { { "run", "--target", "-3" }, "non%-negative integer" },
    { { "status", "--output", "yaml" }, "must be one of" },
    { { "run", "--dry-run=yes" }, "takes no value" },
    { { "run", "--target", "0x3C" }, "non%-negative integer, in plain decimal" },
    { { "run", "--target", "1e3" }, "non%-negative integer, in plain decimal" },
    { { "run", "--target", " 60" }, "non%-negative integer, in plain decimal" },
    { { "run", "--request-timeout", "1e3" }, "non%-negative number, in plain decimal" },
    { { "run", "--request-timeout", "0x10" }, "non%-negative number, in plain decimal" },
    { { "run", "--qps", "inf" }, "positive number, in plain decimal" },
    { { "run", "--qps", "0" }, "positive number, in plain decimal" },
    { { "run", "extra" }, "unexpected argument \"extra\" for 'run'" },
    { { "status", "a", "b" }, "unexpected argument \"a\"" },
    { { "new", "a", "b" }, "unexpected argument \"b\" for 'new'" },
  }) do
    it("refuses " .. table.concat(case[1], " "), function()
      local ok, err = pcall(cli.parse, case[1])
      assert.is_false(ok)
      assert.equal("usage", err.kind)
      assert.matches(case[2], err.message)
    end)
  end
end)

describe("the binary", function()
  it("prints its version", function()
    local code, out = run("--version")
    assert.equal(0, code)
    assert.matches("^cozy%-migrate %d+%.%d+%.%d+", out)
  end)

  it("prints help naming every command", function()
    local code, out = run("--help")
    assert.equal(0, code)
    for _, c in ipairs({ "run", "plan", "status", "check", "list", "new", "lua" }) do
      assert.matches("\n  " .. c .. " ", out, 1, true)
    end
  end)

  it("exits 2 with a hint on misuse", function()
    local code, _, err = run("frob")
    assert.equal(2, code)
    assert.matches('unknown command "frob"', err, 1, true)
    assert.matches("--help", err, 1, true)
  end)
end)

describe("start-up", function()
  -- what only a run's steps or the API server need: required on first use
  -- (scripts/cozy/runner.lua), so `list` does not pay for loading them
  local run_only = { "cozy.runner.context", "cozy.runner.lease", "cozy.runner.legacy", "cozy.runner.stamp",
    "cozy.runner.step", "cozy.runner.steps", "cozy.kube", "cozy.transport", "cozy.worker" }

  it("list loads what discovery needs, not the run's modules", function()
    local code, _, err = run([[lua -e 'require("cozy.cli").main({ [0] = "cozy-migrate", "list" })
      local names = {}
      for name in pairs(package.loaded) do names[#names + 1] = name end
      io.stderr:write(" ", table.concat(names, " "), " ")']])
    assert.equal(0, code, err)
    assert.matches(" cozy.runner.discovery ", err, 1, true)
    for _, name in ipairs(run_only) do assert.not_matches(" " .. name .. " ", err, 1, true) end
  end)

  it("the run's modules are still reached through the runner, and what replaces their functions", function()
    local runner = require "cozy.runner"
    local steps = require "cozy.runner.steps"
    local original = steps.namespace
    steps.namespace = function() return "replaced" end
    local ok, ns = pcall(runner.namespace, {})
    steps.namespace = original
    assert.is_true(ok, ns)
    assert.equal("replaced", ns)
    assert.equal("given", runner.namespace({ namespace = "given" }))
  end)
end)

describe("cozy-migrate lua", function()
  it("runs -e code with the engine's modules", function()
    local code, out = run([[lua -e 'print(type(require("cozy.json").decode))']])
    assert.equal(0, code)
    assert.equal("function\n", out)
  end)

  it("sets arg like lua5.4 and passes script arguments", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write("local a, b = ... print(arg[0] == ..., arg[1], arg[2], a, b, #arg)\n")
    f:close()
    local code, out = run(("lua %s x y"):format(script))
    os.remove(script)
    assert.equal(0, code)
    assert.equal("false\tx\ty\tx\ty\t2\n", out)
  end)

  it("reads the chunk from stdin", function()
    local chunk = os.tmpname()
    local f = assert(io.open(chunk, "w"))
    f:write("print(6 * 7)\n")
    f:close()
    local code, out = run("lua -", chunk)
    os.remove(chunk)
    assert.equal(0, code)
    assert.equal("42\n", out)
  end)

  it("returns os.exit's status", function()
    assert.equal(7, (run([[lua -e 'os.exit(7)']])))
  end)

  it("exits 1 with a traceback on an error, tostring-ing error objects", function()
    local code, _, err = run([[lua -e 'error(setmetatable({}, {__tostring = function() return "boom" end}))']])
    assert.equal(1, code)
    assert.matches("boom", err, 1, true)
    assert.matches("stack traceback", err, 1, true)
  end)

  it("refuses binary chunks", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(string.dump(function() return 1 end))
    f:close()
    local code, _, err = run("lua " .. path)
    os.remove(path)
    assert.equal(1, code)
    assert.matches("binary", err)
  end)
end)
