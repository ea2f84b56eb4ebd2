-- Set (or, with an empty budget, remove) a subject's budget and bump the budgets' version
-- in one step: a frontdoor that skips the reserve script for subjects it knew to have no
-- budget re-reads which have one as soon as it sees the version change
-- (ebb/frontdoor/budget_presence.py), so no change can slip between the two.
-- KEYS: 1 budgets config hash, 2 budgets version counter
-- ARGV: 1 subject, 2 the budget (json; '' to remove it)
-- Returns the new version.
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return redis.call('INCR', KEYS[2])
