-- The fault campaign: migration 59 (built in) on a 200-VM fleet, a third of
-- the VMs needing the copy, with one fault injected into one request type
-- per cell. Rows are the request types a run makes, columns the faults. A
-- cell passes when the run either succeeds with exactly the objects of an
-- uninterrupted run, or fails closed (exit 1, nothing stamped, every VM as
-- before or as after the migration, none half-done) and a rerun then
-- completes to those objects; in both cases the VM PATCHes the server
-- answered with a 2xx are the VMs that needed the copy, each exactly once,
-- and every fault rule of the cell fired. A cell that cannot apply (410 on a
-- request that is not a continue, a bump before a read or a create) does not
-- exist. The table printed at the end is the one in docs/reliability.md.
local campaign = require("spec.helpers").campaign

local FLEET = 200
local PAGE = 50            -- four pages of VMs, four of VMIs
local TIMEOUT = 2          -- --request-timeout of the main client
-- a VM that needs the copy (every third does)
local VM_RE = "/namespaces/tenant-big-0/virtualmachines/node-00090$"

-- Runs fast by default: the rate limit is not under test here.
local FAST = { "--qps", "1000", "--burst", "1000" }

-- The request types: how a rule finds the request (method, path regex
-- searched in the request target, skip), the timeout that request has (the
-- delay fault waits past it), and whatever else the row needs.
local ROWS = {
  -- whether KubeVirt is installed: the group version's discovery document
  { id = "discovery", label = "discovery read (GET /apis/kubevirt.io/v1)",
    match = { method = "GET", path = "^/apis/kubevirt\\.io/v1(\\?|$)" } },
  { id = "vm-list", label = "VM list page (continued)", continued = true,
    match = { method = "GET", path = "^/apis/kubevirt\\.io/v1/virtualmachines\\?.*continue=" } },
  { id = "vmi-list", label = "VMI list page (continued)", continued = true,
    match = { method = "GET", path = "^/apis/kubevirt\\.io/v1/virtualmachineinstances\\?.*continue=" } },
  -- a VM is read on its own only after a conflict: a concurrent writer
  -- makes one, then the fault meets the re-read
  { id = "vm-get", label = "VM get (re-read after a conflict)",
    match = { method = "GET", path = VM_RE },
    setup = { { method = "PATCH", path = VM_RE, bump = true } } },
  { id = "vm-patch", label = "VM patch", write = true, match = { method = "PATCH", path = VM_RE } },
  -- the second read: the one made under the lock
  { id = "cm-read", label = "ConfigMap read (version, under the lock)",
    match = { method = "GET", path = "/configmaps/cozystack-version$", skip = 1 },
    is_target = function(_, log, i)
      for j = 1, i - 1 do if log[j].method == "POST" and log[j].path:find("/leases$") then return true end end
    end },
  { id = "cm-write", label = "ConfigMap write (the stamp)", write = true,
    match = { method = "PATCH", path = "/configmaps/cozystack-version$" } },
  { id = "lease-create", label = "Lease create", match = { method = "POST", path = "/leases$" } },
  -- a 3 s lease is renewed every second; the rate limit makes the run last
  -- longer than that, so the first PATCH of the Lease is a renewal
  { id = "lease-renew", label = "Lease renew", write = true,
    match = { method = "PATCH", path = "/leases/cozystack-migrations$" },
    env = { COZY_MIGRATE_LEASE_SECONDS = "3" }, args = { "--qps", "20", "--burst", "20" },
    timeout = 1,  -- a renewal's own timeout: min(--request-timeout, lease/3)
    is_target = function(e) return e.body:find("renewTime", 1, true) and not e.body:find('"value":""', 1, true) end },
  -- the default 30 s lease is not renewed during the run, so the only PATCH
  -- of the Lease is the release
  { id = "lease-release", label = "Lease release", write = true,
    match = { method = "PATCH", path = "/leases/cozystack-migrations$" },
    timeout = 5,  -- the release's quick client
    is_target = function(e) return e.body:find('"value":""', 1, true) end },
}

local FAULTS = {
  { id = "500x5", label = "five 500s", rule = function() return { status = { code = 500 }, times = 5 } end },
  { id = "503", label = "503 + Retry-After",
    rule = function() return { status = { code = 503, retry_after = 1 } } end },
  { id = "429", label = "429", rule = function() return { status = { code = 429 } } end },
  { id = "reset", label = "connection reset", rule = function() return { reset = true } end },
  { id = "timeout", label = "delay past the timeout",
    rule = function(row) return { delay_ms = ((row.timeout or TIMEOUT) + 1) * 1000 } end },
  { id = "bump", label = "bump before the write", applies = function(row) return row.write end,
    rule = function() return { bump = true } end },
  { id = "410", label = "410 on the continue", applies = function(row) return row.continued end,
    rule = function() return { status = { code = 410, reason = "Expired",
      message = "The provided continue parameter is too old to display a consistent list result." } } end },
  { id = "401", label = "401, token rotated", rule = function(_, srv, n)
      return { rotate_token = { token = "t-" .. n, file = srv.token_file } } end },
}

