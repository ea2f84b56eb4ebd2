-- Reserve a file's place under its tenant's caps (count and bytes) before its content is
-- written, so that two uploads at the cap's edge cannot both pass; list it for the
-- retention sweep. Reserving a file id already held changes nothing.
-- KEYS: 1 the tenant's files hash (id -> bytes), 2 the tenant's bytes total, 3 expiry zset
-- ARGV: 1 file id, 2 its bytes, 3 max files, 4 max bytes, 5 expires at (epoch s),
--       6 expiry member ("<file id> <tenant>"), 7 '1': never refuse (files the platform
--       writes: a batch's output and error files)
-- Returns {1, '', files, bytes} when held, {0, 'count'|'bytes', files, bytes} when the
-- reservation would pass that cap (files, bytes: the tenant's holdings before it).
local size = tonumber(ARGV[2])
local files = redis.call('HLEN', KEYS[1])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {1, '', files, held}
end
if ARGV[7] ~= '1' then
  if files + 1 > tonumber(ARGV[3]) then
    return {0, 'count', files, held}
  end
  if held + size > tonumber(ARGV[4]) then
    return {0, 'bytes', files, held}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], size)
redis.call('INCRBY', KEYS[2], size)
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[6])
return {1, '', files, held}
