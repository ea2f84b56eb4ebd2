-- A runner proves it is alive and extends the leases of the requests it holds, on the
-- Redis clock (the one claims and the reaper use). ZADD XX only moves existing leases:
-- one the reaper already expired stays expired. It also says how its engine progresses:
-- steps so far, and how long the engine call in progress has run (0: none).
-- KEYS: 1 runner hash, 2 leases zset
-- ARGV: 1 lease ttl ms, 2 engine steps, 3 engine busy ms, 4.. request ids
local now = now_ms()
redis.call('HSET', KEYS[1], 'heartbeat_ms', now, 'engine_steps', ARGV[2],
  'engine_busy_ms', ARGV[3])
local expiry = now + tonumber(ARGV[1])
for i = 4, #ARGV do
  redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[i])
end
return now
