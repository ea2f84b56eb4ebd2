-- A runner claims up to N queued requests and collects the cancellations meant for it.
-- Claiming is one atomic step: a request is claimed only while its state is 'queued', so
-- it can never be both claimed and withdrawn. A queued request whose admission deadline
-- has passed is marked 'expired' instead; the frontdoor's withdraw then refuses it.
-- Async jobs yield to synchronous traffic: job attempts are taken from the deployment's
-- job queue only for slots the synchronous queue left over (it is empty by then), and at
-- most ARGV[7] of them. A claimed job is added to the collector's watch set, and the
-- collector is woken.
-- Prefix-aware: a synchronous request whose prompt prefix (its 'prefix' field) another
-- runner claimed last, while that runner is ready, alive and had room at its last
-- claim, is left for it (and that runner woken) until the request has waited ARGV[9] ms
-- (its prefix is likely in that runner's KV cache); after that any runner takes it,
-- unless that runner has not claimed since the request came: it claims only between
-- engine steps, and a step (a long prefill on CPU) may outlast ARGV[9], so the request
-- waits for that step to end, up to ARGV[15] ms in all. At most ARGV[10] queued requests
-- beyond the number to claim are looked at (passed over or no longer queued) in one claim.
-- Each claimed prefix is recorded as this runner's (KEYS[5], capped, expiring). A claim
-- that leaves the runner room sets the deployment's claiming marker (KEYS[9], for
-- ARGV[16] ms): enqueue.lua wakes no controller for a request a runner will claim.
-- Least-loaded: a synchronous request this runner would take while a live, ready peer of
-- its deployment (one that claimed within a lease, KEYS[11]) has more room than it by
-- more than ARGV[21] slots once it took it is left for that peer (and that peer woken),
-- until the request has waited ARGV[20] ms (0: off). A lone runner, a silent one, or a
-- peer inside a long step delays no request past that bound. Not for critical requests,
-- nor for one whose prompt prefix this runner served last (prefix affinity keeps it).
-- Peers are read from KEYS[11] (runner id -> its last claim ms; stale ones dropped): one
-- HMGET per live runner of the deployment, once per claim that needs it.
-- Identity: a runner claims only while its deployment's current uid (KEYS[10], by the
-- deployment's public name ARGV[17]; none: '') is the one it was launched for (ARGV[18];
-- '' for a deployment from before uids, which has none). Otherwise the deployment was
-- deleted, or deleted and created again by someone else: it claims nothing, only its
-- cancellations, and the fifth reply tells it to drain. (A deleted deployment from before
-- uids has nothing left queued, see deployment_delete.lua; its runners drain when they
-- find its spec gone.)
-- KEYS: 1 queue, 2 leases zset, 3 this runner's cancel set, 4 runner hash,
--       5 prefix owners hash, 6 job queue, 7 job watch set, 8 collector signal list,
--       9 the deployment's claiming marker, 10 deployment uids hash, 11 the deployment's
--       claimers zset (6-11 optional)
-- ARGV: 1 runner id, 2 max to claim, 3 lease ttl ms, 4 request key prefix,
--       5 events key prefix, 6 encoded Claimed event, 7 max job attempts to claim (0: none),
--       8 signal list max, 9 prefix affinity wait ms (0: off), 10 extra requests looked at,
--       11 runner key prefix, 12 prefix owners ttl s, 13 prefix owners max,
--       14 runner signal list prefix, 15 prefix wait for an owner inside a step ms,
--       16 claiming marker ttl ms, 17 the deployment's public name, 18 the runner's
--       deployment uid, 19 critical requests it may take beyond ARGV[2] once that many
--       were claimed (absent: 0; see the end), 20 least-loaded wait ms (absent or 0: off),
--       21 the room difference tolerated (slots)
-- Returns {{id, work, id, work, ...}, {cancelled ids...}, synchronous requests still queued
-- (less those this claim left for another runner),
-- job attempts still queued, 1 when the runner's deployment is gone else 0, {ids of the
-- claimed that are continuations (see reap.lua, job_yield.lua)}} (the third
-- tells a runner full of jobs to yield one of them, see job_yield.lua; both, with none,
-- that a busy runner may wait for news, see work_news.py).
local now = now_ms()
local cancels = redis.call('SMEMBERS', KEYS[3])
if #cancels > 0 then redis.call('DEL', KEYS[3]) end
local claimed = {}
local continued = {}
local got = 0

