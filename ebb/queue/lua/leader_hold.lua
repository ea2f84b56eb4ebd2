-- Acquire or renew the controller's leader lease: exactly one holder at a time, on the
-- Redis clock. A free (expired) lease goes to the first caller; its holder renews it; any
-- other caller is refused. Acquiring starts a new term (a counter, for logs and fencing).
-- KEYS: 1 leader string, 2 term counter
-- ARGV: 1 holder id, 2 lease ttl ms
-- Returns {held (1|0), term}: the term the caller now leads, or the current one.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
