-- Store a new batch, list it under its tenant and mark it active, all or nothing.
-- KEYS: 1 batch record, 2 the tenant's batch index, 3 active batches set
-- ARGV: 1 record (json), 2 batch id, 3 record ttl (s)
-- Returns 1 when created, 0 when a batch with that id already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