if KEYS[10] then
  local current = redis.call('HGET', KEYS[10], ARGV[17]) or ''
  if current ~= (ARGV[18] or '') then
    redis.call('HSET', KEYS[4], 'free_slots', 0, 'polled_ms', now)
    return {claimed, cancels, 0, 0, 1, continued}
  end
end

local affinity_ms = tonumber(ARGV[9] or '0')
local step_wait_ms = math.max(affinity_ms, tonumber(ARGV[15] or '0'))
local lease_ms = tonumber(ARGV[3])

-- Wake a peer a request was left for if it is blocked waiting for work: the queue's own
-- wake token may have gone to this runner instead. A busy peer hears it on the channel of
-- that name.
local function wake_peer(runner)
  local signal = ARGV[14] .. runner
  if redis.call('LLEN', signal) == 0 then
    redis.call('RPUSH', signal, '1')
    redis.call('EXPIRE', signal, tonumber(ARGV[12]))
  end
  redis.call('PUBLISH', signal, '1')
end

-- True when the request should wait for the runner that last claimed its prefix; as a
-- second value, true when that runner is this one.
local function left_for_owner(prefix, enqueued_ms)
  if affinity_ms <= 0 or not prefix or prefix == '' then return false end
  local enqueued = tonumber(enqueued_ms or now)
  local waited = now - enqueued
  if waited >= step_wait_ms then return false end
  local owner = redis.call('HGET', KEYS[5], prefix)
  if not owner then return false end
  local runner = string.match(owner, '^[^|]+')
  if runner == ARGV[1] then return false, true end
  local state = redis.call(
    'HMGET', ARGV[11] .. runner, 'state', 'heartbeat_ms', 'free_slots', 'polled_ms')
  local polled = tonumber(state[4] or '0')
  -- Alive: it heartbeated or claimed within a lease (its first heartbeat may be a second
  -- away; an idle runner claims at least every half second).
  local seen = math.max(tonumber(state[2] or '0'), polled)
  if state[1] ~= 'ready' or now - seen > lease_ms then return false end
  if tonumber(state[3] or '0') <= 0 then return false end
  -- Past the affinity wait, only for an owner still inside the step it was in when the
  -- request came: one that claimed since then had its chance.
  if waited >= affinity_ms and polled > enqueued then return false end
  wake_peer(runner)
  return true
end

local balance_ms = tonumber(ARGV[20] or '0')
local balance_slack = tonumber(ARGV[21] or '1')
if not KEYS[11] then balance_ms = 0 end
local lightest = nil -- {runner id, free slots}: the peer with the most room; false: none
local left_to_lightest = 0

