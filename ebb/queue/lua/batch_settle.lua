-- Record a settled batch, stop watching it and, when it has a webhook, create its one
-- batch.completed delivery (at most once, however often this runs).
-- KEYS: 1 batch record, 2 active batches set, 3 announced marker, 4 the batch's delivery
--       list, 5 deliveries due zset, 6 delivery signal list
-- ARGV: 1 record (json), 2 batch id, 3 record ttl (s), 4 tenant, 5 webhook url ('' none),
--       6 webhook id, 7 body, 8 delivery key prefix, 9 delivery ttl (s), 10 signal list max
-- Returns 1 when a delivery was created, else 0.
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
redis.call('SREM', KEYS[2], ARGV[2])
if ARGV[5] == '' then
  return 0
end
local ttl = tonumber(ARGV[9])
if not redis.call('SET', KEYS[3], ARGV[6], 'NX', 'EX', ttl) then
  return 0
end
local now = now_ms()
local dkey = ARGV[8] .. ARGV[6]
redis.call('HSET', dkey, 'webhook_id', ARGV[6], 'job_id', ARGV[2], 'tenant', ARGV[4],
  'url', ARGV[5], 'event', 'batch.completed', 'body', ARGV[7], 'created_ms', now,
  'state', 'pending', 'attempts', 0, 'next_ms', now)
redis.call('EXPIRE', dkey, ttl)
redis.call('RPUSH', KEYS[4], ARGV[6])
redis.call('EXPIRE', KEYS[4], ttl)
redis.call('ZADD', KEYS[5], now, ARGV[6])
push_signal(KEYS[6], tonumber(ARGV[10]))
return 1
