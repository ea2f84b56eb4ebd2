-- Drop the oldest entries of a tenant's job listing whose job records have expired (the
-- listing has no TTL of its own). Called on every submission, it removes up to ARGV[2]
-- each time, so the listing stays about as long as the tenant's retained jobs.
-- KEYS: 1 the tenant's job index (zset, all scores 0, ids in creation order)
-- ARGV: 1 job key prefix, 2 how many of the oldest entries to look at
-- Returns how many entries were dropped.
local oldest = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local dropped = 0
for _, id in ipairs(oldest) do
  if redis.call('EXISTS', ARGV[1] .. id) == 0 then
    redis.call('ZREM', KEYS[1], id)
    dropped = dropped + 1
  end
end
return dropped
