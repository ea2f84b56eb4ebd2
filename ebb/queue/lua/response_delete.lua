-- Delete a stored response (or give back the room a response never stored held): its
-- record, and its share of its tenant's caps.
-- KEYS: 1 the response's record, 2 the tenant's response index, 3 its sizes (as
--       response_reserve's)
-- ARGV: 1 response id
-- Returns 1 when a record was deleted, 0 otherwise.
local deleted = redis.call('DEL', KEYS[1])
local size = redis.call('HGET', KEYS[3], ARGV[1])
if size then
  redis.call('HINCRBY', KEYS[3], '_total', -tonumber(size))
  redis.call('HDEL', KEYS[3], ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
return deleted
