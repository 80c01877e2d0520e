-- Take an entry we hold back for another attempt, counting a delivery (XCLAIM without
-- JUSTID increments the delivery counter), only if it is still ours.
-- KEYS[1] stream; ARGV: group, consumer, id. Returns the delivery count, or -1 if lost.
local stream, group, consumer, id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local pending = redis.call('XPENDING', stream, group, id, id, 1)
if #pending == 0 or pending[1][2] ~= consumer then
  return -1
end
redis.call('XCLAIM', stream, group, consumer, 0, id)
return pending[1][4] + 1
