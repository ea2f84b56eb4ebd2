-- An idle runner whose engine can sleep parks itself instead of exiting, but only if
-- nothing waits in its queues (the same guard as try_drain). A sleeper claims no more: the
-- deployment's claiming marker goes, so the next request wakes the controller, which
-- wakes a sleeper. A scaling policy's request to drain it (`drain_requested`) is answered
-- by sleeping: it goes, so the runner woken later does not drain on it.
-- KEYS: 1 queue, 2 runner hash, 3 the deployment's sleeper set, 4 job queue,
--       5 the deployment's claiming marker (4-5 optional)
-- ARGV: 1 runner id
-- Returns 1 when the runner is now sleeping, 0 when it should keep serving.
if redis.call('ZCARD', KEYS[1]) > 0 or (KEYS[4] and redis.call('ZCARD', KEYS[4]) > 0) then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'sleeping')
redis.call('HDEL', KEYS[2], 'drain_requested')
redis.call('SADD', KEYS[3], ARGV[1])
if KEYS[5] then redis.call('DEL', KEYS[5]) end
return 1
