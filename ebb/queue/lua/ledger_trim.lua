-- Drop raw token-usage records the ledger no longer needs: those of hours that are closed
-- (folded, final) and, when hour files are exported, exported. Reconcile then checks those
-- hours against their exported files, and the raw records from `usage_trimmed_ms` on.
-- The newest record always stays: hour closing compares the stream's last id with the
-- consumer's cursor.
-- KEYS: 1 ledger state hash, 2 usage stream, 3 pending exports zset
-- ARGV: 1 wanted boundary (ms, an hour start): records with ids before it may go
-- Returns {records removed, boundary now in force}.
local st = redis.call('HMGET', KEYS[1], 'closed_through_ms', 'usage_trimmed_ms')
local closed = tonumber(st[1] or '0')
local before = tonumber(st[2] or '0')
local boundary = math.min(tonumber(ARGV[1]), closed)
local pending = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if #pending > 0 then
  boundary = math.min(boundary, tonumber(pending[2]))
end
if boundary <= before then
  return {0, before}
end
local minid = string.format('%d-0', boundary)
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then
  local last_ms = tonumber(string.match(last[1][1], '^(%d+)'))
  if last_ms < boundary then minid = last[1][1] end
end
local removed = redis.call('XTRIM', KEYS[2], 'MINID', minid)
redis.call('HSET', KEYS[1], 'usage_trimmed_ms', string.format('%d', boundary))
return {removed, boundary}
