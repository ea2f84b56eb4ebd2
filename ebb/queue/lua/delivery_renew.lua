-- A worker still attempting deliveries (waiting on a busy endpoint or a slow answer)
-- extends their in-flight leases; ones it no longer owns are left alone.
-- KEYS: 1 due zset
-- ARGV: 1 lease ms, 2 owner, 3 delivery key prefix, 4.. webhook ids
local now = now_ms()
for i = 4, #ARGV do
  if redis.call('HGET', ARGV[3] .. ARGV[i], 'owner') == ARGV[2] then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  end
end
return 1
