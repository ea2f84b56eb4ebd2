-- The prelude every script in this directory is loaded with (`scripts.lua_source` puts it
-- first): the helpers the scripts share. No script defines a name this one does.

-- The server's clock in milliseconds (TIME: seconds and microseconds).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A token on a signal list its consumer blocks on (the collector, the webhook sender),
-- at most `max` kept.
local function push_signal(list, max)
  redis.call('RPUSH', list, '1')
  redis.call('LTRIM', list, -max, -1)
end

-- Wake the runners of a queue: a token on its signal list for an idle runner blocked on
-- it, and news on the channel of the same name for a busy one (it claims only on news);
-- at most `max` tokens kept.
local function wake_runners(signal, max)
  redis.call('RPUSH', signal, '1')
  redis.call('PUBLISH', signal, '1')
  redis.call('LTRIM', signal, -max, -1)
end

-- Wake the controller for `deployment`: its name on the controller's wake list, at most
-- `max` kept.
local function wake_controller(wake, deployment, max)
  redis.call('RPUSH', wake, deployment)
  redis.call('LTRIM', wake, -max, -1)
end


-- Forget a tenant's stored responses that expired (their index score, s, is past `now`):
-- each one's bytes leave the tenant's total; at most `limit` at a time.
local function stored_responses_prune(index, sizes, now, limit)
  local expired = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    local size = tonumber(redis.call('HGET', sizes, id) or '0')
    redis.call('HINCRBY', sizes, '_total', -size)
    redis.call('HDEL', sizes, id)
    redis.call('ZREM', index, id)
  end
end
