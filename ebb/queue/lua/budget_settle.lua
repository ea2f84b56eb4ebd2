-- Settle a budget reservation: what the request really cost replaces what it reserved
-- (nothing, when it never ran), in each spend hash it was charged to. A subject whose
-- spend this period has now reached its soft limit gets its one budget.soft_limit_reached
-- delivery (a 'soft' marker set only if absent in the period's hash: once per period,
-- however many frontdoors settle at once), to its tenant's webhook URL if it has one.
-- A reservation registered as a hold (ARGV[7], its request id) is settled only while the
-- hold is there, and the hold goes with it: whichever of its frontdoor and the
-- controller's reaper settles first does, the other finds nothing (never settled twice).
-- KEYS: 1 budgets config hash, 2 tenant webhook URLs hash, 3 deliveries due zset,
--       4 delivery signal list, 5 holds hash, 6 holds by time zset, 7.. the spend hashes
--       the reservation was charged to
-- ARGV: 1 reserved (micros), 2 cost (micros; -1: it never ran), 3 tenant,
--       4 delivery key prefix, 5 delivery ttl (s), 6 signal list max, 7 hold id ('' for
--       none), then for each spend hash: its subject, a webhook id, the event body with
--       data.spent_micros to fill in
-- Returns the subjects whose soft-limit delivery this call created.
local reserved, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local notified = {}
if ARGV[7] ~= '' then
  if redis.call('HDEL', KEYS[5], ARGV[7]) == 0 then
    return notified
  end
  redis.call('ZREM', KEYS[6], ARGV[7])
end
for i = 7, #KEYS do
  local key = KEYS[i]
  local base = 7 + (i - 7) * 3
  local subject, webhook_id, body = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  -- A hash gone (expired days after its period) has nothing left to settle.
  if redis.call('EXISTS', key) == 1 then
    local spent = tonumber(redis.call('HGET', key, 'spent') or '0')
    if cost < 0 then
      redis.call('HINCRBY', key, 'committed', -reserved)
    else
      redis.call('HINCRBY', key, 'committed', cost - reserved)
      spent = redis.call('HINCRBY', key, 'spent', cost)
    end
    local raw = redis.call('HGET', KEYS[1], subject)
    if raw and cost > 0 then
      local budget = cjson.decode(raw)
      if spent >= budget.soft_limit * budget.amount_micros
        and redis.call('HSETNX', key, 'soft', webhook_id) == 1 then
        local url = redis.call('HGET', KEYS[2], ARGV[3])
        if url then
          local event = cjson.decode(body)
          -- The budget that was reached, as it is now (the body was built from the
          -- reservation's, which an admin may have changed since).
          event.data.spent_micros = spent
          event.data.amount_micros = budget.amount_micros
          event.data.soft_limit = budget.soft_limit
          local now = now_ms()
          local dkey = ARGV[4] .. webhook_id
          redis.call('HSET', dkey, 'webhook_id', webhook_id, 'job_id', key, 'tenant', ARGV[3],
            'url', url, 'event', 'budget.soft_limit_reached', 'body', cjson.encode(event),
            'created_ms', now, 'state', 'pending', 'attempts', 0, 'next_ms', now)
          redis.call('EXPIRE', dkey, tonumber(ARGV[5]))
          redis.call('ZADD', KEYS[3], now, webhook_id)
          push_signal(KEYS[4], tonumber(ARGV[6]))
          table.insert(notified, subject)
        end
      end
    end
  end
end
return notified
