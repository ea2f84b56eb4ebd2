-- Admit a request into its deployment's queue, or refuse it when the queue is full.
-- The controller is woken when this request is the only one queued and no runner of the
-- deployment with room is claiming.
-- KEYS: 1 queue, 2 request hash, 3 queue signal list, 4 controller wake list,
--       5 the deployment's claiming marker (optional)
-- ARGV: 1 request id, 2 work (json), 3 deployment, 4 admission window ms (0: none),
--       5 queue depth limit, 6 request ttl s, 7 signal list max, 8 prompt prefix key
--       ('' for none: see claim.lua), 9 priority offset ms added to the score (see
--       ebb/queue/priority.py; absent: 0), 10 shed depth: refused as 'shed' once this
--       many are queued (a sheddable request under saturation; absent or 0: never)
-- Returns {1, deadline_ms} when queued, {0, 'full'}, {0, 'shed'} or {0, 'duplicate'} when
-- refused.
-- The same work sent again is the same admission: a client retrying across a Redis restart
-- resends a script that ran before Redis died (its reply lost, its writes in the
-- append-only file), and it must hear what the first run answered, not a refusal. This is
-- checked before the depth, which counts the request itself.
local existing = redis.call('HMGET', KEYS[2], 'work', 'deadline_ms')
if existing[1] then
  if existing[1] == ARGV[2] then
    return {1, tonumber(existing[2]) or 0}
  end
  return {0, 'duplicate'}
end
local now = now_ms()
local depth = redis.call('ZCARD', KEYS[1])
if depth >= tonumber(ARGV[5]) then
  return {0, 'full'}
end
local shed = tonumber(ARGV[10] or '0')
if shed > 0 and depth >= shed then
  return {0, 'shed'}
end
local offset = tonumber(ARGV[9] or '0')
local window = tonumber(ARGV[4])
local deadline = 0
if window > 0 then deadline = now + window end
redis.call('HSET', KEYS[2], 'work', ARGV[2], 'state', 'queued', 'deployment', ARGV[3],
  'deadline_ms', deadline, 'enqueued_ms', now, 'prefix', ARGV[8] or '', 'score_offset_ms', offset)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
redis.call('ZADD', KEYS[1], now + offset, ARGV[1])
local max = tonumber(ARGV[7])
wake_runners(KEYS[3], max)
-- The controller is woken when the queue stops being empty (a deployment at zero gets a
-- runner at once); while it stays non-empty, the controller's own poll sees it. Waking it
-- for every request made it reconcile back to back under load. Nor is it woken while a
-- runner with room claims from this queue (KEYS[5], see claim.lua): that runner takes the
-- request, and whether to scale out is the poll's to see. Runners that keep up keep the
-- queue empty, and each request woke it (a reconcile, ~0.3 ms of its CPU per request).
if depth == 0 and not (KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1) then
  wake_controller(KEYS[4], ARGV[3], max)
end
return {1, deadline}
