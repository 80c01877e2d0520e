-- Commit processed entries, each atomically: its outputs, ack and idempotency marker, or
-- nothing. One call commits a batch (one round trip, one script run for many entries);
-- every entry keeps its own fence, duplicate check and result.
-- KEYS: per entry, the source stream and the idempotency marker key ('' for none)
-- ARGV: per entry: group, consumer, entry id, marker ttl ms, fence ('1' = only if still
--       ours), output count, then per output: stream key, once key ('' for none), field
--       count, field, value, ...
-- An empty entry id commits outputs alone (no ack, no fence): emits not caused by an entry.
-- Returns one reply per entry: -1 when fenced out (another consumer owns the entry now),
-- 0 when the marker already existed (duplicate: acked, nothing written), else 1 + number of
-- outputs written; or an error reply for an entry whose command failed (as with any script
-- error, what that entry wrote before the failure stays; the other entries are unaffected).

local function commit_one(stream, marker, a)
  local group, consumer, id = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local ttl = tonumber(ARGV[a + 3])
  if ARGV[a + 4] == '1' and id ~= '' then
    local pending = redis.call('XPENDING', stream, group, id, id, 1)
    if #pending == 0 or pending[1][2] ~= consumer then
      return -1
    end
  end
  if marker ~= '' and redis.call('EXISTS', marker) == 1 then
    if id ~= '' then redis.call('XACK', stream, group, id) end
    return 0
  end
  local count = tonumber(ARGV[a + 5])
  local i = a + 6
  local written = 0
  for _ = 1, count do
    local key, once, nfields = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    i = i + 3
    local emit = true
    if once ~= '' then
      emit = redis.call('SET', once, '1', 'NX', 'PX', ttl)
    end
    if emit then
      redis.call('XADD', key, '*', unpack(ARGV, i, i + nfields * 2 - 1))
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
end

local results = {}
local a = 1
for e = 1, #KEYS / 2 do
  -- Find where the next entry's arguments start before running this one, so a failing
  -- entry cannot shift the arguments of the entries after it.
  local start = a
  local i = start + 6
  for _ = 1, tonumber(ARGV[start + 5]) do
    i = i + 3 + tonumber(ARGV[i + 2]) * 2
  end
  a = i
  local ok, result = pcall(commit_one, KEYS[2 * e - 1], KEYS[2 * e], start)
  if ok then
    results[e] = result
  elseif type(result) == 'table' and result.err then
    results[e] = redis.error_reply(result.err)
  else
    results[e] = redis.error_reply(tostring(result))
  end
end
return results
