-- Expire the leases of runners that stopped heartbeating. A request they held is queued
-- again as a continuation (a 'continued' event on its stream, at its first place in
-- line): the next runner that claims it replays the output so far after the prompt and
-- goes on (see ebb/queue/continuation.py). A synchronous request goes back to its queue
-- with a fresh admission deadline; a job attempt to its job queue, with none (it started
-- within its TTL, as in job_yield.lua). Past ARGV[5] continuations, one whose client
-- already left, or one whose output no continuation can replay (several choices, an
-- embedding: the frontdoor runs those again if their client saw nothing yet, the
-- collector retries such jobs), it ends with a 'runner_lost' error event instead, so no
-- client waits forever.
-- KEYS: 1 leases zset, 2 controller wake list, 3 waiting jobs zset
-- ARGV: 1 request key prefix, 2 events key prefix, 3 encoded Failed event, 4 result ttl s,
--       5 continuations allowed, 6 admission window ms, 7 queue key prefix,
--       8 queue signal key prefix, 9 signal list max, 10 job queue key prefix
-- Returns the ids whose leases expired.
-- A single-choice generation without structured output, as `continuation.replayable`
-- says (read only: the work is never re-encoded here; JSON null decodes to cjson.null).
local function unset(v) return v == nil or v == cjson.null end
local function replayable(work)
  local ok, decoded = pcall(cjson.decode, work or '')
  if not ok or type(decoded) ~= 'table' or type(decoded.sampling) ~= 'table' then
    return false
  end
  local s = decoded.sampling
  return (unset(s.n) or s.n == 1) and s.embed ~= true and s.json_object ~= true
    and unset(s.json_schema) and (unset(s.structural_tag) or s.structural_tag == '')
end

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
local max = tonumber(ARGV[9])
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  local rkey = ARGV[1] .. id
  local ekey = ARGV[2] .. id
  local f = redis.call('HMGET', rkey, 'state', 'job', 'cancel_requested', 'continuations',
    'deployment', 'enqueued_ms', 'work', 'score_offset_ms')
  if f[1] == 'claimed' then
    local attempt = (tonumber(f[4]) or 0) + 1
    if f[3] ~= '1' and f[5] and attempt <= tonumber(ARGV[5]) and replayable(f[7]) then
      local deadline, queue = now + tonumber(ARGV[6]), ARGV[7] .. f[5]
      if f[2] then
        deadline, queue = 0, ARGV[10] .. f[5]
        redis.call('ZREM', KEYS[3], f[2])
      end
      redis.call('HDEL', rkey, 'runner', 'claimed_ms')
      redis.call('HSET', rkey, 'state', 'queued', 'continuations', attempt, 'continued', '1',
        'deadline_ms', deadline)
      -- msgspec's encoding of Continued(attempt): tag field 'type', then the attempt.
      redis.call('XADD', ekey, '*', 'e', '{"type":"continued","attempt":' .. attempt .. '}')
      -- Back at its first enqueue time, in its priority class (see enqueue.lua).
      redis.call('ZADD', queue, (tonumber(f[6]) or now) + (tonumber(f[8]) or 0), id)
      wake_runners(ARGV[8] .. f[5], max)
      wake_controller(KEYS[2], f[5], max)
    else
      redis.call('HSET', rkey, 'state', 'failed', 'error', 'runner_lost')
      redis.call('XADD', ekey, '*', 'e', ARGV[3])
      redis.call('EXPIRE', ekey, tonumber(ARGV[4]))
    end
  end
end
return expired
