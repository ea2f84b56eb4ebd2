-- A runner is known dead (its process exited): the leases of the requests it held expire
-- now, so that the next reap continues them at once rather than a lease TTL later.
-- KEYS: 1 leases zset
-- ARGV: 1 request key prefix, 2 runner id
-- Returns how many leases it expired.
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local n = 0
for _, id in ipairs(ids) do
  if redis.call('HGET', ARGV[1] .. id, 'runner') == ARGV[2] then
    redis.call('ZADD', KEYS[1], 0, id)
    n = n + 1
  end
end
return n
