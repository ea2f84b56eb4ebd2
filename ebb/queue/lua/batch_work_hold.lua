-- Take or renew the lease on queueing a validating batch's lines: one frontdoor at a
-- time does it (the one that created the batch, or, once its lease lapsed because it
-- died, the first watcher to look). A free (expired) lease goes to the first caller; its
-- holder renews it; anyone else is refused.
-- KEYS: 1 the batch's worker lease
-- ARGV: 1 holder id, 2 lease ttl ms
-- Returns 1 when the caller holds the lease now, else 0.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
