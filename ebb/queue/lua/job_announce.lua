-- Turn a job's events into deliveries, each at most once (the job hash remembers which
-- were announced), and stop watching a settled job once its events are announced.
-- KEYS: 1 job hash, 2 job's delivery list, 3 deliveries due zset, 4 delivery signal list,
--       5 watch set, 6 waiting zset
-- ARGV: 1 job id, 2 tenant, 3 webhook url, 4 delivery key prefix, 5 delivery ttl s,
--       6 settled job retention s, 7 signal list max, 8 announced-field prefix,
--       9 the job's traceparent ('' when untraced),
--       10 number of terminal statuses N, 11..10+N terminal statuses,
--       then per event: event type, webhook id, body ('' marks it announced, undelivered)
-- Returns the number of deliveries created.
local now = now_ms()
local ttl = tonumber(ARGV[5])
local n = tonumber(ARGV[10])
local created = 0
for i = 11 + n, #ARGV, 3 do
  local event, wid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local fresh = redis.call('HSETNX', KEYS[1], ARGV[8] .. event, wid)
  if fresh == 1 and body ~= '' then
    local dkey = ARGV[4] .. wid
    redis.call('HSET', dkey, 'webhook_id', wid, 'job_id', ARGV[1], 'tenant', ARGV[2],
      'url', ARGV[3], 'event', event, 'body', body, 'created_ms', now, 'state', 'pending',
      'attempts', 0, 'next_ms', now)
    if ARGV[9] ~= '' then
      redis.call('HSET', dkey, 'traceparent', ARGV[9])
    end
    redis.call('EXPIRE', dkey, ttl)
    redis.call('RPUSH', KEYS[2], wid)
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('ZADD', KEYS[3], now, wid)
    created = created + 1
  end
end
if created > 0 then
  push_signal(KEYS[4], tonumber(ARGV[7]))
end
local status = redis.call('HGET', KEYS[1], 'status')
for i = 11, 10 + n do
  if status == ARGV[i] then
    redis.call('SREM', KEYS[5], ARGV[1])
    redis.call('ZREM', KEYS[6], ARGV[1])
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
  end
end
return created
