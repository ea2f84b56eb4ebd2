-- Move job attempts still queued for a version that no longer serves to the version that
-- does: each leaves the old unit's job queue for the new one's, keeping its place (its
-- enqueue time), its work rewritten to name the new unit, so that the runner that claims
-- it and the usage it records agree on the version. An attempt claimed, cancelled or
-- expired meanwhile (gone from the old queue, or no longer 'queued') is left alone.
-- KEYS: 1 old job queue, 2 new job queue, 3 new unit's queue signal list,
--       4 controller wake list, 5.. the request hash of each attempt, in ARGV's order
-- ARGV: 1 new unit, 2 signal list max, then per attempt: request id, work naming the new
--       unit (json)
-- Returns how many moved.
local moved = 0
for i = 5, #KEYS do
  local rid = ARGV[2 * (i - 4) + 1]
  local score = redis.call('ZSCORE', KEYS[1], rid)
  if score and redis.call('HGET', KEYS[i], 'state') == 'queued' then
    redis.call('ZREM', KEYS[1], rid)
    redis.call('ZADD', KEYS[2], score, rid)
    redis.call('HSET', KEYS[i], 'work', ARGV[2 * (i - 4) + 2], 'deployment', ARGV[1])
    moved = moved + 1
  end
end
if moved > 0 then
  local max = tonumber(ARGV[2])
  wake_runners(KEYS[3], max)
  wake_controller(KEYS[4], ARGV[1], max)
end
return moved
