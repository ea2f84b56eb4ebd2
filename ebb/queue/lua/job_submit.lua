-- Accept an async job: its record, its first attempt queued in its version's job queue
-- (waking the controller and idle runners like any request), its TTL deadline and its
-- place in the tenant's listing. With an Idempotency-Key, a key seen before returns the
-- job it created, or a conflict when the submission differs. Parked ('1'): the job waits
-- in the parked set instead (its request cannot be tokenized yet: weights being prepared)
-- with no attempt; job_unpark queues it.
-- KEYS: 1 job hash, 2 request hash, 3 job queue, 4 waiting zset, 5 tenant index,
--       6 idempotency key, 7 queue signal list, 8 controller wake list, 9 parked zset
-- ARGV: 1 job id, 2 request id, 3 serving unit (the version the split picked), 4 job ttl ms (queued longer: expired),
--       5 key ttl s, 6 idempotency value ('' without a key), 7 submission digest,
--       8 signal list max, 9 work (json), 10 job key prefix, 11 parked ('1' or ''),
--       12 the class's score offset ms added to the attempt's score (see
--       ebb/queue/priority.py and enqueue.lua), 13.. job field, value pairs
-- Returns {1, job id} when created, {2, job id} when replayed, {3, job id} on conflict.
if ARGV[6] ~= '' then
  local existing = redis.call('GET', KEYS[6])
  if existing then
    local sep = string.find(existing, '|', 1, true)
    local id = string.sub(existing, 1, sep - 1)
    if redis.call('EXISTS', ARGV[10] .. id) == 1 then
      if string.sub(existing, sep + 1) == ARGV[7] then return {2, id} end
      return {3, id}
    end
  end
  redis.call('SET', KEYS[6], ARGV[6], 'EX', tonumber(ARGV[5]))
end
local now = now_ms()
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], unpack(ARGV, 13, #ARGV))
local deadline = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'created_ms', now, 'expires_ms', deadline)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[4], deadline, ARGV[1])
redis.call('ZADD', KEYS[5], 0, ARGV[1])
local max = tonumber(ARGV[8])
if ARGV[11] == '1' then
  redis.call('ZADD', KEYS[9], now, ARGV[1])
else
  redis.call('HSET', KEYS[2], 'work', ARGV[9], 'state', 'queued', 'deployment', ARGV[3],
    'deadline_ms', deadline, 'enqueued_ms', now, 'job', ARGV[1], 'score_offset_ms', ARGV[12])
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[12]), ARGV[2])
  wake_runners(KEYS[7], max)
end
wake_controller(KEYS[8], ARGV[3], max)
return {1, ARGV[1]}
