-- Give back a file's share of its tenant's caps and take it off the retention sweep's
-- list: once, however often this runs (a delete and the sweep may race).
-- KEYS: 1 the tenant's files hash (id -> bytes), 2 the tenant's bytes total, 3 expiry zset
-- ARGV: 1 file id, 2 expiry member ("<file id> <tenant>")
-- Returns 1 when its share was given back now, 0 when it held none.
redis.call('ZREM', KEYS[3], ARGV[2])
local size = redis.call('HGET', KEYS[1], ARGV[1])
if not size then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('DECRBY', KEYS[2], tonumber(size)) <= 0 then
  redis.call('DEL', KEYS[2])
end
return 1
