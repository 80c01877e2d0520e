-- Idempotency records: one set per generation, not a key with a TTL each. A generation
-- is current for ttl (it rotates at the first commit after that), then previous (still
-- checked), then expires ttl after the rotation; so a record is kept at least ttl and at
-- most about twice that. The sets are a ring of three declared keys (keys.py:
-- record_sets): generation g is ring[g % 3 + 1], the one it replaces expired a ttl ago.
-- `generations(index, ring, ttl)`: the current set, and the previous one if it exists.
local function generations(index, ring, ttl)
  local now = now_ms()
  local meta = redis.call('HMGET', index, 'gen', 'start')
  local gen, start = tonumber(meta[1]), tonumber(meta[2])
  if gen == nil or start == nil or now - start >= ttl then
    if gen == nil or start == nil then
      gen = 1
    else
      redis.call('PEXPIRE', ring[gen % 3 + 1], ttl)
      gen = gen + 1
    end
    redis.call('DEL', ring[gen % 3 + 1])
    redis.call('HSET', index, 'gen', gen, 'start', now)
    redis.call('PEXPIRE', index, 3 * ttl)
  end
  local previous = ring[(gen - 1) % 3 + 1]
  if gen == 1 or redis.call('EXISTS', previous) == 0 then previous = nil end
  return ring[gen % 3 + 1], previous
end

-- `record(segs, records, ttl)`: an entry whose key is recorded (in either generation,
-- or by an earlier entry of this run) is a duplicate (verdict 0); every other entry
-- that commits records its key.
local function record(segs, records, ttl)
  local current, previous
  local before = {}  -- the segments with records decided so far
  for _, s in ipairs(segs) do
    if s.marks then
      if current == nil then current, previous = generations(records.index, records.ring, ttl) end
      local b, n = s.marks, s.n
      for _, set in ipairs({current, previous}) do
        local found = over(b, n, function(j, k) return redis.call('SMISMEMBER', set, unpack(ARGV, j, k)) end)
        for x = 1, n do
          if found[x] == 1 and verdict[s.first + x] == nil then judge(s, x, 0) end
        end
      end
      local added, nnew = 0, n
      if troubled[s] then  -- only the entries without a verdict
        local new = {}
        for x = 1, n do
          if verdict[s.first + x] == nil then new[#new + 1] = ARGV[b + x - 1] end
        end
        nnew = #new
        added = each(new, function(l, j, k) return redis.call('SADD', current, unpack(l, j, k)) end)
      else  -- the usual case: the column, whole
        for _, r in ipairs(over(b, n, function(j, k) return redis.call('SADD', current, unpack(ARGV, j, k)) end)) do
          added = added + r
        end
      end
      if added < nnew then
        -- A key appears twice in this run: its first entry commits, the others are
        -- duplicates (the set holds each key once).
        local claimed = {}
        for _, earlier in ipairs(before) do
          for x = 1, earlier.n do
            if verdict[earlier.first + x] == nil then claimed[ARGV[earlier.marks + x - 1]] = true end
          end
        end
        for x = 1, n do
          if verdict[s.first + x] == nil then
            local k = ARGV[b + x - 1]
            if claimed[k] then judge(s, x, 0) else claimed[k] = true end
          end
        end
      end
      before[#before + 1] = s
    end
  end
  if current then redis.call('PEXPIRE', current, 2 * ttl, 'NX') end
end
