-- Commit one processed entry atomically: outputs, ack and idempotency marker, or nothing.
-- KEYS[1] source stream, KEYS[2] idempotency marker key ('' for none)
-- ARGV: group, consumer, entry id, marker ttl ms, fence ('1' = only if still ours),
--       output count, then per output: stream key, once key ('' for none), field count,
--       field, value, ...
-- An empty entry id commits outputs alone (no ack, no fence): emits not caused by an entry.
-- Returns -1 when fenced out (another consumer owns the entry now), 0 when the marker
-- already existed (duplicate: acked, nothing written), else 1 + number of outputs written.
local stream, marker = KEYS[1], KEYS[2]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
local ttl = tonumber(ARGV[4])
if ARGV[5] == '1' and id ~= '' then
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 0 or pending[1][2] ~= consumer then
    return -1
  end
end
if marker ~= '' and redis.call('EXISTS', marker) == 1 then
  if id ~= '' then redis.call('XACK', stream, group, id) end
  return 0
end
local count = tonumber(ARGV[6])
local i = 7
local written = 0
for _ = 1, count do
  local key, once, nfields = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  local emit = true
  if once ~= '' then
    emit = redis.call('SET', once, '1', 'NX', 'PX', ttl)
  end
  if emit then
    local args = {}
    for f = 0, nfields * 2 - 1 do
      args[f + 1] = ARGV[i + f]
    end
    redis.call('XADD', key, '*', unpack(args))
    written = written + 1
  end
  i = i + nfields * 2
end
if id ~= '' then
  redis.call('XACK', stream, group, id)
end
if marker ~= '' then
  redis.call('SET', marker, '1', 'PX', ttl)
end
return 1 + written
