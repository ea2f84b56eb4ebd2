-- A runner proves it is alive and extends the leases of the requests it holds, on the
-- Redis clock (the one claims and the reaper use). ZADD XX only moves existing leases:
-- one the reaper already expired stays expired.
-- KEYS: 1 runner hash, 2 leases zset
-- ARGV: 1 lease ttl ms, 2.. request ids
local now = now_ms()
redis.call('HSET', KEYS[1], 'heartbeat_ms', now)
local expiry = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[i])
end
return now
