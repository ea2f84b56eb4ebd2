-- Take room for one new stored response of a tenant under its caps (count and bytes), or
-- refuse: checked and taken at once, so concurrent requests cannot pass the caps together.
-- The room is held for ARGV[2] seconds unless the response is stored by then (response_put).
-- KEYS: 1 the tenant's response index (zset: id -> expiry, s), 2 its sizes (hash: id ->
--       bytes, "_total" -> their sum)
-- ARGV: 1 response id, 2 how long the room is held (s), 3 bytes to hold, 4 most
--       responses, 5 most bytes, 6 most expired entries to forget now
-- Returns {1} when held, {0, count, bytes} (what the tenant holds now) when refused.
local now = math.floor(now_ms() / 1000)
stored_responses_prune(KEYS[1], KEYS[2], now, tonumber(ARGV[6]))
local count = redis.call('ZCARD', KEYS[1])
local total = tonumber(redis.call('HGET', KEYS[2], '_total') or '0')
local size = tonumber(ARGV[3])
if count + 1 > tonumber(ARGV[4]) or total + size > tonumber(ARGV[5]) then
  return {0, count, total}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], size)
redis.call('HINCRBY', KEYS[2], '_total', size)
return {1}
