-- The commit (transport/commit.py; docs/engine.md, The Lua library): decide a run of
-- entries, each atomically: its outputs, ack and idempotency record, or nothing; a dead
-- letter is one more kind of entry. Runs inside a MULTI right after the XADDs of every
-- output of the run, so outputs never pass through Lua: this script keeps or withdraws
-- each entry's outputs (XDEL) after its fence and record check, and acks; MULTI makes
-- the whole atomic, so no reader sees an output that is withdrawn.
--
-- Every key comes from KEYS, every value from ARGV, in the order `segments` reads them.
-- Returns the number of entries when every entry committed with all its outputs (the
-- usual case: no reply per entry is built); else one reply per entry: -1 fenced out
-- (another consumer owns the entry now; its outputs withdrawn), 0 a duplicate (its record
-- existed: acked, its outputs withdrawn), 1 + outputs kept + budget warnings written (an
-- output whose once key was taken is withdrawn, as is an outcome of a run that ended: the
-- figures of a call whose first output that is are copied to its run's withheld stream), a
-- dead letter's dlq entry id, or an error reply for an entry that cannot commit (outputs
-- withdrawn, no record, not acked). When a run index write failed, one more element: the
-- list of their errors. A failure of the script itself withdraws every output of the run,
-- writes no index, and returns the error.
--@include args
--@include clock
--@include chunks
--@include fence
--@include verdicts
--@include outputs
--@include records
--@include budget
--@include run_index
--@include letter
--@include segments
-- end of argument parsing

local bad = bad_outputs(outkeys)

-- Acks of the committed and the duplicates of segment s.
local function ack(s)
  if not troubled[s] then
    over(s.ids, s.n, function(j, k) return redis.call('XACK', s.stream, group, unpack(ARGV, j, k)) end)
    return
  end
  local ids = {}
  for x = 1, s.n do
    local v = verdict[s.first + x]
    if v == nil or v == 0 then ids[#ids + 1] = ARGV[s.ids + x - 1] end
  end
  each(ids, function(l, j, k) return redis.call('XACK', s.stream, group, unpack(l, j, k)) end)
end

-- The reply of entry x of segment s that has no verdict: 1 + the outputs it keeps.
local function kept(s, x, warned)
  local e, n = s.first + x, 0
  if s.stopped and s.m > 0 and is_stopped(s.stopped, ARGV[s.runs + x - 1]) then
    withdraw(e)  -- its run stopped: nothing of it is written (its cost was charged)
    copies[e] = {s.stop_copies, 'run_stopped'}
    return 1 + (warned[e] or 0)
  end
  for j = 1, s.m do
    local once, ends = s.once[j], s.ends[j]
    local taken = once and not redis.call('SET', KEYS[once + x - 1], '1', 'NX', 'PX', ttl)
    if not taken and not (ends and withheld(KEYS[ends + x - 1])) then
      n = n + 1
    else
      withdraw(e, j)
      if j == 1 and not taken then copies[e] = {s.withheld, 'run_ended'} end  -- charged
    end
  end
  return 1 + n + (warned[e] or 0)
end

local function decide()
  for _, s in ipairs(segs) do
    if s.kind ~= 'letter' then
      for j = 1, s.m do
        if bad[s.outs[j]] then
          for x = 1, s.n do judge(s, x, redis.error_reply(bad[s.outs[j]])) end
          break
        end
      end
      if s.stream and not troubled[s] then
        fence_range(s.stream, group, s.consumer, s.ids, s.n, function(x, v) judge(s, x, v) end)
      end
    end
  end
  record(segs, records, ttl)
  local warned = {}
  for _, s in ipairs(segs) do
    if s.stream then ack(s) end
    if s.budget then charge(s, ttl, warned) end
  end
  local checked = false  -- a partition with a stopped run: each entry is looked at
  for _, s in ipairs(segs) do
    if s.stopped then
      is_stopped(s.stopped, '')
      if stop_counts[s.stopped] > 0 then checked = true end
    end
  end
  if next(troubled) == nil and not any_once and not checked and next(warned) == nil
      and #letters == 0 then
    return total
  end
  local results = {}
  for _, s in ipairs(segs) do
    for x = 1, s.n do
      local e = s.first + x
      if s.kind == 'letter' then
        results[e] = false  -- decided after the entries (their outcomes come first)
      elseif verdict[e] == nil then
        results[e] = kept(s, x, warned)
      else
        if s.m > 0 then withdraw(e) end
        results[e] = verdict[e]
      end
    end
  end
  for _, s in ipairs(letters) do  -- one's failure is its own (it wrote in Lua)
    local ok, id = pcall(write_letter, s.letter, group)
    results[s.first + 1] = ok and id or redis.error_reply(type(id) == 'table' and id.err or tostring(id))
  end
  return results
end

local ok, results = pcall(decide)
if not ok then  -- keep nothing of a run that could not be decided; index nothing
  for e = 1, total do withdrawn[e], copies[e] = true, nil end
  apply_withdrawals(segs, bad)
  return redis.error_reply(type(results) == 'table' and results.err or tostring(results))
end
if any_withdrawn then apply_withdrawals(segs, bad) end
local errors = {}
for _, ix in ipairs(indexes) do
  for _, err in ipairs(write_run_index(ix, kept_end)) do errors[#errors + 1] = err end
end
if #errors > 0 then
  if type(results) ~= 'table' then
    results = {}
    for _, s in ipairs(segs) do
      for x = 1, s.n do results[s.first + x] = 1 + s.m end
    end
  end
  results[total + 1] = errors
end
return results
