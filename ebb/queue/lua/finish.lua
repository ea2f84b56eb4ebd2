-- A runner ends a request it holds: terminal event, lease released, usage recorded, once.
-- Only the runner that holds the claim can finish it; after the reaper declared the runner
-- lost, the client was already told so and nothing is emitted or billed.
-- KEYS: 1 request hash, 2 events stream, 3 leases zset, 4 usage stream
-- ARGV: 1 request id, 2 runner id, 3 final state, 4 encoded terminal event,
--       5 prompt tokens, 6 completion tokens, 7 result ttl s, 8 usage record (json)
-- Returns 1 when finished now, 0 when the request was not this runner's to finish.
local fields = redis.call('HMGET', KEYS[1], 'state', 'runner')
if fields[1] ~= 'claimed' or fields[2] ~= ARGV[2] then
  return 0
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'finished_ms', now,
  'prompt_tokens', ARGV[5], 'completion_tokens', ARGV[6])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'e', ARGV[4])
local ttl = tonumber(ARGV[7])
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[1], ttl)
if ARGV[8] ~= '' then
  redis.call('XADD', KEYS[4], '*', 'r', ARGV[8])
end
return 1
