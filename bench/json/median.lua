-- The median of an array of numbers (the array is left as it was), for the
-- benchmarks of bench/json/.
--
--   local median = dofile(here .. "/bench/json/median.lua")
return function(t)
  local s = { table.unpack(t) }
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end
