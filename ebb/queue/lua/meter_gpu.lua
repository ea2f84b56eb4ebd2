-- Meter a runner's GPU time since it was last metered (or launched) as one segment on the
-- GPU usage stream. Segments of one runner never overlap and leave no gap, whoever writes
-- them: the runner itself (periodically, when assigned, at exit) or the controller closing
-- the interval of a runner that was SIGKILLed (from its last heartbeat). Once closed, a
-- runner is never metered again.
-- KEYS: 1 runner hash, 2 gpu usage stream
-- ARGV: 1 segment end: ms, or fields of the runner hash holding times, the latest of which
--          is the end ('heartbeat_ms', 'exited_ms', 'heartbeat_ms,ready_ms,launched_ms');
--          never past the runner's recorded exit
--       2 attribution (json GpuMeter) or ''
--       3 'switch': the segment is billed to the stored attribution (ARGV[2] when none is
--          stored yet), then ARGV[2] is stored for what follows;
--         'fallback': billed to the stored attribution, ARGV[2] only when none is stored
--       4 '1' closes the runner's metering
--       5 the runner's milliseconds by use over the segment (json, GpuSegment.uses_ms) or
--          '' when no runner accounted for it
-- An end that is not known yet (no heartbeat, no recorded exit) meters nothing and does not
-- close: whoever knows the end later closes the interval.
-- Returns the metered milliseconds (0 when nothing was written), -1 when already closed,
-- -2 when asked to close without a known end.
local f = redis.call('HMGET', KEYS[1], 'meter_closed', 'metered_ms', 'launched_ms', 'meter',
  'exited_ms')
if f[1] == '1' then
  return -1
end
local start = tonumber(f[2] or '') or tonumber(f[3] or '') or 0
local stop = tonumber(ARGV[1])
if not stop then
  stop = 0
  for name in string.gmatch(ARGV[1], '[^,]+') do
    stop = math.max(stop, tonumber(redis.call('HGET', KEYS[1], name) or '') or 0)
  end
end
local exited = tonumber(f[5] or '') or 0
if exited > 0 and stop > exited then
  stop = exited
end
local metered = 0
if stop > 0 then
  local meta = f[4]
  if not meta or meta == '' then
    meta = ARGV[2]
  end
  if start > 0 and stop > start and meta ~= '' then
    if ARGV[5] and ARGV[5] ~= '' then
      redis.call('XADD', KEYS[2], '*', 'g', meta, 's', string.format('%d', start),
        'e', string.format('%d', stop), 'p', ARGV[5])
    else
      redis.call('XADD', KEYS[2], '*', 'g', meta, 's', string.format('%d', start),
        'e', string.format('%d', stop))
    end
    metered = stop - start
  end
  if stop > start then
    redis.call('HSET', KEYS[1], 'metered_ms', string.format('%d', stop))
  end
end
if ARGV[3] == 'switch' and ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'meter', ARGV[2])
end
if ARGV[4] == '1' then
  if stop <= 0 then
    return -2
  end
  redis.call('HSET', KEYS[1], 'meter_closed', '1')
end
return metered
