-- Token-bucket rate limits of one API key and its tenant: requests per minute and tokens
-- per minute, each a bucket of the limit's size refilling at limit/60 per second.
-- 'reserve' takes one request and the given tokens from every configured bucket, or from
-- none when any is short; 'adjust' gives back (or takes, when negative) what the caller
-- reserved but did not use.
-- KEYS: 1 limits config hash, 2 key's bucket hash, 3 tenant's bucket hash
-- ARGV: 1 key subject ('key:ID'), 2 tenant subject ('tenant:NAME'), 3 'reserve'|'adjust',
--       4 requests, 5 tokens, 6 bucket ttl s
-- Returns {'none'} (no limit applies), {'ok'}, {'limited', subject, kind, wait ms, limit}
-- or {'too_large', subject, kind, limit} (more tokens than the bucket can ever hold).
local now = now_ms()
local cfg = redis.call('HMGET', KEYS[1], ARGV[1] .. ':rpm', ARGV[1] .. ':tpm',
  ARGV[2] .. ':rpm', ARGV[2] .. ':tpm')
local requests, tokens = tonumber(ARGV[4]), tonumber(ARGV[5])
local buckets = {}
local function add(key, subject, kind, limit, amount)
  if limit then
    table.insert(buckets, {key = key, subject = subject, kind = kind,
      cap = tonumber(limit), amount = amount})
  end
end
add(KEYS[2], ARGV[1], 'rpm', cfg[1], requests)
add(KEYS[2], ARGV[1], 'tpm', cfg[2], tokens)
add(KEYS[3], ARGV[2], 'rpm', cfg[3], requests)
add(KEYS[3], ARGV[2], 'tpm', cfg[4], tokens)
if #buckets == 0 then
  return {'none'}
end
for _, b in ipairs(buckets) do
  local raw = redis.call('HMGET', b.key, b.kind .. '_level', b.kind .. '_ms')
  b.level = b.cap
  if raw[1] then
    local elapsed = math.max(0, now - tonumber(raw[2]))
    b.level = math.min(b.cap, tonumber(raw[1]) + elapsed * b.cap / 60000)
  end
end
local function store(b, level)
  redis.call('HSET', b.key, b.kind .. '_level', tostring(level), b.kind .. '_ms', now)
  redis.call('EXPIRE', b.key, tonumber(ARGV[6]))
end
if ARGV[3] == 'adjust' then
  for _, b in ipairs(buckets) do
    store(b, math.min(b.cap, b.level + b.amount))
  end
  return {'ok'}
end
for _, b in ipairs(buckets) do
  if b.amount > b.cap then
    return {'too_large', b.subject, b.kind, b.cap}
  end
end
local worst = nil
for _, b in ipairs(buckets) do
  if b.level < b.amount then
    b.wait = (b.amount - b.level) * 60000 / b.cap
    if not worst or b.wait > worst.wait then worst = b end
  end
end
if worst then
  return {'limited', worst.subject, worst.kind, math.ceil(worst.wait), worst.cap}
end
for _, b in ipairs(buckets) do
  store(b, b.level - b.amount)
end
return {'ok'}
