-- A budget review's approval releases what the run's breach held.
-- KEYS[1] the run's held stream; ARGV[1] the field naming each entry's source stream.
-- Every held entry is added back to the stream it came from, without that field, and the
-- held stream is deleted; returns the number released. Sent in the decision's MULTI:
-- atomic with the raise and with every commit that holds an entry.
local n = 0
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local f, to, out = entry[2], nil, {}
  for i = 1, #f, 2 do
    if f[i] == ARGV[1] then to = f[i + 1] else out[#out + 1] = f[i]; out[#out + 1] = f[i + 1] end
  end
  if to then
    redis.call('XADD', to, '*', unpack(out))
    n = n + 1
  end
end
redis.call('DEL', KEYS[1])
return n
