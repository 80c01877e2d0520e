-- Decide a commit of processed entries, each atomically: its outputs, ack and idempotency
-- record, or nothing. Runs inside a MULTI, right after the XADDs of every output of the
-- run (see transport/commit.py: commit_commands): the outputs are written by plain
-- XADDs, so their fields never pass through Lua; this script then keeps or withdraws each
-- entry's outputs (XDEL) after its fence and record check, and acks. MULTI makes the whole
-- transaction atomic, so no reader ever sees an output that is withdrawn.
--
-- The arguments come in segments: consecutive entries that share a source stream, a
-- consumer, whether they carry an idempotency record, and the streams of their outputs.
-- A segment's per-entry values are columns, so the commands that take lists (XPENDING
-- over a range, SMISMEMBER, SADD, XACK) get them straight from ARGV with unpack: in the
-- usual run (one segment, every entry committed) Lua touches each entry only to compare
-- two ids and read one flag. Interpreted Lua per entry is what this script costs the
-- server, so whatever can be done once per segment or run is.
--
-- KEYS[1]  the group's idempotency index (a hash: current generation and when it began);
--          the records are members of sets named KEYS[1] .. ':r' .. generation
-- KEYS[2…] the source streams of the segments (each once)
-- ARGV[1]  group; ARGV[2] idempotency record ttl in ms; ARGV[3] x: how many of the last
--          arguments are the run index's writes (see below); then each segment:
--            source (position of its stream in KEYS, '0' = outputs alone: no source, no
--            ack, no fence), consumer, entry count n, '1' if its entries carry records
--            (else '0'), outputs per entry m, budget fields per entry nb, then per output:
--            stream key, its flags: 1 if it has a once key, + 2 if it is an outcome of
--            its entry's run (withheld when that run has ended: see below);
--            when nb > 0 (a pipeline with budgets): the budget hash prefix,
--            the correlation field, the warning stream, the over set ('' = none), the
--            reservations hash prefix ('' = none: the step reserves nothing), the
--            scale (the hash counts whole 1/scale of a unit), amount columns na, t, t
--            values (the warning entry's fields, name then value), then per budget
--            field: its name, its soft threshold ('' = none), its hard limit ('' = none),
--            both scaled, the warning's data up to its spent, its amount column (1..na:
--            fields of one unit share one);
--            then the columns, n values each: entry ids (if it has a source), idempotency
--            keys (if it carries records), once keys (one column per output with one)
--            and the run info hashes of an outcome output (after its once keys), run ids
--            and na amount columns (if nb > 0).
--          The outputs were appended in entry order, an entry's in output order, by the
--          XADDs before the script, so the k-th output to a stream is the k-th of that
--          stream's last entries.
-- Returns the number of entries when every entry committed with all its outputs (the
-- usual case, so no reply per entry is built); else one reply per entry: -1 when fenced
-- out (another consumer owns the entry now; its outputs withdrawn), 0 when its record
-- already existed (a duplicate: acked, its outputs withdrawn), else 1 + number of outputs
-- kept (an output whose once key was already taken is withdrawn, as is an outcome of a
-- run that has ended) + budget warnings this
-- commit wrote; or an error reply for an
-- entry that cannot commit (its source stream has no such group, an output key holds
-- another type): outputs withdrawn, no record, not acked. A failure of the script itself
-- withdraws every output of the run and returns the error.
--
-- The run index's writes (printery/run_index.py), the last x arguments: per command its
-- argument count, then the command. They are idempotent and made whatever each entry's
-- verdict (a duplicate's were made by the commit it duplicates), once the outputs are
-- decided, and not at all when the script itself failed; an
-- error in one (a key of another type) is left to the index, never to the commit. Here
-- rather than as commands of the transaction: a command there costs the client a packing
-- and a reply each, an argument here nearly nothing.
--
-- A run gets one outcome: an outcome output (flag 2) of a run whose info hash has `ended`
-- (the run index's: its outcome was written before; a dlq replay that continues a run
-- clears it), unless a dead letter ended it (`dead_letter` set: its run:failed gives way
-- to a later outcome), is withdrawn, as is a second one of a run this script run ended. The run
-- index's writes of that end come behind a guard, ('?ended', info hash, n): the n
-- commands after it are made only if an outcome of that run was kept here (once), so the
-- first outcome stays the run's status.
--
-- Records: one set per generation instead of a key with a TTL each. A generation is
-- current for ttl (it rotates at the first commit after that), then previous (still
-- checked), and expires ttl after the rotation; so a record is kept at least ttl and at
-- most about twice that.

local group, ttl = ARGV[1], tonumber(ARGV[2])
local unpack = unpack
local indexed = #ARGV - tonumber(ARGV[3])

-- Segments (parsed once each; nothing here is per entry).
local segs, nsegs, total = {}, 0, 0
local outkeys, any_once, any_budget = {}, false, false
local a, last = 4, indexed
while a <= last do
  local src, n, m = tonumber(ARGV[a]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 4])
  local nb = tonumber(ARGV[a + 5])
  local s = {consumer = ARGV[a + 1], n = n, m = m, first = total, outs = {}, once = {},
             ends = {}}
  if src > 0 then s.stream = KEYS[src] end
  local marked = ARGV[a + 3] == '1'
  a = a + 6
  for j = 1, m do
    s.outs[j] = ARGV[a]
    outkeys[ARGV[a]] = true
    local flags = tonumber(ARGV[a + 1])
    s.once[j] = flags % 2 == 1
    s.ends[j] = flags >= 2
    a = a + 2
  end
  local b
  if nb > 0 then
    b = {prefix = ARGV[a], corr = ARGV[a + 1], stream = ARGV[a + 2], over = ARGV[a + 3],
         reserved = ARGV[a + 4], scale = tonumber(ARGV[a + 5]), na = tonumber(ARGV[a + 6]),
         tpl = a + 8, ntpl = tonumber(ARGV[a + 7]), fields = {}}
    a = a + 8 + b.ntpl
    for j = 1, nb do
      b.fields[j] = {name = ARGV[a], soft = tonumber(ARGV[a + 1]), hard = tonumber(ARGV[a + 2]),
                     note = ARGV[a + 3], column = tonumber(ARGV[a + 4])}
      a = a + 5
    end
    s.budget = b
    any_budget = true
  end
  if s.stream then s.ids = a; a = a + n end
  if marked then s.marks = a; a = a + n end
  for j = 1, m do
    if s.once[j] then
      s.once[j] = a
      a = a + n
      any_once = true
    end
    if s.ends[j] then
      s.ends[j] = a
      a = a + n
      any_once = true
    end
  end
  if b then
    b.runs = a
    a = a + n
    for j = 1, nb do
      b.fields[j].col = a + (b.fields[j].column - 1) * n
    end
    a = a + b.na * n
  end
  nsegs = nsegs + 1
  segs[nsegs] = s
  total = total + n
