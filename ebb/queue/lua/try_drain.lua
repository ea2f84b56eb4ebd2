-- A runner idle for its timeout drains only if nothing waits in its queues: otherwise a
-- request that arrived at that instant would wait for a whole new cold start.
-- KEYS: 1 queue, 2 runner hash, 3 job queue (optional)
-- Returns 1 when the runner is now draining, 0 when it should keep serving.
if redis.call('ZCARD', KEYS[1]) > 0 or (KEYS[3] and redis.call('ZCARD', KEYS[3]) > 0) then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'draining')
return 1
