-- Commit processed entries, each atomically: its outputs, ack and idempotency record, or
-- nothing. One call commits a batch (one round trip, one script run for many entries);
-- every entry keeps its own fence, duplicate check and result.
--
-- KEYS[1]  the group's idempotency index (a hash: current generation and when it began);
--          the records are fields of hashes named KEYS[1] .. ':' .. generation
-- KEYS[2…] the source stream of each entry that has a source entry id, in entry order
--          (no key is ever the empty name: an ACL confined to a prefix allows them all)
-- ARGV[1]  group; ARGV[2] idempotency record ttl in ms; then per entry: consumer, entry
--          id ('' = outputs alone: no source, no ack, no fence), flags ('f' = fenced:
--          only if the entry is still ours; 'm' = with an idempotency record), the
--          idempotency key, output count, then per output: stream key, once key ('' for
--          none), field count, field, value, ...
-- Returns one reply per entry: -1 when fenced out (another consumer owns the entry now),
-- 0 when its idempotency record already existed (a duplicate: acked, nothing written),
-- else 1 + number of outputs written; or an error reply for an entry that failed (its
-- record is withdrawn and it is not acked; outputs it wrote before the failure stay, as
-- with any script error; the other entries are unaffected).
--
-- The server's work per entry is what bounds throughput, so whatever can be done once
-- per run is: one XPENDING per (stream, consumer) for the fences, one TIME and HMGET for
-- the record generation, one XACK per stream (at the end: the run is atomic, so no one
-- sees an entry's outputs without its ack). Per entry that leaves HSETNX (plus HEXISTS
-- while a previous generation exists) and the XADDs.
--
-- Records: one hash per generation instead of a key with a TTL each (a key per record
-- cost the server more than the XADD). A generation is current for ttl (it rotates at
-- the first commit after that), then previous (still checked), and expires ttl after the
-- rotation; so a record is kept at least ttl and at most about twice that.

local group, ttl = ARGV[1], tonumber(ARGV[2])
local FENCE = {f = true, fm = true}
local MARK = {m = true, fm = true}

-- Pass 1: where each entry's arguments start, which stream it came from (found before
-- any entry runs, so a failing entry cannot shift the arguments of those after it), and
-- the range of ids each (stream, consumer) fences.
local starts, sources, ranges = {}, {}, {}
local marked = false
local a, k, n, last = 3, 2, 0, #ARGV
while a <= last do
  n = n + 1
  starts[n] = a
  local id, flags = ARGV[a + 1], ARGV[a + 2]
  if id ~= '' then
    local stream = KEYS[k]
    k = k + 1
    sources[n] = stream
    if FENCE[flags] then
      local ms, seq = string.match(id, '^(%d+)-(%d+)$')
      ms, seq = tonumber(ms), tonumber(seq)
      if ms then
        local key = stream .. '\0' .. ARGV[a]
        local r = ranges[key]
        if r == nil then
          ranges[key] = {stream, ARGV[a], id, ms, seq, id, ms, seq, 1}
        else
          if ms < r[4] or (ms == r[4] and seq < r[5]) then
            r[3], r[4], r[5] = id, ms, seq
          end
          if ms > r[7] or (ms == r[7] and seq > r[8]) then
            r[6], r[7], r[8] = id, ms, seq
          end
          r[9] = r[9] + 1
        end
      end
    end
  end
  if MARK[flags] then marked = true end
  local i = a + 5
  for _ = 1, tonumber(ARGV[a + 4]) do
    i = i + 3 + tonumber(ARGV[i + 2]) * 2
  end
  a = i
end

-- One XPENDING per (stream, consumer) over the ids its entries span. An entry it does not
-- list is checked on its own below (the range held more of the consumer's entries than
-- asked for, or the id did not parse): the batch check saves work, it decides nothing.
local owned = {}
for key, r in pairs(ranges) do
  local set = {}
  for _, row in ipairs(redis.call('XPENDING', r[1], group, r[3], r[6], 2 * r[9] + 16, r[2])) do
    set[row[1]] = true
  end
  owned[key] = set
end

-- The record generation, only if some entry records one.
local current, previous
if marked then
  local index = KEYS[1]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local meta = redis.call('HMGET', index, 'gen', 'start')
  local gen, start = tonumber(meta[1]), tonumber(meta[2])
  if gen == nil or start == nil then
    gen = 1
    redis.call('HSET', index, 'gen', gen, 'start', now)
    redis.call('PEXPIRE', index, 3 * ttl)
  elseif now - start >= ttl then
    redis.call('PEXPIRE', index .. ':' .. gen, ttl)
    gen = gen + 1
    redis.call('HSET', index, 'gen', gen, 'start', now)
    redis.call('PEXPIRE', index, 3 * ttl)
  end
  current = index .. ':' .. gen
  if gen > 1 and redis.call('EXISTS', index .. ':' .. (gen - 1)) == 1 then
    previous = index .. ':' .. (gen - 1)
  end
end

local acks = {}
local function ack(stream, id)
  local ids = acks[stream]
  if ids == nil then
    acks[stream] = {id}
  else
    ids[#ids + 1] = id
  end
end

local function write_outputs(a)
  local i, written = a + 5, 0
  for _ = 1, tonumber(ARGV[a + 4]) do
    local key, once, nfields = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    i = i + 3
    if once == '' or redis.call('SET', once, '1', 'NX', 'PX', ttl) then
      redis.call('XADD', key, '*', unpack(ARGV, i, i + nfields * 2 - 1))
      written = written + 1
    end
    i = i + nfields * 2
  end
  return written
end

local recorded = false
local function commit_one(e)
  local a = starts[e]
  local consumer, id, flags = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local stream = sources[e]
  if stream and FENCE[flags] then
    local set = owned[stream .. '\0' .. consumer]
    if set == nil or not set[id] then
      local pending = redis.call('XPENDING', stream, group, id, id, 1)
      if #pending == 0 or pending[1][2] ~= consumer then
        return -1
      end
    end
  end
  local marker
  if MARK[flags] then
    marker = ARGV[a + 3]
    if (previous and redis.call('HEXISTS', previous, marker) == 1)
        or redis.call('HSETNX', current, marker, '1') == 0 then
      if stream then ack(stream, id) end
      return 0
    end
    recorded = true
  end
  local ok, written = pcall(write_outputs, a)
  if not ok then
    if marker then redis.call('HDEL', current, marker) end
    error(written)
  end
  if stream then ack(stream, id) end
  return 1 + written
end

local results = {}
for e = 1, n do
  local ok, result = pcall(commit_one, e)
  if ok then
    results[e] = result
  elseif type(result) == 'table' and result.err then
    results[e] = redis.error_reply(result.err)
  else
    results[e] = redis.error_reply(tostring(result))
  end
end
if recorded then
  redis.call('PEXPIRE', current, 2 * ttl, 'NX')
end
for stream, ids in pairs(acks) do
  for i = 1, #ids, 1000 do
    redis.call('XACK', stream, group, unpack(ids, i, math.min(i + 999, #ids)))
  end
end
return results
