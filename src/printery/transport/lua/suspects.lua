-- Screen entries just claimed (reference: failures, a crash blames the crasher): what the
-- end of their last delivery says, from each entry's suspect record (StreamKeys.suspect).
-- * handed back by a live process (`handed`): no death; the record is otherwise kept;
-- * its process died while it ran alone (`trial`): that delivery counts, and it stays a
--   suspect (it runs alone again);
-- * else its process died (or lost it) while it may have run among others: that delivery
--   does not count (its delivery count is set back by one) and it becomes a suspect.
-- KEYS[1] the stream, KEYS[1 + i] entry i's record; ARGV: group, consumer, record ttl ms,
-- then the ids. Returns per entry {suspect 0/1, its delivery count}, {-1, 0} when it is
-- no longer this consumer's.
--@include fence
local stream, group, consumer, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV do
  local id, key = ARGV[i], KEYS[i - 2]
  local row = held(stream, group, id, consumer)
  if row == nil then
    out[#out + 1] = {-1, 0}
  else
    local count = tonumber(row[4])
    if redis.call('HEXISTS', key, 'handed') == 1 then
      redis.call('HDEL', key, 'handed')
    elseif redis.call('HEXISTS', key, 'trial') == 1 then
      redis.call('HDEL', key, 'trial')
      redis.call('HSET', key, 'suspect', '1')
    else
      redis.call('HSET', key, 'suspect', '1')
      if count > 1 then
        count = count - 1
        redis.call('XCLAIM', stream, group, consumer, 0, id, 'RETRYCOUNT', count, 'JUSTID')
      end
    end
    if redis.call('EXISTS', key) == 1 then
      redis.call('PEXPIRE', key, ttl)
    end
    out[#out + 1] = {redis.call('HEXISTS', key, 'suspect'), count}
  end
end
return out
