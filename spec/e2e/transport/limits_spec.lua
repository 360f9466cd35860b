-- Bounded reads (issue 13): a response body above max_response_bytes is
-- refused WHILE it is read, whatever its framing (Content-Length, chunked) or
-- encoding (gzip: the decompressed size counts), with a ResponseTooLarge
-- error naming the limit; and the memory it costs stays far below the body.
-- Each case runs in a child cozy-migrate that reports its peak RSS (VmHWM);
-- a small request in the same run is the baseline, and a body under the
-- limit shows the measure does see a body's memory.
local hostile = require("spec.helpers").hostile

local MIB = 1024 * 1024
local GIB = 1024 * MIB
local LIMIT = 8 * MIB

describe("transport max_response_bytes", function()
  local srv, baseline
  setup(function()
    srv = hostile.start()
    local res = srv:fetch("/plain/1024", { max_response_bytes = LIMIT })
    assert.is_true(res.ok, res.error)
    baseline = res.hwm_kib * 1024
  end)
  teardown(function() if srv then srv:stop() end end)

  local function log_for(path)
    local found
    for _, e in ipairs(srv:log()) do
      if e.path == path then found = e end
    end
    return found
  end

  local function assert_refused(res, limit)
    assert.is_false(res.ok)
    assert.equal("ResponseTooLarge", res.reason, res.error)
    assert.truthy(res.error:find(("max_response_bytes (%d bytes, counted after decompression)"):format(limit), 1, true),
      res.error)
    assert.equal(1, res.attempts, "a refused body is the same answer again: not retried")
  end

  -- growth of the child's peak RSS over the baseline's, in bytes
  local function growth(res) return res.hwm_kib * 1024 - baseline end

  for _, mode in ipairs { "plain", "chunked", "gzip" } do
    it("refuses a 1 GiB " .. mode .. " body at an 8 MiB limit, its memory a small fraction of the body", function()
      local path = ("/%s/%d"):format(mode, GIB)
      local res = srv:fetch(path, { max_response_bytes = LIMIT })
      assert_refused(res, LIMIT)
      -- The limit allows up to 8 MiB of buffer (plus its Lua copy at most);
      -- reading the whole body would cost a GiB or more.
      assert.is_true(growth(res) < GIB / 16,
        ("peak RSS grew by %.1f MiB for a 1 GiB body"):format(growth(res) / MIB))
      local e = log_for(path)
      assert.truthy(e, "the hostile server did not see " .. path)
      if mode ~= "gzip" then
        -- the client hung up: most of the body was never sent
        assert.is_false(e.complete)
        assert.is_true(e.sent < GIB / 8, "sent " .. e.sent)
      end
    end)
  end

  it("counts the decompressed size: a gzip body whose wire size is under the limit is refused", function()
    -- 64 MiB of content in about 64 KiB of gzip
    local res = srv:fetch(("/gzip/%d"):format(64 * MIB), { max_response_bytes = LIMIT })
    assert_refused(res, LIMIT)
  end)

  for _, mode in ipairs { "plain", "chunked", "gzip" } do
    it("accepts a " .. mode .. " body of exactly the limit and refuses one byte more", function()
      local limit = 300000
      local ok = srv:fetch(("/%s/%d"):format(mode, limit), { max_response_bytes = limit })
      assert.is_true(ok.ok, ok.error)
      assert.equal(limit - 104, ok.pad_len) -- the body around data.pad is 104 bytes
      local over = srv:fetch(("/%s/%d"):format(mode, limit + 1), { max_response_bytes = limit })
      assert_refused(over, limit)
    end)
  end

  it("reads a body under the limit whole, and the measure sees its memory", function()
    -- the control for the ratios above: 48 MiB read under a 64 MiB limit
    local res = srv:fetch(("/chunked/%d"):format(48 * MIB), { max_response_bytes = 64 * MIB })
    assert.is_true(res.ok, res.error)
    assert.equal(48 * MIB - 104, res.pad_len)
    assert.is_true(growth(res) >= 48 * MIB,
      ("peak RSS grew by only %.1f MiB for a 48 MiB body"):format(growth(res) / MIB))
  end)

  it("defaults to 256 MiB and refuses a larger Content-Length before reading it", function()
    local res = srv:fetch(("/plain/%d"):format(GIB))
    assert_refused(res, 256 * MIB)
    assert.is_true(growth(res) < 16 * MIB, ("peak RSS grew by %.1f MiB"):format(growth(res) / MIB))
    local ok = srv:fetch("/plain/4096")
    assert.is_true(ok.ok, ok.error)
    assert.equal(256 * MIB, ok.max_response_bytes)
  end)

  it("refuses a limit that is not a positive number of bytes", function()
    local transport = require "cozy.transport"
    for _, bad in ipairs { 0, -5, 1e300 } do
      local ok, err = pcall(transport.new, { kubeconfig = srv.kubeconfig, max_response_bytes = bad })
      assert.is_false(ok, tostring(bad))
      assert.matches("max_response_bytes", err)
    end
    local ok, err = pcall(transport.new, { kubeconfig = srv.kubeconfig, max_response_bytes = "big" })
    assert.is_false(ok)
    assert.matches("option 'max_response_bytes' must be a number", err)
  end)
end)
