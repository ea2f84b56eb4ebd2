-- A job past its TTL deadline: if its attempt still waits in the queue (or a claim found
-- it late and marked it 'expired'), withdraw it and expire the job. A job that started in
-- time only leaves the waiting set. A parked job (no attempt yet) settles as `status` too:
-- the collector expires it at its deadline, the frontdoor fails it when what it waited
-- for failed (its weights).
-- KEYS: 1 job hash, 2 waiting zset, 3 watch set, 4 parked zset
-- ARGV: 1 job id, 2 request key prefix, 3 job queue key prefix, 4 error (json),
--       5 status ('expired', or 'failed' for a parked job only)
-- Returns 'expired', or the job's or its attempt's state when it was left alone.
local job = redis.call('HMGET', KEYS[1], 'status', 'request_id', 'deployment')
if not job[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 'missing'
end
if job[1] ~= 'queued' and job[1] ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return job[1]
end
if redis.call('ZREM', KEYS[4], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'status', ARGV[5], 'finished_ms', now_ms(), 'error', ARGV[4],
    'waiting_for', '', 'submission', '')
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[3], ARGV[1])
  return ARGV[5]
end
if ARGV[5] ~= 'expired' then return 'queued' end
local rkey = ARGV[2] .. job[2]
local state = redis.call('HGET', rkey, 'state')
if state == 'queued' or state == 'expired' then
  local now = now_ms()
  -- The attempt's own unit (a version's job queue); the job names only the deployment.
  local unit = redis.call('HGET', rkey, 'deployment') or job[3]
  redis.call('ZREM', ARGV[3] .. unit, job[2])
  redis.call('HSET', rkey, 'state', 'expired')
  redis.call('HSET', KEYS[1], 'status', 'expired', 'finished_ms', now, 'error', ARGV[4])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[3], ARGV[1])
  return 'expired'
end
redis.call('ZREM', KEYS[2], ARGV[1])
return state or 'none'
