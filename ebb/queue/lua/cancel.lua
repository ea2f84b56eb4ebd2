-- A client went away: withdraw the request if it is still queued, otherwise ask the runner
-- that holds it to abort it in the engine.
-- KEYS: 1 queue, 2 request hash
-- ARGV: 1 request id, 2 runner cancel-set key prefix
-- Returns 'withdrawn', 'aborting' or 'none' (already finished).
local fields = redis.call('HMGET', KEYS[2], 'state', 'runner')
local state = fields[1]
if state == 'queued' or state == 'expired' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], 'state', 'cancelled')
  return 'withdrawn'
end
if state == 'claimed' then
  redis.call('HSET', KEYS[2], 'cancel_requested', '1')
  redis.call('SADD', ARGV[2] .. fields[2], ARGV[1])
  redis.call('PUBLISH', ARGV[2] .. fields[2], '1')  -- a busy runner claims on news only
  return 'aborting'
end
return 'none'
