-- Due joins of an aggregator (score <= ARGV[1]), at most ARGV[3], leased to the caller
-- until ARGV[2] (their score moved there), so two sweepers never finish the same join.
-- KEYS[1] the aggregator's join deadlines (a sorted set). Returns the correlation ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, cid in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], cid) end
return due
