-- Rotate a tenant's webhook signing secret: the current one stays valid (deliveries are
-- signed with both) until the overlap ends, so receivers can switch without a gap.
-- KEYS: 1 secret hash
-- ARGV: 1 new secret, 2 overlap ms
-- Returns the end of the overlap (ms; 0 when there was no secret before).
local now = now_ms()
local current = redis.call('HGET', KEYS[1], 'current')
local until_ms = 0
if current then
  until_ms = now + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'previous', current, 'previous_until_ms', until_ms)
end
redis.call('HSET', KEYS[1], 'current', ARGV[1], 'rotated_ms', now)
return until_ms
