-- A runner idle for its timeout drains only if nothing waits in its queues: otherwise a
-- request that arrived at that instant would wait for a whole new cold start.
-- A draining runner claims no more: the deployment's claiming marker goes (see claim.lua),
-- so the next request wakes the controller.
-- KEYS: 1 queue, 2 runner hash, 3 job queue, 4 the deployment's claiming marker
--       (3-4 optional)
-- Returns 1 when the runner is now draining, 0 when it should keep serving.
if redis.call('ZCARD', KEYS[1]) > 0 or (KEYS[3] and redis.call('ZCARD', KEYS[3]) > 0) then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'draining')
if KEYS[4] then redis.call('DEL', KEYS[4]) end
return 1
