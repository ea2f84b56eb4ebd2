-- Fold a batch of booked ledger entries into the hourly aggregates and advance the
-- consumer's cursors, in one step: a batch is folded entirely and once, or not at all.
-- The cursors act as a compare-and-set, so a second consumer (or one restarted after a
-- crash between reading and folding) can never fold the same records twice.
-- A request id already billed (today or yesterday, UTC) is skipped: billed once.
-- KEYS: 1 ledger state hash, 2 hours index zset
-- ARGV: 1 expected usage cursor, 2 expected gpu cursor, 3 expected closed_through_ms,
--       4 new usage cursor, 5 new gpu cursor, 6 aggregates key prefix, 7 lines key prefix,
--       8 seen key prefix, 9 seen ttl s, 10 entries (json list of
--       {h: hour ms, id: request id or '', d: day, pd: previous day, inc: [[field, n]...],
--        l: line})
-- Returns {1, folded, duplicates}, or {0, 0, 0} when the state moved under the caller.
local st = redis.call('HMGET', KEYS[1], 'usage_cursor', 'gpu_cursor', 'closed_through_ms')
if (st[1] or '0-0') ~= ARGV[1] or (st[2] or '0-0') ~= ARGV[2] or (st[3] or '') ~= ARGV[3] then
  return {0, 0, 0}
end
local folded, duplicates = 0, 0
local days, hours = {}, {}
for _, op in ipairs(cjson.decode(ARGV[10])) do
  local fresh = true
  if op.id ~= '' then
    fresh = redis.call('HEXISTS', ARGV[8] .. op.pd, op.id) == 0
      and redis.call('HSETNX', ARGV[8] .. op.d, op.id, '1') == 1
    days[op.d] = true
  end
  if fresh then
    local agg = ARGV[6] .. op.h
    for _, inc in ipairs(op.inc) do
      redis.call('HINCRBY', agg, inc[1], inc[2])
    end
    redis.call('RPUSH', ARGV[7] .. op.h, op.l)
    hours[op.h] = true
    folded = folded + 1
  else
    duplicates = duplicates + 1
  end
end
for day in pairs(days) do
  redis.call('EXPIRE', ARGV[8] .. day, tonumber(ARGV[9]))
end
for hour in pairs(hours) do
  redis.call('ZADD', KEYS[2], hour, hour)
end
redis.call('HSET', KEYS[1], 'usage_cursor', ARGV[4], 'gpu_cursor', ARGV[5])
return {1, folded, duplicates}
