-- Expire the leases of runners that stopped heartbeating: each request they held ends
-- with a 'runner_lost' error event, so no synchronous client waits forever.
-- KEYS: 1 leases zset
-- ARGV: 1 request key prefix, 2 events key prefix, 3 encoded Failed event, 4 result ttl s
-- Returns the ids whose leases expired.
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  local rkey = ARGV[1] .. id
  if redis.call('HGET', rkey, 'state') == 'claimed' then
    redis.call('HSET', rkey, 'state', 'failed', 'error', 'runner_lost')
    local ekey = ARGV[2] .. id
    redis.call('XADD', ekey, '*', 'e', ARGV[3])
    redis.call('EXPIRE', ekey, tonumber(ARGV[4]))
  end
end
return expired
