-- Decide a commit of processed entries, each atomically: its outputs, ack and idempotency
-- record, or nothing. Runs inside a MULTI, right after the XADDs of every output of the
-- run (see transport/streams.py: commit_commands): the outputs are written by plain
-- XADDs, so their fields never pass through Lua; this script then keeps or withdraws each
-- entry's outputs (XDEL) after its fence and record check, and acks. MULTI makes the whole
-- transaction atomic, so no reader ever sees an output that is withdrawn.
--
-- KEYS[1]  the group's idempotency index (a hash: current generation and when it began);
--          the records are fields of hashes named KEYS[1] .. ':' .. generation
-- KEYS[2…] the source stream of each entry that has a source entry id, in entry order
--          (no key is ever the empty name: an ACL confined to a prefix allows them all)
-- ARGV[1]  group; ARGV[2] idempotency record ttl in ms; then per entry: consumer, entry
--          id ('' = outputs alone: no source, no ack, no fence), flags ('f' = fenced:
--          only if the entry is still ours; 'm' = with an idempotency record), the
--          idempotency key, output count, then per output: stream key, once key ('' for
--          none). The outputs were appended in this order by the XADDs before the script,
--          so the k-th output to a stream is the k-th of that stream's last entries.
-- Returns one reply per entry: -1 when fenced out (another consumer owns the entry now;
-- its outputs withdrawn), 0 when its idempotency record already existed (a duplicate:
-- acked, its outputs withdrawn), else 1 + number of outputs kept (an output whose once
-- key was already taken is withdrawn); or an error reply for an entry that cannot commit
-- (its source stream has no such group, an output key holds another type): outputs
-- withdrawn, no record, not acked. A failure of the script itself withdraws every output
-- of the run and returns the error.
--
-- The server's work per entry is what bounds throughput, so whatever can be done once per
-- run is: one XPENDING per (stream, consumer) for the fences, one HMGET and one HSET for
-- the records, one XACK per stream. Per entry that leaves a few table lookups.
--
-- Records: one hash per generation instead of a key with a TTL each. A generation is
-- current for ttl (it rotates at the first commit after that), then previous (still
-- checked), and expires ttl after the rotation; so a record is kept at least ttl and at
-- most about twice that.

local group, ttl = ARGV[1], tonumber(ARGV[2])
local FENCE = {f = true, fm = true}
local MARK = {m = true, fm = true}

-- Pass 1: where each entry's arguments start, which stream it came from, and the first
-- and last id each (stream, consumer) fences (in the order given: a batch is read in id
-- order; if not, the range lists less and those entries are checked on their own).
local starts, sources, counts = {}, {}, {}
local ranges, outkeys = {}, {}
local a, k, n, last = 3, 2, 0, #ARGV
while a <= last do
  n = n + 1
  starts[n] = a
  local consumer, id, flags = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if id ~= '' then
    local stream = KEYS[k]
    k = k + 1
    sources[n] = stream
    if FENCE[flags] then
      local by = ranges[stream]
      if by == nil then
        by = {}
        ranges[stream] = by
      end
      local r = by[consumer]
      if r == nil then
        by[consumer] = {id, id, 1}
      else
        r[2], r[3] = id, r[3] + 1
      end
    end
  end
  local m = tonumber(ARGV[a + 4])
  counts[n] = m
  local i = a + 5
  for _ = 1, m do
    outkeys[ARGV[i]] = true
    i = i + 2
  end
  a = i
end

-- Withdrawals: positions (1-based, in append order) of the outputs to delete, per stream.
local withdrawn = {}
local any_withdrawn = false
local function withdraw_output(e, nth)
  withdrawn[e] = withdrawn[e] or {}
  withdrawn[e][nth] = true
  any_withdrawn = true
end
local function withdraw_entry(e)
  if counts[e] > 0 then
    withdrawn[e] = true
    any_withdrawn = true
  end
end

