-- Take an entry we hold back for another attempt, counting a delivery (XCLAIM without
-- JUSTID increments the delivery counter), only if it is still ours.
-- KEYS[1] stream; ARGV: group, consumer, id. Returns the delivery count, or -1 if lost.
--@include fence
local stream, group, consumer, id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local row = held(stream, group, id, consumer)
if row == nil then
  return -1
end
redis.call('XCLAIM', stream, group, consumer, 0, id)
return row[4] + 1