end
-- end of argument parsing

-- ``call(j, k)`` over ARGV[b .. b + n - 1], 1000 at a time (Lua's stack bounds unpack);
-- its replies in order, concatenated.
local function over(b, n, call)
  local out = {}
  for j = b, b + n - 1, 1000 do
    local reply = call(j, math.min(j + 999, b + n - 1))
    if type(reply) == 'table' then
      for x = 1, #reply do out[#out + 1] = reply[x] end
    else
      out[#out + 1] = reply
    end
  end
  return out
end

-- ``call(list, j, k)`` over a list, 1000 at a time; the sum of its replies.
local function each(list, call)
  local sum = 0
  for j = 1, #list, 1000 do
    sum = sum + call(list, j, math.min(j + 999, #list))
  end
  return sum
end

-- Verdicts per entry (0-based across the run: segment first + x): nil = commits.
local verdict = {}
local troubled = {}  -- segment -> true once any of its entries has a verdict
local function judge(s, x, v)
  verdict[s.first + x] = v
  troubled[s] = true
end

-- Withdrawals: which outputs to delete (entry -> true for all, or slot -> true).
local withdrawn = {}
local any_withdrawn = false

-- XDEL what was withdrawn: the outputs of a stream are its last `count` entries (the
-- transaction is atomic), found by one XREVRANGE per stream that has any to delete.
local function apply_withdrawals(bad)
  local count, doomed = {}, {}
  for _, s in ipairs(segs) do
    for x = 1, s.n do
      local w = withdrawn[s.first + x]
      for j = 1, s.m do
        local key = s.outs[j]
        local p = (count[key] or 0) + 1
        count[key] = p
        if w == true or (w and w[j]) then
          local d = doomed[key]
          if d == nil then
            d = {}
            doomed[key] = d
          end
          d[#d + 1] = p
        end
      end
    end
  end
  for key, positions in pairs(doomed) do
    if not bad[key] then
      local t = count[key]
      local rows = redis.call('XREVRANGE', key, '+', '-', 'COUNT', t)
      local ids = {}
      for j, p in ipairs(positions) do
        ids[j] = rows[t - p + 1][1]
      end
      each(ids, function(l, j, k) return redis.call('XDEL', key, unpack(l, j, k)) end)
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

local function fail_segment(s, message)
  local err = redis.error_reply(message)
  for x = 1, s.n do judge(s, x, err) end
end

-- Fences: one XPENDING per segment over the ids it spans, for its consumer. When the
-- rows are exactly its ids in order (the usual case) that settles it; else an entry the
-- rows do not list is checked on its own: the range saves work, it decides nothing.
local function fence(s)
  local b, n, stream = s.ids, s.n, s.stream
  local rows = redis.pcall('XPENDING', stream, group, ARGV[b], ARGV[b + n - 1], 2 * n + 16,
                           s.consumer)
  if type(rows) == 'table' and rows.err then
    fail_segment(s, rows.err)
    return
  end
  if #rows == n then
    local x = 1
    while x <= n and rows[x][1] == ARGV[b + x - 1] do x = x + 1 end
    if x > n then return end
  end
  local owned = {}
  for _, row in ipairs(rows) do owned[row[1]] = true end
  for x = 1, n do
    local id = ARGV[b + x - 1]
    if not owned[id] then
      local pending = redis.pcall('XPENDING', stream, group, id, id, 1)
      if type(pending) == 'table' and pending.err then
        judge(s, x, redis.error_reply(pending.err))
      elseif #pending == 0 or pending[1][2] ~= s.consumer then
        judge(s, x, -1)
      end
    end
  end
end

-- The server's clock in ms, read once per script.
local clock
local function now_ms()
  if clock == nil then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock
end

-- The current generation's set (rotated when it is a ttl old), and the previous one's if
-- it still exists.
local function generations()
  local index = KEYS[1]
  local now = now_ms()
  local meta = redis.call('HMGET', index, 'gen', 'start')
  local gen, start = tonumber(meta[1]), tonumber(meta[2])
  if gen == nil or start == nil then
    gen = 1
    redis.call('HSET', index, 'gen', gen, 'start', now)
    redis.call('PEXPIRE', index, 3 * ttl)
  elseif now - start >= ttl then
    redis.call('PEXPIRE', index .. ':r' .. gen, ttl)
    gen = gen + 1
    redis.call('HSET', index, 'gen', gen, 'start', now)
    redis.call('PEXPIRE', index, 3 * ttl)
  end
  local previous = index .. ':r' .. (gen - 1)
  if gen == 1 or redis.call('EXISTS', previous) == 0 then previous = nil end
  return index .. ':r' .. gen, previous
end

-- Records: an entry whose key is recorded (in either generation, or by an earlier entry
-- of this run) is a duplicate; every other entry that commits records its key.
local function record()
  local current, previous
  local added_before = {}  -- record ranges of earlier segments: {b, n, segment}
  for _, s in ipairs(segs) do
    if s.marks then
      if current == nil then current, previous = generations() end
      local b, n = s.marks, s.n
      for _, hash in ipairs({current, previous}) do
        local found = over(b, n, function(j, k)
          return redis.call('SMISMEMBER', hash, unpack(ARGV, j, k))
        end)
        for x = 1, n do
          if found[x] == 1 and verdict[s.first + x] == nil then judge(s, x, 0) end
        end
      end
      local new, nnew = {}, 0
      if troubled[s] then
        for x = 1, n do
          if verdict[s.first + x] == nil then
            nnew = nnew + 1
            new[nnew] = ARGV[b + x - 1]
          end
        end
      end
      local added = 0
      if troubled[s] then
        added = each(new, function(l, j, k) return redis.call('SADD', current, unpack(l, j, k)) end)
      else
        nnew = n
        for _, reply in ipairs(over(b, n, function(j, k)
          return redis.call('SADD', current, unpack(ARGV, j, k))
        end)) do added = added + reply end
      end
      if added < nnew then
        -- Some key appears twice in this run: its first entry commits, the others are
        -- duplicates (the set already holds each key once).
        local claimed = {}
        for _, earlier in ipairs(added_before) do
          for x = 1, earlier.n do
            if verdict[earlier.first + x] == nil then claimed[ARGV[earlier.marks + x - 1]] = true end
          end
        end
        for x = 1, n do
          if verdict[s.first + x] == nil then
            local key = ARGV[b + x - 1]
            if claimed[key] then judge(s, x, 0) else claimed[key] = true end
          end
        end
      end
      added_before[#added_before + 1] = s
    end
  end
  if current then redis.call('PEXPIRE', current, 2 * ttl, 'NX') end
end

-- Budgets (docs/reference.md): each committed entry adds its amounts (whole 1/scale of a
-- unit: HINCRBY, since HINCRBYFLOAT costs the server over twice as much) to its run's
-- hash, stopping at the most a field counts rather than failing the commit; the
-- first commit that finds a field's total at or over its soft threshold writes the run's
-- warning (once: the hash remembers it). ``warned[e]`` counts the warnings entry e wrote.
-- A total at or over the field's hard limit puts the run in the over set, scored by when
-- its hash lapses at the latest (members past that are dropped as one is added): only
-- those runs are read by the check before handlers. Raises of a limit are not looked
-- at here: the check compares with them. A step that reserves (estimate=, see
-- reserve.lua) has its entry's reservation removed here, in the transaction that adds
-- what the entry spent.
local SPENT_MAX = 9223372036854775807

local function budget_warning(b, f, run, spent)
  local args, tpl = {}, b.tpl
  for j = tpl, tpl + b.ntpl - 1, 2 do
    local name, value = ARGV[j], ARGV[j + 1]
    if name == 'data' then
      value = f.note .. string.format('%.17g', spent / b.scale) .. '}'
    elseif name == b.corr then
      value = run
    elseif name == 'idempotency_key' then
      value = 'budget:warning:' .. run .. ':' .. f.name
    elseif name == 'event_id' then
      value = value .. '-' .. run .. '-' .. f.name
    end
    args[#args + 1] = name
    args[#args + 1] = value
  end
  redis.call('XADD', b.stream, '*', unpack(args))
end

local function charge(warned)
  for _, s in ipairs(segs) do
    local b = s.budget
    if b and b.reserved ~= '' and s.marks then  -- only a step that reserves: per segment
      for x = 1, s.n do
        if verdict[s.first + x] == nil then
          redis.call('HDEL', b.reserved .. ARGV[b.runs + x - 1], ARGV[s.marks + x - 1])
        end
      end
    end
    if b then
      for x = 1, s.n do
        local e = s.first + x
        if verdict[e] == nil then
          local run = ARGV[b.runs + x - 1]
          local key, fresh = b.prefix .. run, true
          for _, f in ipairs(b.fields) do
            local amount = ARGV[f.col + x - 1]
            if amount ~= '0' then
              local spent = redis.pcall('HINCRBY', key, f.name, amount)
              if type(spent) ~= 'number' then  -- past the most it counts (or no count)
                spent = SPENT_MAX
                redis.call('HSET', key, f.name, '9223372036854775807')
              end
              if spent ~= tonumber(amount) then fresh = false end
              if f.hard and spent >= f.hard and b.over ~= '' then
                local now = now_ms()
                redis.call('ZADD', b.over, now + 2 * ttl, run)
                redis.call('ZREMRANGEBYSCORE', b.over, '-inf', now)
                redis.call('PEXPIRE', b.over, 2 * ttl)
              end
              if f.soft and spent >= f.soft
                  and redis.call('HSETNX', key, 'warned:' .. f.name, '1') == 1 then
                budget_warning(b, f, run, spent)
                warned[e] = (warned[e] or 0) + 1
              end
            end
          end
          -- A run's hash lives twice the record ttl from its first charge (when every
          -- field charged was new).
          if fresh then redis.call('PEXPIRE', key, 2 * ttl) end
        end
      end
    end
  end
end

-- Whether each run (by its info hash) has ended, read once per script; and the runs whose
-- outcome this script run kept (their index writes are made).
local ended, kept_end = {}, {}
local function withheld(info)
  local gone = ended[info]
  if gone == nil then  -- ended, and not by a dead letter (whose run:failed gives way)
    local at = redis.call('HMGET', info, 'ended', 'dead_letter')
    gone = at[1] ~= false and (at[2] == false or at[2] == '')
  end
  if not gone then kept_end[info] = true end
  ended[info] = true
  return gone
end

local function decide()
  for _, s in ipairs(segs) do
    for j = 1, s.m do
      if bad[s.outs[j]] then fail_segment(s, bad[s.outs[j]]) break end
    end
    if s.stream and not troubled[s] then fence(s) end
  end
  record()

  -- Acks (of the committed and the duplicates), then once keys and replies.
  for _, s in ipairs(segs) do
    if s.stream then
      if not troubled[s] then
        over(s.ids, s.n, function(j, k) return redis.call('XACK', s.stream, group, unpack(ARGV, j, k)) end)
      else
        local ids = {}
        for x = 1, s.n do
          local v = verdict[s.first + x]
          if v == nil or v == 0 then ids[#ids + 1] = ARGV[s.ids + x - 1] end
        end
        each(ids, function(l, j, k) return redis.call('XACK', s.stream, group, unpack(l, j, k)) end)
      end
    end
  end
  local warned = {}
  if any_budget then charge(warned) end
  if next(troubled) == nil and not any_once and next(warned) == nil then
    return total
  end
  local results = {}
  for _, s in ipairs(segs) do
    for x = 1, s.n do
      local e = s.first + x
      local v = verdict[e]
      if v == nil then
        local kept = 0
        for j = 1, s.m do
          local column, ends = s.once[j], s.ends[j]
          if (not column or redis.call('SET', ARGV[column + x - 1], '1', 'NX', 'PX', ttl))
              and not (ends and withheld(ARGV[ends + x - 1])) then
            kept = kept + 1
          else
            withdrawn[e] = withdrawn[e] or {}
            withdrawn[e][j] = true
            any_withdrawn = true
          end
        end
        results[e] = 1 + kept + (warned[e] or 0)
      else
        if s.m > 0 then
          withdrawn[e] = true
          any_withdrawn = true
        end
        results[e] = v
      end
    end
  end
  return results
end

local ok, results = pcall(decide)
if ok then  -- a run that could not be decided is indexed by the commit that decides it
  local i = indexed + 1
  while i <= #ARGV do
    local n = tonumber(ARGV[i])
    local after = i + n + 1
    if ARGV[i + 1] == '?ended' then
      local info = ARGV[i + 2]
      if not kept_end[info] then  -- the end's writes, the commands the guard counts, skipped
        for _ = 1, tonumber(ARGV[i + 3]) do after = after + tonumber(ARGV[after]) + 1 end
      end
      kept_end[info] = nil
    else
      redis.pcall(unpack(ARGV, i + 1, i + n))
    end
    i = after
  end
end
if not ok then
  -- Keep nothing of a run that could not be decided.
  for e = 1, total do withdrawn[e] = true end
  apply_withdrawals(bad)
  local err = type(results) == 'table' and results.err or tostring(results)
  return redis.error_reply(err)
end
if any_withdrawn then
  apply_withdrawals(bad)
end
return results
