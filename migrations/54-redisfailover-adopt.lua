-- Migration 54: adopt every RedisFailover onto the new redis-operator's group, engine pinned.
--
-- A port of the platform's script 54 (docs/migrations/54-redisfailover-adopt.md).
-- redis-operator v3.3.5 sees only RedisFailovers labelled
-- redis-failover.freshworks.com/operator-group=cozystack, and its default image moved
-- from Redis 6.2.6 to 7.2.4, which rewrites dump.rdb in a format 6.2.6 cannot read. So
-- before the new operator starts, each RedisFailover gets the label and, where
-- spec.redis.image or spec.sentinel.image is empty, redis:6.2.6-alpine (an image
-- already set stays). Strict, as the shell (writes = "stop", the default): a write that
-- fails fails the step and the version stays at 54. An absent CRD (no Redis installed)
-- is nothing to adopt.
local obj = require "cozy.obj"
local rule = require "cozy.rule"

local IMAGE, GROUP = "redis:6.2.6-alpine", "redis-failover.freshworks.com/operator-group"

-- spec.<part>.image pinned where empty (absent, null or ""), the rest of spec.<part> kept;
-- returns whether it pinned
local function pin(rf, part)
  if (obj.get(rf, { "spec", part, "image" }) or "") ~= "" then return false end
  rf.spec = type(rf.spec) == "table" and rf.spec or {}
  rf.spec[part] = type(rf.spec[part]) == "table" and rf.spec[part] or {}
  rf.spec[part].image = IMAGE
  return true
end

return rule {
  description = "label every RedisFailover for the new redis-operator and pin its empty images"
    .. " to redis:6.2.6-alpine",
  select = {
    failovers = { "redisfailovers.databases.spotahome.com", edit = true,
      unserved = "RedisFailover CRD not present, nothing to adopt: {why}",
      outcome = { adopted = "changed", already = "unchanged", gone = "absent" } },
  },
  walk = function(_, s)
    s.failovers:each(function(rf)
      local labelled = obj.set_label(rf, GROUP, "cozystack")
      local redis, sentinel = pin(rf, "redis"), pin(rf, "sentinel")
      return labelled or redis or sentinel
    end)
  end,
}
