-- Cancel a job. Queued: its attempt leaves the job queue and the job is cancelled at once.
-- Running: the runner holding the attempt is asked to abort it (it finishes the attempt as
-- 'cancelled', billed for what it generated) and the collector settles the job. Between
-- attempts: the collector settles it as cancelled instead of queueing another attempt.
-- Parked (no attempt yet): cancelled at once.
-- KEYS: 1 job hash, 2 watch set, 3 waiting zset, 4 parked zset
-- ARGV: 1 job id, 2 request key prefix, 3 job queue key prefix, 4 runner cancel-set prefix,
--       5.. terminal statuses
-- Returns 'missing', a terminal status (nothing to cancel), 'withdrawn' (cancelled now),
-- 'aborting' or 'pending'.
local job = redis.call('HMGET', KEYS[1], 'status', 'request_id', 'deployment')
if not job[1] then return 'missing' end
for i = 5, #ARGV do
  if job[1] == ARGV[i] then return job[1] end
end
redis.call('HSET', KEYS[1], 'cancel_requested', '1')
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('ZREM', KEYS[4], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_ms', now_ms(),
    'waiting_for', '', 'submission', '')
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 'withdrawn'
end
local rkey = ARGV[2] .. job[2]
local req = redis.call('HMGET', rkey, 'state', 'runner')
if req[1] == 'queued' or req[1] == 'expired' then
  local now = now_ms()
  -- The attempt's own unit (a version's job queue); the job names only the deployment.
  local unit = redis.call('HGET', rkey, 'deployment') or job[3]
  redis.call('ZREM', ARGV[3] .. unit, job[2])
  redis.call('HSET', rkey, 'state', 'cancelled')
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_ms', now)
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 'withdrawn'
end
if req[1] == 'claimed' then
  redis.call('HSET', rkey, 'cancel_requested', '1')
  redis.call('SADD', ARGV[4] .. req[2], job[2])
  redis.call('PUBLISH', ARGV[4] .. req[2], '1')
  return 'aborting'
end
return 'pending'
