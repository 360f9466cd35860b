-- cozy.worker and signals: the lease thread never takes a SIGTERM or SIGINT
-- meant for the main thread (whose sleeps and transfers a signal wakes), and
-- starting it leaves the main thread's mask as it was. Read from the kernel's
-- view of each thread (/proc/thread-self/status).
local cli = require("spec.helpers").cli
local worker = require "cozy.worker"

local SIGINT, SIGTERM = 2, 15

local function own_mask()
  local f = assert(io.open("/proc/thread-self/status"))
  local status = f:read("a")
  f:close()
  return assert(status:match("\nSigBlk:%s*(%x+)"))
end

local function blocks(hex, sig)
  return (tonumber(hex, 16) >> (sig - 1)) & 1 == 1
end

describe("cozy.worker signal mask", function()
  it("blocks SIGTERM and SIGINT in the worker thread and restores the main thread's mask", function()
    local before = own_mask()
    assert.is_false(blocks(before, SIGTERM))
    local w <close> = worker.start("spec.fixtures.runner.worker_probe", "sigmask", "")
    local worker_mask = cli.poll(5, function() return w:lost() end)
    assert.truthy(worker_mask, "the probe did not report its mask")
    assert.is_true(blocks(worker_mask, SIGTERM), "worker mask " .. worker_mask)
    assert.is_true(blocks(worker_mask, SIGINT), "worker mask " .. worker_mask)
    assert.equal(before, own_mask())
    assert.is_true(w:stop())
  end)
end)
