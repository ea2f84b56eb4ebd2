-- Give up the controller's leader lease, only if the caller still holds it (a lease that
-- expired and went to a standby is not the caller's to delete).
-- KEYS: 1 leader string
-- ARGV: 1 holder id
-- Returns 1 if released.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
