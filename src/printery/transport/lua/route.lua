-- Append a copy of an entry found in another partition to its run's partition, at most
-- once per found entry (docs/reference.md, Partitions): every group reading the stream
-- routes the entry, and a retry after a lost reply routes it again; only the first call
-- appends.
-- KEYS[1] the guard (a once key of the target partition); KEYS[2] the target stream
-- ARGV[1] guard TTL in ms; ARGV[2..] the copy's fields. Returns the new id, or false.
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
end
return false
