-- Delete a deployment in one step: its record and its uid (so no runner of it claims
-- again, see claim.lua), its versions and split, and each serving unit's queues, sleepers
-- and state. What is still queued for a unit fails with ARGV[5] (a synchronous request's
-- client gets it as its answer; a job attempt settles failed through the collector,
-- which is woken), so a new deployment of the same name never serves it. Sleepers are
-- told to exit. Work runners already hold is theirs to finish.
-- Units: version 1 is the bare name, version N 'name' .. ARGV[2] .. N (see versions.py).
-- KEYS: 1 deployments hash, 2 deployment uids hash, 3 versions hash, 4 traffic split,
--       5 job watch set, 6 collector signal list
-- ARGV: 1 name, 2 version separator, 3 request key prefix, 4 events key prefix,
--       5 encoded Failed event, 6 result ttl s (synchronous), 7 job attempt ttl s,
--       8 signal list max, 9 runner assignment key prefix, 10 sleeper exit token,
--       11 queue prefix, 12 job queue prefix, 13 sleepers prefix, 14 claiming prefix,
--       15 status prefix, 16 cold-start prefix, 17 prefix owners prefix
-- Returns {1, requests failed} when deleted, {0, 0} when there was no such deployment.
local name = ARGV[1]
if redis.call('HDEL', KEYS[1], name) == 0 then
  return {0, 0}
end
redis.call('HDEL', KEYS[2], name)
local units = {name}
for _, number in ipairs(redis.call('HKEYS', KEYS[3])) do
  if number ~= '1' then table.insert(units, name .. ARGV[2] .. number) end
end
redis.call('DEL', KEYS[3], KEYS[4])

local failed = 0
local jobs = 0
local function fail_queued(queue, ttl)
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    local rkey = ARGV[3] .. id
    local fields = redis.call('HMGET', rkey, 'state', 'job')
    if fields[1] == 'queued' then
      redis.call('HSET', rkey, 'state', 'failed', 'error', 'deployment_deleted')
      redis.call('EXPIRE', rkey, ttl)
      local ekey = ARGV[4] .. id
      redis.call('XADD', ekey, '*', 'e', ARGV[5])
      redis.call('EXPIRE', ekey, ttl)
      failed = failed + 1
      if fields[2] and fields[2] ~= '' then
        redis.call('SADD', KEYS[5], fields[2])
        jobs = jobs + 1
      end
    end
  end
  redis.call('DEL', queue)
end

for _, unit in ipairs(units) do
  fail_queued(ARGV[11] .. unit, tonumber(ARGV[6]))
  fail_queued(ARGV[12] .. unit, tonumber(ARGV[7]))
  local sleepers = ARGV[13] .. unit
  for _, runner in ipairs(redis.call('SMEMBERS', sleepers)) do
    redis.call('RPUSH', ARGV[9] .. runner, ARGV[10])
  end
  redis.call('DEL', sleepers, ARGV[14] .. unit, ARGV[15] .. unit, ARGV[16] .. unit,
    ARGV[17] .. unit)
end
if jobs > 0 then
  push_signal(KEYS[6], tonumber(ARGV[8]))
end
return {1, failed}
