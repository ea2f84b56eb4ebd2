-- A runner claims up to N queued requests and collects the cancellations meant for it.
-- Claiming is one atomic step: a request is claimed only while its state is 'queued', so
-- it can never be both claimed and withdrawn. A queued request whose admission deadline
-- has passed is marked 'expired' instead; the frontdoor's withdraw then refuses it.
-- Async jobs yield to synchronous traffic: job attempts are taken from the deployment's
-- job queue only for slots the synchronous queue left over (it is empty by then), and at
-- most ARGV[7] of them. A claimed job is added to the collector's watch set, and the
-- collector is woken.
-- KEYS: 1 queue, 2 leases zset, 3 this runner's cancel set, 4 runner hash,
--       5 job queue, 6 job watch set, 7 collector signal list (5-7 optional)
-- ARGV: 1 runner id, 2 max to claim, 3 lease ttl ms, 4 request key prefix,
--       5 events key prefix, 6 encoded Claimed event, 7 max job attempts to claim (0: none),
--       8 signal list max
-- Returns {{id, work, id, work, ...}, {cancelled ids...}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cancels = redis.call('SMEMBERS', KEYS[3])
if #cancels > 0 then redis.call('DEL', KEYS[3]) end
local claimed = {}
local got = 0

-- Pops from `queue` until `want` requests were claimed or it is empty.
local function take(queue, want, watch)
  local taken = 0
  while taken < want do
    local head = redis.call('ZPOPMIN', queue)
    if #head == 0 then break end
    local id = head[1]
    local rkey = ARGV[4] .. id
    local fields = redis.call('HMGET', rkey, 'state', 'deadline_ms', 'work', 'job')
    if fields[1] == 'queued' then
      local deadline = tonumber(fields[2] or '0')
      if deadline > 0 and now > deadline then
        redis.call('HSET', rkey, 'state', 'expired')
      else
        redis.call('HSET', rkey, 'state', 'claimed', 'runner', ARGV[1], 'claimed_ms', now)
        redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), id)
        redis.call('XADD', ARGV[5] .. id, '*', 'e', ARGV[6])
        if watch and fields[4] then redis.call('SADD', watch, fields[4]) end
        table.insert(claimed, id)
        table.insert(claimed, fields[3])
        taken = taken + 1
      end
    end
  end
  return taken
end

got = take(KEYS[1], tonumber(ARGV[2]), nil)
local jobs = math.min(tonumber(ARGV[2]) - got, tonumber(ARGV[7] or '0'))
if KEYS[5] and jobs > 0 and redis.call('ZCARD', KEYS[1]) == 0 then
  local taken = take(KEYS[5], jobs, KEYS[6])
  if taken > 0 then
    redis.call('RPUSH', KEYS[7], '1')
    redis.call('LTRIM', KEYS[7], -tonumber(ARGV[8]), -1)
  end
  got = got + taken
end
if got > 0 then
  redis.call('HSET', KEYS[4], 'last_claim_ms', now)
end
return {claimed, cancels}
