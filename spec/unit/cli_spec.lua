-- The command-line contract (README.md, docs/operations.md): parsing, exit statuses, --help/--version.
local cli = require "cozy.cli"

local shell = require("spec.helpers").cli

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
    assert.same({ target = 61, dry_run = true, namespace = "ns1", v = cli.V_DEBUG }, opts)
    assert.same({}, args)
  end)

  -- kubectl's conventions (pflag/cobra), issue 26
  it("takes common options before the command, as kubectl's global flags", function()
    local cmd, opts, args = cli.parse({ "--kubeconfig", "/k", "--namespace=ns1", "-v", "status", "--output", "json" })
    assert.equal("status", cmd)
    assert.same({ kubeconfig = "/k", namespace = "ns1", v = cli.V_DEBUG, output = "json" }, opts)
    assert.same({}, args)
  end)

  it("takes command options before the command too, judged for that command", function()
    assert.same({ target = 3, v = 0 }, select(2, cli.parse({ "--target", "3", "run" })))
    local ok, err = pcall(cli.parse, { "--output", "json", "run" })
    assert.is_false(ok)
    assert.equal("option --output does not apply to 'run'", err.message)
  end)

  for _, case in ipairs({
    { { "-n", "ns1", "status" }, { namespace = "ns1" } },
    { { "status", "-nns1" }, { namespace = "ns1" } },
    { { "status", "-n=ns1" }, { namespace = "ns1" } },
    { { "status", "-o", "json" }, { output = "json" } },
    { { "-ojson", "status" }, { output = "json" } },
    { { "rbac", "-o=yaml" }, { output = "yaml" } },
    { { "-v", "6", "status" }, { v = 6 } },
    { { "status", "-v=8" }, { v = 8 } },
    { { "status", "--v=6" }, { v = 6 } },
    { { "status", "--v", "7" }, { v = 7 } },
    { { "status", "-v9" }, { v = 9 } },
    { { "status", "-v" }, { v = 4 } },
    { { "-v", "status", "-v", "0" }, { v = 0 } },
    { { "status", "--request-timeout", "5s" }, { request_timeout = 5 } },
    { { "status", "--request-timeout=1m30s" }, { request_timeout = 90 } },
    { { "status", "--request-timeout", "500ms" }, { request_timeout = 0.5 } },
    { { "status", "--request-timeout", "1.5h" }, { request_timeout = 5400 } },
    { { "status", "--request-timeout", "12" }, { request_timeout = 12 } },
    { { "status", "--request-timeout", "0" }, { request_timeout = 0 } },
    { { "run", "--lock-timeout", "2m" }, { lock_timeout = 120 } },
    { { "run", "--step-timeout", "1h2m3s" }, { step_timeout = 3723 } },
  }) do
    it("reads " .. table.concat(case[1], " "), function()
      local _, opts = cli.parse(case[1])
      local want = { v = 0 }
      for k, v in pairs(case[2]) do want[k] = v end
      assert.same(want, opts)
    end)
  end

  for _, case in ipairs({
    { { "run", "--help" }, "run" },
    { { "--kubeconfig", "/k", "status", "-h" }, "status" },
    { { "help", "check" }, "check" },
    { { "--help" } },
    { { "help" } },
    { { "--kubeconfig", "/k", "--help" } },
  }) do
    it("answers help: " .. table.concat(case[1], " "), function()
      local cmd, _, args = cli.parse(case[1])
      assert.equal("help", cmd)
      assert.same({ case[2] }, args)
    end)
  end

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
    { { "run", "--request-timeout", "1e3" }, "expects a duration %(5s, 1m30s, 500ms%) or plain seconds" },
    { { "run", "--request-timeout", "0x10" }, "expects a duration" },
    { { "run", "--request-timeout", "5x" }, "expects a duration" },
    { { "run", "--request-timeout", "-5s" }, "expects a duration" },
    { { "run", "--request-timeout", "5s3" }, "expects a duration" },
    { { "run", "--request-timeout", "s" }, "expects a duration" },
    { { "run", "--step-timeout", "0s" }, "expects a positive duration" },
    { { "status", "-v", "x" }, "unexpected argument \"x\"" },
    { { "status", "-v=x" }, "%-v expects a level, a non%-negative integer" },
    { { "status", "-x" }, "unknown option \"%-x\"" },
    { { "status", "-n" }, "option %-%-namespace needs a value" },
    { { "help", "frob" }, "unknown command \"frob\"" },
    { { "frob", "--help" }, "unknown command \"frob\"" },
    { { "-v", "lua" }, "'lua' takes no options before it" },
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

  it("prints every command's help for COMMAND --help and help COMMAND, exit 0, on stdout", function()
    for _, c in ipairs({ "run", "plan", "status", "check", "list", "new", "rbac", "lua", "help" }) do
      for _, form in ipairs({ c .. " --help", "help " .. c, "--kubeconfig /nonexistent " .. c .. " -h" }) do
        if not (c == "lua" and form:find("kubeconfig", 1, true)) then
          local code, out, err = run(form)
          assert.equal(0, code, form .. ": " .. err)
          assert.equal("", err, form)
          assert.matches("^Usage: cozy%-migrate " .. c .. " ", out)
          for _, o in ipairs(cli.command_options[c]) do assert.matches("[ ,]" .. o:gsub("%-", "%%-") .. "[ \n]", out) end
        end
      end
    end
  end)

  it("lists every command and option in --help; README.md's usage block is --help's text", function()
    local _, help = run("--help")
    for c in pairs(cli.command_options) do assert.matches("\n  " .. c .. " ", help, 1, true) end
    local all = {}
    for _, o in ipairs(cli.common_options) do all[#all + 1] = o end
    for _, list in pairs(cli.command_options) do
      for _, o in ipairs(list) do all[#all + 1] = o end
    end
    for _, o in ipairs(all) do
      assert.matches("[ ,]" .. o:gsub("%-", "%%-") .. "[ \n]", help, nil, false, "--help lists " .. o)
    end
    local readme = assert(io.open("README.md")):read("a")
    local block = assert(readme:match("## Usage\n\n```\n(.-```)\n"), "README.md has a usage block")
    assert.equal(help, block:sub(1, -4))
  end)

  it("README.md names exactly the built-ins list shows, and docs/migrations has a page for each", function()
    local code, out, err = run("list")
    assert.equal(0, code, err)
    local listed = {}
    for name in out:gmatch("%d+%s+(%d+%-[%w%-]+)%s+lua%s") do listed[#listed + 1] = name end
    assert.is_true(#listed >= 2, "list shows the built-ins: " .. out)
    local readme = assert(io.open("README.md")):read("a")
    local sentence = assert(readme:match("%(`cozy%-migrate list` names them%): today (.-), each documented"),
      "README.md lists the built-ins")
    local named = {}
    for number, name in sentence:gmatch("(%d+)%s+%(([%w%-]+)%)") do named[#named + 1] = number .. "-" .. name end
    assert.same(listed, named)
    for _, n in ipairs(listed) do
      local page = io.open("docs/migrations/" .. n .. ".md")
      assert.is_truthy(page, "docs/migrations/" .. n .. ".md")
      page:close()
    end
  end)

  it("takes options before the command: --kubeconfig X status reads X", function()
    local code, _, err = run("--kubeconfig /nonexistent/kubeconfig status")
    assert.equal(2, code)
    assert.matches("/nonexistent/kubeconfig: cannot read kubeconfig", err, 1, true)
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
