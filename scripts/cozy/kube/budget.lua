-- Retry budgets (docs/engine-api.md, "Retry budgets"): what a migration may
-- ask of the transport's retries for one call or one batch. A budget only
-- lowers the client's bounds (`retry.max_attempts`, `retry.max_time`, the
-- engine's); the backoff and Retry-After between attempts stay the client's,
-- so no budget can make the engine retry harder than it would.
--
-- A request's bounds go to the transport as its own `max_attempts` and
-- `max_time` (core/transport.c, cozy_request_read). A batch's pool of
-- retries (`batch_retries`) is shared by its requests: each reserves the
-- retries it may use when it is prepared, and gives back what it did not use
-- when its answer is read, so the batch together never retries more than
-- the pool, in parallel too.
local sys = require "cozy.sys"
local validate = require "cozy.validate"

local budget = {}

local Budget = {}
Budget.__index = Budget

local keys = { attempts = "call", time = "call", batch_retries = "batch", batch_time = "batch" }

local function count(v, min)
  return math.type(v) == "integer" and v >= min
end

local function seconds(v)
  return type(v) == "number" and v >= 0 and v < math.huge
end

-- The budget of `retry` (a migration's table), or nil when there is none.
-- `batch`: a batch's (batch_retries and batch_time allowed). Raises, at
-- `level`, on anything else: a migration cannot change the backoff.
function budget.new(retry, batch, level)
  if retry == nil then return nil end
  level = (level or 1) + 1
  validate.arg(level, nil, "retry", retry, "table", { says = "a table { attempts =, time = }" })
  for k in pairs(retry) do
    local scope = keys[k]
    if scope == nil or (scope == "batch" and not batch) then
      error(("retry: %s is not a retry budget's (%s); the backoff and Retry-After are the engine's")
        :format(tostring(k),
          batch and "attempts, time, batch_retries, batch_time" or "attempts, time"), level)
    end
  end
  validate.args(level, nil, {
    { "retry.attempts", retry.attempts, function(v) return count(v, 1) end,
      { optional = true, says = "an integer of at least 1 (the first attempt included)" } },
    { "retry.batch_retries", retry.batch_retries, function(v) return count(v, 0) end,
      { optional = true, says = "an integer of at least 0" } },
    { "retry.time", retry.time, seconds, { optional = true, says = "a number of seconds" } },
    { "retry.batch_time", retry.batch_time, seconds,
      { optional = true, says = "a number of seconds" } },
  })
  return setmetatable({
    attempts = retry.attempts, time = retry.time, pool = retry.batch_retries,
    ends = retry.batch_time and sys.monotime() + retry.batch_time,
  }, Budget)
end

-- The bounds of the next request, within the client's (info: max_attempts,
-- max_time): max_attempts, max_time, and the retries it took from the pool.
function Budget:take(info)
  local attempts = math.min(self.attempts or info.max_attempts, info.max_attempts)
  local time = math.min(self.time or info.max_time, info.max_time)
  -- no retry starts after the batch's time: what is left of it now
  if self.ends then time = math.min(time, math.max(0, self.ends - sys.monotime())) end
  local reserved = 0
  if self.pool then
    reserved = math.min(self.pool, attempts - 1)
    self.pool, attempts = self.pool - reserved, 1 + reserved
  end
  return attempts, time, reserved
end

-- A request that took `reserved` retries made `sent` attempts: what it did
-- not use goes back to the pool.
function Budget:give_back(reserved, sent)
  if self.pool then self.pool = self.pool + reserved - math.min(reserved, math.max(0, sent - 1)) end
end

budget.Budget = Budget

return budget