-- XDEL what was withdrawn: the outputs of a stream are its last `total` entries (the
-- transaction is atomic), found by one XREVRANGE per stream that has any to delete.
local function apply_withdrawals(bad)
  local total, doomed = {}, {}
  for e = 1, n do
    local b = starts[e]
    local w = withdrawn[e]
    local i = b + 5
    for nth = 1, counts[e] do
      local key = ARGV[i]
      local p = (total[key] or 0) + 1
      total[key] = p
      if w == true or (w and w[nth]) then
        local d = doomed[key]
        if d == nil then
          d = {}
          doomed[key] = d
        end
        d[#d + 1] = p
      end
      i = i + 2
    end
  end
  for key, positions in pairs(doomed) do
    if not bad[key] then
      local t = total[key]
      local rows = redis.call('XREVRANGE', key, '+', '-', 'COUNT', t)
      local ids = {}
      for j, p in ipairs(positions) do
        ids[j] = rows[t - p + 1][1]
      end
      for j = 1, #ids, 1000 do
        redis.call('XDEL', key, unpack(ids, j, math.min(j + 999, #ids)))
      end
    end
  end
end

-- An output key that is not a stream made its XADDs fail: entries writing there fail.
local bad = {}
for key in pairs(outkeys) do
  local kind = redis.call('TYPE', key)
  kind = type(kind) == 'table' and kind.ok or kind
  if kind ~= 'stream' then
    bad[key] = 'WRONGTYPE output stream ' .. key .. ' holds a ' .. tostring(kind)
  end
end

local has_bad = next(bad) ~= nil

local function decide()
  -- Fences: one XPENDING per (stream, consumer) over the ids its entries span. An entry
  -- it does not list is checked on its own: the batch check saves work, it decides nothing.
  local owned, broken = {}, {}
  for stream, by in pairs(ranges) do
    owned[stream] = {}
    for consumer, r in pairs(by) do
      local rows = redis.pcall('XPENDING', stream, group, r[1], r[2], 2 * r[3] + 16, consumer)
      if type(rows) == 'table' and rows.err then
        broken[stream] = rows.err
      else
        local set = {}
        for _, row in ipairs(rows) do
          set[row[1]] = true
        end
        owned[stream][consumer] = set
      end
    end
  end

  local verdict = {}
  local function fenced_out(e, stream, consumer, id)
    local set = owned[stream] and owned[stream][consumer]
    if set and set[id] then
      return false
    end
    local pending = redis.pcall('XPENDING', stream, group, id, id, 1)
    if type(pending) == 'table' and pending.err then
      verdict[e] = redis.error_reply(pending.err)
      return true
    end
    if #pending == 0 or pending[1][2] ~= consumer then
      verdict[e] = -1
      return true
    end
    return false
  end

  -- Entries that can commit, and the records they claim.
  local markers, claimants, nmarkers = {}, {}, 0
  for e = 1, n do
    local b = starts[e]
    local consumer, id, flags = ARGV[b], ARGV[b + 1], ARGV[b + 2]
    local stream = sources[e]
    if has_bad then
      local i = b + 5
      for _ = 1, counts[e] do
        if bad[ARGV[i]] then
          verdict[e] = redis.error_reply(bad[ARGV[i]])
        end
        i = i + 2
      end
    end
    if verdict[e] == nil and stream and broken[stream] then
      verdict[e] = redis.error_reply(broken[stream])
    end
    if verdict[e] == nil and not (stream and FENCE[flags] and fenced_out(e, stream, consumer, id)) then
      if MARK[flags] then
        nmarkers = nmarkers + 1
        markers[nmarkers] = ARGV[b + 3]
        claimants[nmarkers] = e
      else
        verdict[e] = true
      end
    end
  end

  -- Records: which markers exist (current and previous generation), one HMGET each.
  local recorded = {}
  local current
  if nmarkers > 0 then
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
    local exists = {}
    local function lookup(hash)
      for j = 1, nmarkers, 1000 do
        local got = redis.call('HMGET', hash, unpack(markers, j, math.min(j + 999, nmarkers)))
        for x = 1, #got do
          if got[x] then exists[markers[j + x - 1]] = true end
        end
      end
    end
    lookup(current)
    if gen > 1 and redis.call('EXISTS', index .. ':' .. (gen - 1)) == 1 then
      lookup(index .. ':' .. (gen - 1))
    end
    local new, nnew = {}, 0
    for j = 1, nmarkers do
      local marker, e = markers[j], claimants[j]
      if exists[marker] or recorded[marker] then
        verdict[e] = 0
      else
        recorded[marker] = true
        new[nnew + 1], new[nnew + 2] = marker, '1'
        nnew = nnew + 2
        verdict[e] = true
      end
    end
    for j = 1, nnew, 1000 do
      redis.call('HSET', current, unpack(new, j, math.min(j + 999, nnew)))
    end
    if nnew > 0 then
      redis.call('PEXPIRE', current, 2 * ttl, 'NX')
    end
  end

  -- Outcomes: acks, once keys, withdrawals.
  local acks, results = {}, {}
  for e = 1, n do
    local b = starts[e]
    local v = verdict[e]
    local stream = sources[e]
    if v == true or v == 0 then
      if stream then
        local ids = acks[stream]
        if ids == nil then
          acks[stream] = {ARGV[b + 1]}
        else
          ids[#ids + 1] = ARGV[b + 1]
        end
      end
    end
    if v == true then
      local kept, i = 0, b + 5
      for nth = 1, counts[e] do
        local once = ARGV[i + 1]
        if once == '' or redis.call('SET', once, '1', 'NX', 'PX', ttl) then
          kept = kept + 1
        else
          withdraw_output(e, nth)
        end
        i = i + 2
      end
      results[e] = 1 + kept
    else
      withdraw_entry(e)
      results[e] = v
    end
  end
  for stream, ids in pairs(acks) do
    for j = 1, #ids, 1000 do
      redis.call('XACK', stream, group, unpack(ids, j, math.min(j + 999, #ids)))
    end
  end
  return results
end

local ok, results = pcall(decide)
if not ok then
  -- Keep nothing of a run that could not be decided.
  for e = 1, n do
    withdrawn[e] = true
  end
  apply_withdrawals(bad)
  local err = type(results) == 'table' and results.err or tostring(results)
  return redis.error_reply(err)
end
if any_withdrawn then
  apply_withdrawals(bad)
end
return results
