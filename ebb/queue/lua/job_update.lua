-- Change a job that is not settled yet, and only while `request id` is still its current
-- attempt: the collector marks a job running or settles it this way, so a decision taken
-- on a stale read (a cancel, another collector) is refused rather than applied.
-- KEYS: 1 job hash
-- ARGV: 1 request id, 2 number of terminal statuses N, 3..2+N terminal statuses,
--       then field, value pairs
-- Returns 1 when changed, 0 when refused.
local job = redis.call('HMGET', KEYS[1], 'status', 'request_id')
if not job[1] or job[2] ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[2])
for i = 3, 2 + n do
  if job[1] == ARGV[i] then return 0 end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3 + n, #ARGV))
return 1
