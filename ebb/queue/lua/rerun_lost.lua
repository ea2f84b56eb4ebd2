-- Queue again a synchronous request whose runner was lost (the reaper failed it with
-- 'runner_lost') before its client saw any output: it keeps its id, so its usage is
-- recorded once, by whichever runner finishes it; the lost runner can no longer finish
-- it (finish.lua checks the runner). It goes back to the head of the queue (its first
-- enqueue time, in its priority class) with a fresh admission deadline, and wakes runners
-- and the controller.
-- KEYS: 1 queue, 2 request hash, 3 queue signal list, 4 controller wake list
-- ARGV: 1 request id, 2 admission window ms, 3 deployment, 4 signal list max
-- Returns 1 when queued again, 0 when the request was not lost (finished, cancelled...).
local fields = redis.call('HMGET', KEYS[2], 'state', 'error', 'enqueued_ms', 'score_offset_ms')
if fields[1] ~= 'failed' or fields[2] ~= 'runner_lost' then
  return 0
end
local now = now_ms()
redis.call('HDEL', KEYS[2], 'error', 'runner', 'claimed_ms')
redis.call('HSET', KEYS[2], 'state', 'queued', 'deadline_ms', now + tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[2], 'reruns', 1)
redis.call('ZADD', KEYS[1], (tonumber(fields[3]) or now) + (tonumber(fields[4]) or 0), ARGV[1])
local max = tonumber(ARGV[4])
wake_runners(KEYS[3], max)
wake_controller(KEYS[4], ARGV[3], max)
return 1
