-- cozy.diff: a line-based unified diff, as `diff -u` (and so `kubectl
-- diff`) shows one: "--- from" / "+++ to" headers, "@@ -l,s +l,s @@"
-- hunks with 3 lines of context (hunks whose context would touch are one
-- hunk), in each run of changes the removed lines before the added ones.
--
-- The edit script is Myers' shortest one (O((N+M)·D) time), after the
-- common head and tail are set aside; when more than MAX_EDITS lines
-- differ, the rest is shown as all removed and all added, so a huge change
-- costs linear time and memory rather than quadratic.
local line_diff = require "cozy.line_diff"

local diff = {}

diff.CONTEXT = 3
diff.MAX_EDITS = 2000

-- The shortest edit script turning a into b (arrays of lines), as ops
-- { op = " " | "-" | "+", line }, or nil when d would pass max_d.
local function myers(a, b, max_d)
  local n, m = #a, #b
  local v = { [1] = 0 }
  local trace = {}
  for d = 0, math.min(n + m, max_d) do
    local snapshot = {}
    for k = -d - 1, d + 1 do snapshot[k] = v[k] end
    trace[d] = snapshot
    for k = -d, d, 2 do
      local x
      if k == -d or (k ~= d and (v[k - 1] or -1) < (v[k + 1] or -1)) then
        x = v[k + 1] or 0
      else
        x = (v[k - 1] or 0) + 1
      end
      local y = x - k
      while x < n and y < m and a[x + 1] == b[y + 1] do x, y = x + 1, y + 1 end
      v[k] = x
      if x >= n and y >= m then
        -- walk back from (n, m) through the snapshots
        local ops = {}
        local cx, cy = n, m
        for dd = d, 1, -1 do
          local pv = trace[dd]
          local kk = cx - cy
          local pk
          if kk == -dd or (kk ~= dd and (pv[kk - 1] or -1) < (pv[kk + 1] or -1)) then pk =
            kk + 1 else pk = kk - 1 end
          local px = pv[pk] or 0
          local py = px - pk
          while cx > px and cy > py do
            ops[#ops + 1] = { op = " ", line = a[cx] }
            cx, cy = cx - 1, cy - 1
          end
          if cx == px then
            ops[#ops + 1] = { op = "+", line = b[cy] }
          else
            ops[#ops + 1] = { op = "-", line = a[cx] }
          end
          cx, cy = px, py
        end
        while cx > 0 and cy > 0 do
          ops[#ops + 1] = { op = " ", line = a[cx] }
          cx, cy = cx - 1, cy - 1
        end
        -- reversed, into the order of the lines
        local out = {}
        for i = #ops, 1, -1 do out[#out + 1] = ops[i] end
        return out
      end
    end
  end
  return nil
end

-- The edit script of a into b in three parts: a's first `head` lines,
-- equal to b's; the ops of the rest but the last `tail` lines (equal too),
-- by Myers; those. Only the middle is made of op tables: an object's two
-- sides share most of their lines, and a table per line of them was most
-- of a plan's diff.
local function script(a, b)
  local n, m = #a, #b
  local head = 0
  while head < n and head < m and a[head + 1] == b[head + 1] do head = head + 1 end
  local tail = 0
  while tail < n - head and tail < m - head and a[n - tail] == b[m - tail] do tail = tail + 1 end
  local ma, mb = table.move(a, head + 1, n - tail, 1, {}), table.move(b, head + 1, m - tail, 1, {})
  local middle = myers(ma, mb, diff.MAX_EDITS)
  if middle == nil then
    middle = {}
    for _, l in ipairs(ma) do middle[#middle + 1] = { op = "-", line = l } end
    for _, l in ipairs(mb) do middle[#middle + 1] = { op = "+", line = l } end
  end
  -- in each run of changes, what goes before what comes
  local out = {}
  local i = 1
  while i <= #middle do
    if middle[i].op == " " then
      out[#out + 1] = middle[i]
      i = i + 1
    else
      local j = i
      while j <= #middle and middle[j].op ~= " " do j = j + 1 end
      for _, want in ipairs { "-", "+" } do
        for x = i, j - 1 do
          if middle[x].op == want then out[#out + 1] = middle[x] end
        end
      end
      i = j
    end
  end
  return head, out, tail
end

-- The edit script of a into b: equal head and tail, Myers in between.
function diff.ops(a, b)
  local head, middle, tail = script(a, b)
  local out = {}
  for i = 1, head do out[#out + 1] = { op = " ", line = a[i] } end
  table.move(middle, 1, #middle, #out + 1, out)
  for x = #a - tail + 1, #a do out[#out + 1] = { op = " ", line = a[x] } end
  return out
end

-- "@@ -l,s +l,s @@" as diff writes it: ",1" left out, an empty range
-- starting at the line before it.
local function range(start, count)
  if count == 1 then return tostring(start) end
  if count == 0 then return ("%d,0"):format(start - 1) end
  return ("%d,%d"):format(start, count)
end

-- The unified diff of a into b (arrays of lines, no newlines), labelled
-- `from` and `to`: an array of lines, empty when they are equal. In C
-- (cozy.line_diff, a sixth of a plan's Lua in Lua) for arguments as the
-- plan passes them; unified_lua, the definition it is checked against
-- (spec/unit/line_diff_spec.lua), for the rest.
function diff.unified(a, b, from, to, context)
  context = context or diff.CONTEXT
  return line_diff.unified(a, b, from, to, context, diff.MAX_EDITS)
    or diff.unified_lua(a, b, from, to, context)
end

-- diff.unified in Lua alone.
function diff.unified_lua(a, b, from, to, context)
  context = context or diff.CONTEXT
  local head, middle, tail = script(a, b)
  local n, m, nm = #a, #b, #middle
  -- the middle's ops' line numbers in a and b, and where each change is in
  -- the whole script (head, middle, tail)
  local ai, bi = head + 1, head + 1
  local changes = {}
  for i, o in ipairs(middle) do
    o.a, o.b = ai, bi
    if o.op ~= "+" then ai = ai + 1 end
    if o.op ~= "-" then bi = bi + 1 end
    if o.op ~= " " then changes[#changes + 1] = head + i end
  end
  if #changes == 0 then return {} end
  -- the script's i-th op: op, line, its line numbers in a and b
  local function op_at(i)
    if i <= head then return " ", a[i], i, i end
    if i <= head + nm then
      local o = middle[i - head]
      return o.op, o.line, o.a, o.b
    end
    local j = i - head - nm
    return " ", a[n - tail + j], n - tail + j, m - tail + j
  end
  local total = head + nm + tail
  local out = { "--- " .. from, "+++ " .. to }
  local c = 1
  while c <= #changes do
    local first = math.max(1, changes[c] - context)
    local last_change = changes[c]
    -- hunks whose context would touch or overlap are one
    while c < #changes and changes[c + 1] - last_change <= 2 * context + 1 do
      c = c + 1
      last_change = changes[c]
    end
    local last = math.min(total, last_change + context)
    local a_start, a_count, b_start, b_count = nil, 0, nil, 0
    local body = {}
    for i = first, last do
      local op, line, oa, ob = op_at(i)
      if op ~= "+" then a_start, a_count = a_start or oa, a_count + 1 end
      if op ~= "-" then b_start, b_count = b_start or ob, b_count + 1 end
      body[#body + 1] = op .. line
    end
    if a_start == nil or b_start == nil then
      local _, _, fa, fb = op_at(first)
      a_start, b_start = a_start or fa, b_start or fb
    end
    out[#out + 1] = ("@@ -%s +%s @@"):format(range(a_start, a_count), range(b_start, b_count))
    table.move(body, 1, #body, #out + 1, out)
    c = c + 1
  end
  return out
end

return diff
