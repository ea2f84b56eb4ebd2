-- Put a job whose attempt was lost (its runner died, its lease expired) back in its
-- serving version's job queue as a new attempt, with the job's original TTL deadline.
-- KEYS: 1 job hash, 2 new request hash, 3 job queue, 4 waiting zset, 5 watch set,
--       6 queue signal list, 7 controller wake list
-- ARGV: 1 job id, 2 lost request id, 3 new request id, 4 new work (json), 5 serving unit,
--       6 key ttl s, 7 signal list max, 8 why the attempt ended (json), 9 attempt number,
--       10 the class's score offset ms (see job_submit.lua; absent: 0)
-- Returns 1 when requeued, 0 when the job moved on, -1 when a cancel was requested.
local job = redis.call('HMGET', KEYS[1], 'status', 'request_id', 'cancel_requested',
  'expires_ms')
if not job[1] or job[2] ~= ARGV[2] then return 0 end
if job[1] ~= 'queued' and job[1] ~= 'running' then return 0 end
if job[3] == '1' then return -1 end
local now = now_ms()
local offset = tonumber(ARGV[10] or '0')
redis.call('HSET', KEYS[2], 'work', ARGV[4], 'state', 'queued', 'deployment', ARGV[5],
  'deadline_ms', job[4], 'enqueued_ms', now, 'job', ARGV[1], 'score_offset_ms', offset)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
redis.call('ZADD', KEYS[3], now + offset, ARGV[3])
redis.call('ZADD', KEYS[4], tonumber(job[4]), ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('HSET', KEYS[1], 'request_id', ARGV[3], 'attempt', ARGV[9], 'status', 'queued',
  'last_error', ARGV[8])
local max = tonumber(ARGV[7])
wake_runners(KEYS[6], max)
wake_controller(KEYS[7], ARGV[5], max)
return 1