-- What the engine does, cell by cell: every fault is retried through,
-- except renewals failing for two thirds of the lease (five 500s: three
-- attempts fail in the first renewal's interval, two in the next): the main
-- thread then counts the lock as lost, sends no further write, and the run
-- fails closed. A renewal held past its timeout is followed at once by the
-- next one (renewals are paced from their sending), which lands first; the
-- held one, guarded by the resourceVersion it was based on, is refused when
-- it lands, so it cannot set renewTime back.
local FAIL_CLOSED = { ["lease-renew/500x5"] = "lock lost" }

-- Cells whose outcome the machine's speed decides, each one of two that
-- both keep the promise: the renewal held past its timeout is followed by
-- the next one, sent as it times out, two thirds of the 3 s lease after the
-- last good renewal was sent: that is exactly where the lock counts as lost,
-- so a loaded machine fails closed ("lock lost") and a quiet one passes. The
-- cell asserts whichever it got, and the table says both.
local EITHER = { ["lease-renew/timeout"] = "lock lost" }

-- the request log's fault.action of each fault
local ACTIONS = { ["500x5"] = "status", ["503"] = "status", ["429"] = "status", reset = "reset",
                  timeout = "delay", bump = "bump", ["410"] = "status", ["401"] = "rotate_token" }

local function rule_for(row, fault, srv, n)
  local r = fault.rule(row, srv, n)
  for k, v in pairs(row.match) do r[k] = v end
  return r
end

local function merged(a, b)
  local out = {}
  for k, v in pairs(a or {}) do out[k] = v end
  for k, v in pairs(b or {}) do out[k] = v end
  return out
end

local function args_of(srv, row, ...)
  local args = campaign.args(srv, "--request-timeout", tostring(TIMEOUT), ...)
  for _, a in ipairs(row.args or FAST) do args[#args + 1] = a end
  return args
end

-- The first object where two states differ, for a readable failure.
local function first_difference(want, got)
  if want.version ~= got.version then return "version " .. tostring(got.version) .. ", want " .. want.version end
  if not campaign.same(want.history, got.history) then return "history differs" end
  for key, o in pairs(want.objects) do
    if not campaign.same(o, got.objects[key]) then return key .. " differs" end
  end
  for key in pairs(got.objects) do
    if want.objects[key] == nil then return key .. " is extra" end
  end
end

local function table_text(results)
  local header = { "request \\ fault" }
  for _, f in ipairs(FAULTS) do header[#header + 1] = f.label end
  local lines = { "| " .. table.concat(header, " | ") .. " |" }
  local sep = {}
  for i = 1, #header do sep[i] = "---" end
  lines[#lines + 1] = "|" .. table.concat(sep, "|") .. "|"
  for _, row in ipairs(ROWS) do
    local cells = { row.label }
    for _, f in ipairs(FAULTS) do cells[#cells + 1] = results[row.id .. "/" .. f.id] or "" end
    lines[#lines + 1] = "| " .. table.concat(cells, " | ") .. " |"
  end
  return table.concat(lines, "\n")
end

describe("fault campaign: migration 59 on a " .. FLEET .. "-VM fleet", function()
  local dir, fixture, needs, srv, before, reference
  local results, passed, total = {}, 0, 0
  local env = { COZY_MIGRATE_PAGE_LIMIT = tostring(PAGE) }

  setup(function()
    dir = campaign.tmpdir()
    fixture, needs = campaign.fleet(dir, FLEET)
    srv = campaign.server(fixture, dir)
    before = campaign.state(srv)
    local r = campaign.runner.run(args_of(srv, {}), env)
    assert(r.code == 0, r.stderr)
    reference = campaign.state(srv)
    assert(reference.version == "60", "the uninterrupted run did not stamp 60")
    campaign.assert_patched_once(srv, needs, "uninterrupted run")
    assert(campaign.count(needs) == FLEET // 3)
    assert(#campaign.duplicated(reference) == 0)
  end)

  teardown(function()
    if srv then srv:stop() end
    campaign.rmdir(dir)
    print(("\nfault campaign: %d of %d cells passed (pass: the run succeeded; fail-closed: exit 1, nothing"
      .. " stamped, the rerun completed)\n"):format(passed, total))
    print(table_text(results))
  end)

  local n = 0
  for _, row in ipairs(ROWS) do
    for _, fault in ipairs(FAULTS) do
      if fault.applies == nil or fault.applies(row) then
        it(row.id .. " x " .. fault.id, function()
          n = n + 1
          total = total + 1
          local where = row.id .. " x " .. fault.id
          -- a request the previous cell's fault still holds (a delay past the
          -- runner's timeout) must land before the reset, not in this cell
          assert(campaign.poll(30, function()
            for _, e in ipairs(srv:requests()) do
              if type(e.status) ~= "number" then return false end
            end
            return true
          end), where .. ": a request of the previous cell is still being served")
          srv:reset(fixture)
          local rules = {}
          for _, s in ipairs(row.setup or {}) do rules[#rules + 1] = s end
          rules[#rules + 1] = rule_for(row, fault, srv, n)
          srv:faults(rules)
          local run_env = merged(env, row.env)

          local first = campaign.runner.run(args_of(srv, row), run_env)
          -- every rule of the cell met its request
          for i, r in ipairs(srv:control("GET", "/_fake/faults")) do
            assert(r.fired >= 1, ("%s: fault rule %d (%s %s) never fired:\n%s"):format(
              where, i, tostring(r.method), tostring(r.path), first.stderr))
          end
          local fired = {}
          for _, a in ipairs(srv:fired()) do fired[a] = true end
          local action = ACTIONS[fault.id]
          assert(fired[action], where .. ": no request log entry with fault " .. action)
          -- and the request it met is the row's (a renewal, not the release...)
          local log = srv:requests()
          for i, e in ipairs(log) do
            if e.fault and e.fault.rule == #rules - 1 and row.is_target then
              assert(row.is_target(e, log, i), where .. ": the fault met another request: " .. e.method .. " "
                .. e.path .. " " .. tostring(e.body))
            end
          end

          local after_first = campaign.state(srv)
          local outcome
          local expected = FAIL_CLOSED[row.id .. "/" .. fault.id]
          local either = EITHER[row.id .. "/" .. fault.id]
          if either and first.code ~= 0 then expected = either end
          if expected then
            assert(first.code ~= 0, where .. ": succeeded, but the engine should have stopped with \""
              .. expected .. "\"\n" .. first.stderr)
            assert(first.stderr:find(expected, 1, true), where .. ": failed without \"" .. expected .. "\":\n"
              .. first.stderr)
          else
            assert(first.code == 0, where .. ": failed where the engine retries through:\n" .. first.stderr)
          end
          if first.code == 0 then
            outcome = "pass"
            local diff = first_difference(reference, after_first)
            assert(diff == nil, where .. ": succeeded with other objects: " .. tostring(diff) .. "\n" .. first.stderr)
          else
            outcome = "fail-closed"
            assert(first.code == 1, where .. ": exit " .. first.code .. "\n" .. first.stderr)
            assert(after_first.version == "59", where .. ": stamped " .. tostring(after_first.version) .. " after a failure")
            assert(#after_first.history == 0, where .. ": a history entry after a failure")
            campaign.assert_each_of(after_first, { before, reference }, where)
          end
          assert(#campaign.duplicated(after_first) == 0, where .. ": " .. table.concat(campaign.duplicated(after_first), ", "))

          srv:clear_faults()
          local again = campaign.runner.run(args_of(srv, row, "--lock-timeout", "30"), run_env)
          assert(again.code == 0, where .. ": the rerun failed: " .. again.stderr)
          local whole = srv:requests()
          if first.code == 0 then
            -- up to date: it wrote nothing, so the objects are still the reference
            for i = #log + 1, #whole do
              assert(whole[i].method == "GET", where .. ": the rerun of a completed run wrote: "
                .. whole[i].method .. " " .. whole[i].path)
            end
          else
            local diff = first_difference(reference, campaign.state(srv))
            assert(diff == nil, where .. ": the rerun left other objects: " .. tostring(diff))
          end
          campaign.assert_patched_once(srv, needs, where, whole)

          if outcome == "fail-closed" then outcome = "fail-closed, rerun ok" end
          if either then outcome = "pass, or fail-closed and rerun ok (timing)" end
          results[row.id .. "/" .. fault.id] = outcome
          passed = passed + 1
        end)
      end
    end
  end

  -- runs after every cell: the documented table is the one just measured
  it("is the table kept in docs/reliability.md", function()
    local f = assert(io.open("docs/reliability.md"))
    local doc = f:read("a")
    f:close()
    local text = table_text(results)
    assert(doc:find(text, 1, true), "docs/reliability.md does not hold the table measured now:\n" .. text)
  end)
end)
