-- The frontdoor takes back a request nobody claimed in time (or whose client left).
-- KEYS: 1 queue, 2 request hash
-- ARGV: 1 request id, 2 the state to record ('withdrawn' or 'cancelled')
-- Returns 1 when withdrawn (it will never run), 0 when a runner already holds it.
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'queued' or state == 'expired' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', ARGV[2])
  return 1
end
return 0
