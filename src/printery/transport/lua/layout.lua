-- Write the layout once: the recorded partition count, whoever asked first.
-- KEYS[1] the layout hash; ARGV: partitions, written_at, written_by, source.
-- Returns the recorded partition count.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'written_at', ARGV[2],
             'written_by', ARGV[3], 'source', ARGV[4])
end
return redis.call('HGET', KEYS[1], 'partitions')
