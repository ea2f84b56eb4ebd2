-- A runner whose engine stalled (a step that does not return) gives up before it kills
-- itself: the leases of the requests it holds expire now, so the reaper's next pass
-- treats them as a lost runner's (they run again, or end with runner_lost) instead of
-- waiting out a lease the live heartbeat thread kept renewing; the stall is counted for
-- /metrics; the runner is recorded failed and no longer claims for its deployment.
-- KEYS: 1 runner hash, 2 leases zset, 3 shared metric counters hash, 4 claiming marker
-- ARGV: 1 counter field, 2 error, 3.. request ids held
-- Returns the number of leases expired.
local now = now_ms()
local expired = 0
for i = 3, #ARGV do
  expired = expired + redis.call('ZADD', KEYS[2], 'XX', 'CH', now, ARGV[i])
end
redis.call('HINCRBYFLOAT', KEYS[3], ARGV[1], 1)
redis.call('HSET', KEYS[1], 'state', 'failed', 'error', ARGV[2], 'exited_ms', now)
redis.call('DEL', KEYS[4])
return expired
