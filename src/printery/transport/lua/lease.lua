-- Renew or hand back the entries this consumer holds, never touching another's.
-- KEYS[1] stream; ARGV: group, consumer, idle ms to set ('0' = renew), ids...
-- XCLAIM ... JUSTID resets (or sets) the idle time without counting a delivery.
-- Returns the ids that are no longer ours (reclaimed by someone else, or acked).
--@include fence
local stream, group, consumer, idle = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lost = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if held(stream, group, id, consumer) == nil then
    lost[#lost + 1] = id
  elseif idle == '0' then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
  else
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'JUSTID')
  end
end
return lost
