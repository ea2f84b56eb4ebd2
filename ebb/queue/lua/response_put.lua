-- Store (or replace) a stored response and count its bytes in its tenant's total.
-- KEYS: 1 the response's record, 2 the tenant's response index, 3 its sizes (as
--       response_reserve's)
-- ARGV: 1 response id, 2 record (json), 3 ttl (s; 0: keep the record's expiry, and store
--       only if it still exists), 4 most expired entries to forget now
-- Returns 1 when stored, 0 when a keep-expiry replacement found no record (deleted or
-- expired meanwhile).
local now = math.floor(now_ms() / 1000)
local ttl = tonumber(ARGV[3])
stored_responses_prune(KEYS[2], KEYS[3], now, tonumber(ARGV[4]))
if ttl == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  -- A record stored before the index existed is not counted (it is never pruned either).
  if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    return 1
  end
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
end
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local size = string.len(ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], size)
redis.call('HINCRBY', KEYS[3], '_total', size - old)
return 1
