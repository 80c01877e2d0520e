-- A suspect's trial (reference: failures, a crash blames the crasher), on its record
-- (StreamKeys.suspect). 'begin': mark the entry as running alone in `consumer`, if the
-- entry is still that consumer's (a death now counts against it alone). 'end': the call
-- is over and its process lives: remove the record (the entry is no suspect any more),
-- unless the mark is no longer `consumer`'s (a later delivery's, after a claim).
-- KEYS[1] the record, KEYS[2] the stream; ARGV: mode, consumer, group, id, record ttl ms.
-- Returns 1 when it changed the record, else 0.
--@include fence
local key, mode, consumer = KEYS[1], ARGV[1], ARGV[2]
if mode == 'begin' then
  local id = ARGV[4]
  if held(KEYS[2], ARGV[3], id, consumer) == nil then
    return 0
  end
  redis.call('HSET', key, 'trial', consumer)
  redis.call('PEXPIRE', key, ARGV[5])
  return 1
end
if redis.call('HGET', key, 'trial') == consumer then
  redis.call('DEL', key)
  return 1
end
return 0
