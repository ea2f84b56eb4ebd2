-- Reserve a request's maximum cost against the spend caps of its API key and its tenant,
-- both or neither: a subject's committed spend (what it spent plus what requests admitted
-- before hold reserved) may never pass its budget, so however many frontdoors admit at
-- once, what is finally spent stays within it.
-- A reservation made with a hold (ARGV[6]) is registered under its request id, with the
-- spend hashes it was charged to, so that the controller's reaper can settle it if its
-- frontdoor dies (ebb/queue/budget_holds.py): atomically with the charge, so none is
-- ever held untraceably.
-- KEYS: 1 budgets config hash, 2-4 the key's spend hashes for the current day, month and
--       lifetime, 5-7 the tenant's (the budget's period picks one of each),
--       8 holds hash, 9 holds by time zset
-- ARGV: 1 key subject ('key:ID'), 2 tenant subject ('tenant:NAME'), 3 cost (micros),
--       4 a day's spend ttl (s), 5 a month's spend ttl (s), 6 the hold's record (json,
--       without subjects and spend_keys; '' for none), 7 its request id
-- Returns {'none'} (no budget applies), {'ok', key's spend hash or '', tenant's or '',
-- key's budget (json) or '', tenant's or ''} (what settling needs) or
-- {'refused', subject, amount (micros), committed (micros), period}.
local cfg = redis.call('HMGET', KEYS[1], ARGV[1], ARGV[2])
local cost = tonumber(ARGV[3])
local slots = {day = 0, month = 1, lifetime = 2}
local ttls = {day = tonumber(ARGV[4]), month = tonumber(ARGV[5])}
local charged = {}
local function check(raw, subject, first_key)
  if not raw then
    return nil
  end
  local budget = cjson.decode(raw)
  local key = KEYS[first_key + slots[budget.period]]
  local committed = tonumber(redis.call('HGET', key, 'committed') or '0')
  if committed + cost > budget.amount_micros then
    return {'refused', subject, tostring(budget.amount_micros), tostring(committed),
      budget.period}
  end
  table.insert(charged, {key = key, ttl = ttls[budget.period], budget = raw})
  return nil
end
local refused = check(cfg[1], ARGV[1], 2) or check(cfg[2], ARGV[2], 5)
if refused then
  return refused
end
if #charged == 0 then
  return {'none'}
end
local reply = {'ok', '', '', '', ''}
for i, c in ipairs(charged) do
  local fresh = redis.call('EXISTS', c.key) == 0
  redis.call('HINCRBY', c.key, 'committed', cost)
  if fresh then
    redis.call('HSETNX', c.key, 'spent', 0)
    if c.ttl then
      redis.call('EXPIRE', c.key, c.ttl)
    end
  end
end
local subjects, spend_keys = {}, {}
for _, c in ipairs(charged) do
  if c.key == KEYS[2] or c.key == KEYS[3] or c.key == KEYS[4] then
    reply[2], reply[4] = c.key, c.budget
    table.insert(subjects, ARGV[1])
  else
    reply[3], reply[5] = c.key, c.budget
    table.insert(subjects, ARGV[2])
  end
  table.insert(spend_keys, c.key)
end
if ARGV[6] ~= '' then
  local hold = cjson.decode(ARGV[6])
  hold.subjects, hold.spend_keys = subjects, spend_keys
  redis.call('HSET', KEYS[8], ARGV[7], cjson.encode(hold))
  redis.call('ZADD', KEYS[9], now_ms(), ARGV[7])
end
return reply
