-- A webhooks worker takes the deliveries that are due: each gets an in-flight lease (its
-- due time moves to now + lease) owned by the worker, so no other worker attempts it
-- meanwhile, and a worker that dies mid-attempt leaves it to be retried when the lease
-- ends. Deliveries whose record expired are dropped from the schedule.
-- KEYS: 1 due zset
-- ARGV: 1 max to take, 2 lease ms, 3 owner, 4 delivery key prefix
-- Returns the webhook ids taken.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local taken = {}
for _, wid in ipairs(due) do
  local dkey = ARGV[4] .. wid
  if redis.call('HGET', dkey, 'state') == 'pending' then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), wid)
    redis.call('HSET', dkey, 'owner', ARGV[3])
    table.insert(taken, wid)
  else
    redis.call('ZREM', KEYS[1], wid)
  end
end
return taken
