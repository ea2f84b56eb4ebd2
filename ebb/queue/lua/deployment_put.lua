-- Store a deployment's record and its uid together (claim.lua reads the uid). A write
-- that is not a create never overwrites another deployment of the name (another uid: the
-- one it was read from was deleted and the name created again).
-- KEYS: 1 deployments hash, 2 deployment uids hash
-- ARGV: 1 name, 2 record (json), 3 uid ('' for a record from before uids), 4 '1': create
--       only (refused when the name is taken)
-- Returns 1 when stored, 0 when refused.
if ARGV[4] == '1' then
  if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
else
  local exists = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
  if exists and (redis.call('HGET', KEYS[2], ARGV[1]) or '') ~= ARGV[3] then return 0 end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
