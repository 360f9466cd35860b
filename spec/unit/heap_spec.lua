-- core/heap.c: the Lua state's allocator. Every spec runs on it; these
-- ones move blocks across its edges on purpose (each 16-byte size class,
-- the 512-byte line between its free lists and malloc, resizes in both
-- directions, blocks freed and taken again) and check that nothing a
-- block held was lost or mixed up on the way.

local function text(n, seed)
  -- n bytes that differ from every other length's and seed's
  local unit = string.char(65 + seed % 26, 97 + n % 26, 48 + (n + seed) % 10)
  return (unit:rep(n // 3 + 1)):sub(1, n)
end

describe("the Lua state's heap", function()
  it("keeps strings of every length up to past its small blocks, through collections", function()
    local kept = {}
    for round = 1, 3 do
      for n = 1, 1100 do
        kept[n] = text(n, round)
        -- garbage of the same class between the kept ones, freed below
        local _ = text(n, round + 7) .. "x"
      end
      collectgarbage()
      for n = 1, 1100 do
        assert.are.equal(n, #kept[n])
        assert.are.equal(text(n, round), kept[n])
      end
    end
  end)

  it("keeps a table's contents as it grows past a small block and shrinks back", function()
    local t, h = {}, {}
    for i = 1, 3000 do
      t[i] = i * 7
      h["k" .. i] = text(i % 600 + 1, i)
    end
    for i = 1, 3000 do
      assert.are.equal(i * 7, t[i])
      assert.are.equal(text(i % 600 + 1, i), h["k" .. i])
    end
    -- emptied but for a few: a rehash (at the next insert) shrinks both parts
    for i = 4, 3000 do
      t[i] = nil
      h["k" .. i] = nil
    end
    collectgarbage()
    t.more, h.more = true, true
    assert.are.same({ 7, 14, 21, more = true }, t)
    assert.are.same({ k1 = text(2, 1), k2 = text(3, 2), k3 = text(4, 3), more = true }, h)
  end)

  it("hands freed blocks out again with what the new owner writes, not the old", function()
    -- 20,000 small tables and strings, garbage once it returns
    local function garbage()
      local many = {}
      for i = 1, 20000 do many[i] = { i, tostring(i) } end
      return #many
    end
    for _ = 1, 5 do
      assert.are.equal(20000, garbage())
      collectgarbage()
      local again = {}
      for i = 1, 20000 do again[i] = { -i, "n" .. i } end
      for i = 1, 20000, 997 do
        assert.are.same({ -i, "n" .. i }, again[i])
      end
    end
  end)
end)
