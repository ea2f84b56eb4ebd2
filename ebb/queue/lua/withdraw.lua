-- The frontdoor takes back a request nobody claimed in time (or whose client left).
-- KEYS: 1 queue, 2 request hash
-- ARGV: 1 request id, 2 the state to record ('withdrawn' or 'cancelled')
-- Returns 1 when withdrawn (it will never run), 0 when a runner already holds it.
-- Withdrawing again answers 1: only the request's own frontdoor withdraws it, and a client
-- retrying across a Redis restart resends a script whose reply was lost.
local state = redis.call('HGET', KEYS[2], 'state')
if state == ARGV[2] then
  return 1
end
if state == 'queued' or state == 'expired' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', ARGV[2])
  return 1
end
return 0
