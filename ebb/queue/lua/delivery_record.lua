-- Record one delivery attempt and what follows from it: delivered (final), retry at a
-- given time, or failed (gave up). The attempt is always recorded; the schedule changes
-- only while this worker still owns the delivery (its lease did not pass to another).
-- KEYS: 1 delivery hash, 2 attempts list, 3 due zset
-- ARGV: 1 webhook id, 2 owner, 3 attempt (json), 4 outcome: delivered | retry | failed,
--       5 next attempt ms (retry), 6 http status (0: none), 7 error text, 8 record ttl s
-- Returns 1 when the schedule changed, 0 when it was left to someone else.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local now = now_ms()
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[8]))
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'last_status', ARGV[6], 'last_error', ARGV[7])
local fields = redis.call('HMGET', KEYS[1], 'state', 'owner')
if fields[1] ~= 'pending' then return 0 end
if ARGV[4] == 'delivered' then
  redis.call('HSET', KEYS[1], 'state', 'delivered', 'delivered_ms', now, 'owner', '')
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
if fields[2] ~= ARGV[2] then return 0 end
if ARGV[4] == 'failed' then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'owner', '', 'next_ms', 0)
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], 'next_ms', ARGV[5], 'owner', '')
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[1])
return 1
