-- Migration 54: adopt every RedisFailover onto the new redis-operator's group, engine pinned.
--
-- A port of the platform's script 54 (docs/migrations/54-redisfailover-adopt.md).
-- redis-operator v3.3.5 sees only RedisFailovers labelled
-- redis-failover.freshworks.com/operator-group=cozystack, and its default image moved
-- from Redis 6.2.6 to 7.2.4, which rewrites dump.rdb in a format 6.2.6 cannot read. So
-- before the new operator starts, each RedisFailover gets the label and, where
-- spec.redis.image or spec.sentinel.image is empty, redis:6.2.6-alpine (an image
-- already set stays). Strict, as the shell: a write that fails fails the step and the
-- version stays at 54. An absent CRD (no Redis installed) is nothing to adopt.
local obj = require "cozy.obj"

local IMAGE = "redis:6.2.6-alpine"

-- spec.<part>.image pinned where empty (absent, null or ""), the rest of spec.<part> kept.
local function pin(rf, part)
  if (obj.get(rf, { "spec", part, "image" }) or "") ~= "" then return end
  rf.spec = type(rf.spec) == "table" and rf.spec or {}
  rf.spec[part] = type(rf.spec[part]) == "table" and rf.spec[part] or {}
  rf.spec[part].image = IMAGE
end

return {
  description = "label every RedisFailover for the new redis-operator and pin its empty images to redis:6.2.6-alpine",
  permissions = {
    { verb = "list", group = "databases.spotahome.com", resource = "redisfailovers" },
    { verb = "get", group = "databases.spotahome.com", resource = "redisfailovers" },
    { verb = "patch", group = "databases.spotahome.com", resource = "redisfailovers" },
  },
  walk = function(ctx)
    local rfs, why = ctx.kube:lookup("redisfailovers.databases.spotahome.com")
    if rfs == nil then return ctx.log:info("RedisFailover CRD not present, nothing to adopt: " .. why) end
    local counts = rfs:update_each(rfs:list{}, function(rf)
      obj.set_label(rf, "redis-failover.freshworks.com/operator-group", "cozystack")
      pin(rf, "redis")
      pin(rf, "sentinel")
    end, { label = "RedisFailovers", absent = "skip", describe = function(rf) return "RedisFailover " .. obj.key(rf) end })
    ctx:outcome { adopted = counts.changed, already = counts.unchanged, gone = counts.absent }
  end,
}
