-- Cancel a run (runs/cancel.py; docs/reference.md, Cancelling a run): its outcome
-- `run:cancelled` and its mark in one step, so of any number of concurrent cancels
-- exactly one ends the run, and no commit after it writes an output of the run.
-- KEYS[1] the run's info hash, KEYS[2] its start record, KEYS[3] the run:cancelled
-- stream, KEYS[4] the stopped runs, KEYS[5] every run, KEYS[6] the running ones,
-- KEYS[7] the cancelled ones, KEYS[8] the statuses set, KEYS[9] the run's reservations,
-- KEYS[10] the deadlines. ARGV[1] run id, ARGV[2] how long the stop mark is kept (ms),
-- ARGV[3..] the outcome entry's fields.
-- Returns {1, entry id} when this call ended the run, {0, its status} when it had ended
-- already, {-1, ''} for a run with no entry and none submitted.
--@include clock
local run = ARGV[1]
local at = redis.call('HMGET', KEYS[1], 'ended', 'status')
if at[1] then return {0, at[2] or ''} end
if redis.call('ZSCORE', KEYS[5], run) == false and redis.call('EXISTS', KEYS[2]) == 0 then
  return {-1, ''}
end
local now, keep = now_ms(), tonumber(ARGV[2])
local id = redis.call('XADD', KEYS[3], '*', unpack(ARGV, 3))
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'ended', now, 'dead_letter', '')
redis.call('ZADD', KEYS[5], 'NX', now, run)
redis.call('ZREM', KEYS[6], run)
redis.call('ZADD', KEYS[7], now, run)
redis.call('SADD', KEYS[8], 'cancelled')
redis.call('ZADD', KEYS[4], now, run)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - keep)
redis.call('PEXPIRE', KEYS[4], keep)
redis.call('DEL', KEYS[9])
redis.call('ZREM', KEYS[10], run)
return {1, id}
