-- A runner claims up to N queued requests and collects the cancellations meant for it.
-- Claiming is one atomic step: a request is claimed only while its state is 'queued', so
-- it can never be both claimed and withdrawn. A queued request whose admission deadline
-- has passed is marked 'expired' instead; the frontdoor's withdraw then refuses it.
-- KEYS: 1 queue, 2 leases zset, 3 this runner's cancel set, 4 runner hash
-- ARGV: 1 runner id, 2 max to claim, 3 lease ttl ms, 4 request key prefix,
--       5 events key prefix, 6 encoded Claimed event
-- Returns {{id, work, id, work, ...}, {cancelled ids...}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cancels = redis.call('SMEMBERS', KEYS[3])
if #cancels > 0 then redis.call('DEL', KEYS[3]) end
local claimed = {}
local want = tonumber(ARGV[2])
local got = 0
while got < want do
  local head = redis.call('ZPOPMIN', KEYS[1])
  if #head == 0 then break end
  local id = head[1]
  local rkey = ARGV[4] .. id
  local fields = redis.call('HMGET', rkey, 'state', 'deadline_ms', 'work')
  if fields[1] == 'queued' then
    local deadline = tonumber(fields[2] or '0')
    if deadline > 0 and now > deadline then
      redis.call('HSET', rkey, 'state', 'expired')
    else
      redis.call('HSET', rkey, 'state', 'claimed', 'runner', ARGV[1], 'claimed_ms', now)
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), id)
      redis.call('XADD', ARGV[5] .. id, '*', 'e', ARGV[6])
      table.insert(claimed, id)
      table.insert(claimed, fields[3])
      got = got + 1
    end
  end
end
if got > 0 then
  redis.call('HSET', KEYS[4], 'last_claim_ms', now)
end
return {claimed, cancels}
