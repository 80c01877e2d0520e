-- A budget review's rejection: the guard stays taken, and the held entries are kept, as
-- long as the run's budget hash lives (else ARGV[1] ms); no later hold asks again.
-- KEYS: the held stream, the review guard, the run's budget hash; ARGV[1] the ms to keep
-- them when the hash has no expiry. Returns the ms kept.
local ttl = redis.call('PTTL', KEYS[3])
if ttl <= 0 then ttl = tonumber(ARGV[1]) end
redis.call('SET', KEYS[2], 'rejected', 'PX', ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ttl) end
return ttl
