-- Count one Map item's result for its run (reference: fan-out), atomically: record the
-- item's value unless it was recorded before (a redelivered result counts once) and say
-- how many items the run has now, or that its output was written already.
--
-- KEYS[1] the run's count hash (field: item index), KEYS[2] the once key of the Map's
--         output for the run (both in the run's partition)
-- ARGV[1] the item's index, ARGV[2] its value, ARGV[3] the hash's ttl in seconds
-- Returns {1, 0} when the output was written already, else {0, items counted}.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {1, 0}
end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {0, redis.call('HLEN', KEYS[1])}
