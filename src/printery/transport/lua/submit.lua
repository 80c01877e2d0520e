-- Publish one ingress entry at most once per idempotency key (Client.submit): the check
-- and the XADD in one step, so two processes submitting one key at once make one run.
-- KEYS[1]: the submit record (<prefix>:submit:<idempotency key>)
-- KEYS[2]: the ingress stream
-- KEYS[3]: the run's start record (<prefix>:run:<run id>): where its entries begin
-- KEYS[4], KEYS[5]: the run index (every run; the running ones; printery/run_index.py):
--   a submitted run is indexed with its entry
-- ARGV[1]: run id; ARGV[2]: TTL of both records, seconds; ARGV[3..]: the entry's fields
-- Returns {1, "<run id>\n<entry id>"} when it wrote, {0, the same of the earlier submit}.
local known = redis.call('GET', KEYS[1])
if known then
  return {0, known}
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
local record = ARGV[1] .. '\n' .. id
redis.call('SET', KEYS[1], record, 'EX', ARGV[2])
redis.call('SET', KEYS[3], id, 'EX', ARGV[2], 'NX')
local now = tonumber(string.match(id, '^(%d+)'))
redis.call('ZADD', KEYS[4], 'NX', now, ARGV[1])
redis.call('ZADD', KEYS[5], 'NX', now, ARGV[1])
return {1, record}
