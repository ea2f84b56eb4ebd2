-- Close the oldest open hour of the ledger once it is over (plus a grace for late GPU
-- segments) and every record appended so far has been folded. From here on the hour's
-- aggregates never change; anything that still arrives for it is booked into the next
-- open hour. The close is written into the GPU stream as a marker, so replaying the raw
-- streams (reconcile) books every record exactly where the consumer booked it. Token
-- records need no marker: their hour is their stream id's, which is always after a close.
-- KEYS: 1 ledger state hash, 2 usage stream, 3 gpu stream, 4 pending exports zset
-- ARGV: 1 expected closed_through_ms, 2 grace ms, 3 hour ms, 4 lines key prefix,
--       5 '1' when hour files are exported (else the hour's lines are dropped)
-- Returns {1, new closed_through_ms}, or {0, reason}: 'conflict', 'early' or 'behind'.
local st = redis.call('HMGET', KEYS[1], 'usage_cursor', 'gpu_cursor', 'closed_through_ms')
if st[3] ~= ARGV[1] then
  return {0, 'conflict'}
end
local now = now_ms()
local closing = tonumber(ARGV[1])
local next_open = closing + tonumber(ARGV[3])
if now < next_open + tonumber(ARGV[2]) then
  return {0, 'early'}
end
local function last_id(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if #last == 0 then return '0-0' end
  return last[1][1]
end
if last_id(KEYS[2]) ~= (st[1] or '0-0') or last_id(KEYS[3]) ~= (st[2] or '0-0') then
  return {0, 'behind'}
end
local next_text = string.format('%d', next_open)
local marker = redis.call('XADD', KEYS[3], '*', 'c', next_text)
redis.call('HSET', KEYS[1], 'gpu_cursor', marker, 'closed_through_ms', next_text)
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[4], closing, ARGV[1])
else
  redis.call('DEL', ARGV[4] .. ARGV[1])
end
return {1, next_text}