local function lightest_peer()
  if lightest ~= nil then return lightest end
  lightest = false
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', '(' .. (now - lease_ms))
  local most = 0
  for _, peer in ipairs(redis.call('ZRANGE', KEYS[11], 0, -1)) do
    if peer ~= ARGV[1] then
      local state = redis.call('HMGET', ARGV[11] .. peer, 'state', 'free_slots')
      local room = tonumber(state[2] or '0')
      if state[1] == 'ready' and room > most then
        most = room
        lightest = {peer, room}
      end
    end
  end
  return lightest
end

-- True when the request should wait for the peer with the most room: this runner, had it
-- taken it (`taken` of its `want` free slots already were), would hold more than that
-- peer (counting what this claim left for it) by more than the tolerance.
local function left_for_lighter(enqueued_ms, want, taken)
  if balance_ms <= 0 or now - tonumber(enqueued_ms or now) >= balance_ms then return false end
  local peer = lightest_peer()
  if not peer then return false end
  if (peer[2] - left_to_lightest) - (want - taken - 1) <= balance_slack then return false end
  left_to_lightest = left_to_lightest + 1
  if left_to_lightest == 1 then wake_peer(peer[1]) end
  return true
end

-- Whether a synchronous request stays queued for another runner: its prefix's, or a
-- lighter one (never a critical request, nor one whose prefix this runner holds).
local left_for_others = 0 -- requests this claim left queued for another runner
local function stays_queued(fields, want, taken)
  local left, mine = left_for_owner(fields[5], fields[6])
  if not left and not mine and tonumber(fields[8] or '0') >= 0 then
    left = left_for_lighter(fields[6], want, taken)
  end
  if left then left_for_others = left_for_others + 1 end
  return left
end

local function claim_one(id, rkey, fields, watch)
  redis.call('HSET', rkey, 'state', 'claimed', 'runner', ARGV[1], 'claimed_ms', now)
  redis.call('ZADD', KEYS[2], now + lease_ms, id)
  redis.call('XADD', ARGV[5] .. id, '*', 'e', ARGV[6])
  if watch and fields[4] then redis.call('SADD', watch, fields[4]) end
  if fields[5] and fields[5] ~= '' then
    if redis.call('HLEN', KEYS[5]) >= tonumber(ARGV[13]) then redis.call('DEL', KEYS[5]) end
    redis.call('HSET', KEYS[5], fields[5], ARGV[1] .. '|' .. now)
    redis.call('EXPIRE', KEYS[5], tonumber(ARGV[12]))
  end
  table.insert(claimed, id)
  table.insert(claimed, fields[3])
  if fields[7] == '1' then table.insert(continued, id) end
end

-- Takes from `queue`, oldest first, until `want` requests were claimed or the first
-- `scan` queued ones were looked at. Entries no longer queued are dropped; expired ones
-- are marked so; with `affinity`, one left for another runner stays queued.
local function take(queue, want, watch, affinity, scan, below)
  local taken = 0
  local heads
  if below then
    heads = redis.call('ZRANGEBYSCORE', queue, '-inf', '(' .. below, 'LIMIT', 0, scan)
  else
    heads = redis.call('ZRANGE', queue, 0, scan - 1)
  end
  for _, id in ipairs(heads) do
    if taken >= want then break end
    local rkey = ARGV[4] .. id
    local fields = redis.call(
      'HMGET', rkey, 'state', 'deadline_ms', 'work', 'job', 'prefix', 'enqueued_ms',
      'continued', 'score_offset_ms')
    if fields[1] ~= 'queued' then
      redis.call('ZREM', queue, id)
    else
      local deadline = tonumber(fields[2] or '0')
      if deadline > 0 and now > deadline then
        redis.call('ZREM', queue, id)
        redis.call('HSET', rkey, 'state', 'expired')
      elseif not (affinity and stays_queued(fields, want, taken)) then
        redis.call('ZREM', queue, id)
        claim_one(id, rkey, fields, watch)
        taken = taken + 1
      end
    end
  end
  return taken
end

local want = tonumber(ARGV[2])
local extra = tonumber(ARGV[10] or '0')
got = take(KEYS[1], want, nil, true, want + extra)
local jobs = math.min(want - got, tonumber(ARGV[7] or '0'))
if KEYS[6] and jobs > 0 and redis.call('ZCARD', KEYS[1]) == 0 then
  local taken = take(KEYS[6], jobs, KEYS[7], false, jobs + extra)
  if taken > 0 then
    push_signal(KEYS[8], tonumber(ARGV[8]))
  end
  got = got + taken
end
-- A runner whose slots this claim filled still takes critical requests (scored below 0,
-- see ebb/queue/priority.py), up to ARGV[19] more: critical work waits for no slot to
-- free; the engine's scheduler runs it first (by priority).
local critical_extra = tonumber(ARGV[19] or '0')
if critical_extra > 0 and got >= want then
  got = got + take(KEYS[1], critical_extra, nil, false, critical_extra, 0)
end
-- Room left after this claim: what a request left for this runner's prefix needs.
redis.call('HSET', KEYS[4], 'free_slots', math.max(0, want - got), 'polled_ms', now)
if got > 0 then
  redis.call('HSET', KEYS[4], 'last_claim_ms', now)
end
if balance_ms > 0 then -- this runner is a peer others may leave requests for
  redis.call('ZADD', KEYS[11], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[11], 2 * lease_ms)
end
if KEYS[9] and want > got then
  redis.call('SET', KEYS[9], '1', 'PX', tonumber(ARGV[16]))
end
local jobs_queued = 0
if KEYS[6] then jobs_queued = redis.call('ZCARD', KEYS[6]) end
-- Requests left for another runner are not this runner's to wait for: a runner full of
-- jobs yields none for them (their runner takes them, or they come back to any runner
-- once their wait is over).
local sync_queued = math.max(0, redis.call('ZCARD', KEYS[1]) - left_for_others)
return {claimed, cancels, sync_queued, jobs_queued, 0, continued}
