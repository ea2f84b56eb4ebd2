-- A runner gives back a job attempt it holds, so that a synchronous request waiting for a
-- slot can have it (preemption): the attempt goes back to its deployment's job queue at
-- its first place in line (in its priority class, see enqueue.lua), under the same id.
-- What it generated stays on its events stream, followed by a 'continued' event: the runner that claims it next replays that
-- output and goes on (see ebb/queue/continuation.py), and the collector builds the job's
-- result from the whole stream. Nothing was billed yet: usage is recorded once, when the
-- attempt ends, counting every token. It keeps no admission deadline: it started within
-- its TTL, so it runs whenever a slot is free again. The job itself stays 'running'.
-- A cancel requested meanwhile wins: the attempt stays with the runner, which aborts it.
-- KEYS: 1 request hash, 2 events stream, 3 leases zset, 4 job queue, 5 queue signal list,
--       6 waiting zset (jobs that may still expire)
-- With ARGV[4] '0' (output no continuation can replay: several choices, embeddings) the
-- attempt starts over instead: its stream is dropped and it is queued as never claimed.
-- ARGV: 1 request id, 2 runner id, 3 signal list max, 4 '1' to keep its output
-- Returns 1 when given back, 0 when it was not this runner's to give (or a cancel waits).
local fields = redis.call('HMGET', KEYS[1], 'state', 'runner', 'cancel_requested', 'job',
  'enqueued_ms', 'continuations', 'score_offset_ms')
if fields[1] ~= 'claimed' or fields[2] ~= ARGV[2] or fields[3] == '1' or not fields[4] then
  return 0
end
redis.call('HDEL', KEYS[1], 'runner', 'claimed_ms')
redis.call('HSET', KEYS[1], 'state', 'queued', 'deadline_ms', 0)
redis.call('HINCRBY', KEYS[1], 'yields', 1)
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[4] == '1' then
  local attempt = (tonumber(fields[6]) or 0) + 1
  redis.call('HSET', KEYS[1], 'continuations', attempt, 'continued', '1')
  -- msgspec's encoding of Continued(attempt): tag field 'type', then the attempt.
  redis.call('XADD', KEYS[2], '*', 'e', '{"type":"continued","attempt":' .. attempt .. '}')
else
  redis.call('HDEL', KEYS[1], 'continued')
  redis.call('DEL', KEYS[2])
end
redis.call('ZADD', KEYS[4], (tonumber(fields[5]) or 0) + (tonumber(fields[7]) or 0), ARGV[1])
redis.call('ZREM', KEYS[6], fields[4])
wake_runners(KEYS[5], tonumber(ARGV[3]))
return 1
