-- Fold observations into exponential moving averages kept in one hash.
-- KEYS: 1 hash
-- ARGV: 1 weight of the new observation (0..1), then field, value pairs
local alpha = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  local new = tonumber(ARGV[i + 1])
  if old then new = alpha * new + (1 - alpha) * tonumber(old) end
  redis.call('HSET', KEYS[1], ARGV[i], tostring(new))
end
return 1
