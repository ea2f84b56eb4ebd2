-- Queue a parked job's first attempt, now that its request could be tokenized: the job
-- takes `work` and the given fields, its attempt is queued like job_submit's (same
-- deadline, same key lifetime). Nothing is done unless the job is still parked and queued
-- (another frontdoor queued it, or it was cancelled or expired meanwhile).
-- KEYS: 1 job hash, 2 request hash, 3 job queue, 4 parked zset, 5 queue signal list,
--       6 controller wake list
-- ARGV: 1 job id, 2 request id, 3 serving unit, 4 signal list max, 5 work (json),
--       6 the class's score offset ms (see job_submit.lua), 7.. job field, value pairs
-- Returns 1 when queued, 0 when left alone.
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then return 0 end
redis.call('ZREM', KEYS[4], ARGV[1])
local job = redis.call('HMGET', KEYS[1], 'status', 'expires_ms')
if job[1] ~= 'queued' then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], unpack(ARGV, 7, #ARGV))
redis.call('HSET', KEYS[2], 'work', ARGV[5], 'state', 'queued', 'deployment', ARGV[3],
  'deadline_ms', job[2], 'enqueued_ms', now, 'job', ARGV[1], 'score_offset_ms', ARGV[6])
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[2])
local max = tonumber(ARGV[4])
wake_runners(KEYS[5], max)
wake_controller(KEYS[6], ARGV[3], max)
return 1
