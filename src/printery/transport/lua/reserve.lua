-- Reserve what entries are expected to spend against their runs' budgets (reference:
-- budgets), before their handlers run, in one atomic step: an entry is let through only
-- while, for every limited field its estimate names, spent + reserved + its estimate
-- <= limit + raises. So concurrent siblings (a Map's items, parallel branches) cannot
-- together pass a hard limit by more than their estimates were wrong: the check and the
-- charge that used to be a round trip apart are one decision here, and the commit that
-- adds what the entry spent removes its reservation in the same transaction
-- (commit.lua).
--
-- Each run has a reservations hash beside its budget hash: field = an entry's
-- reservation key (its idempotency key: a redelivery or a claim of the same entry finds
-- its own reservation and renews it, never reserves twice), value = "<expires ms>
-- <field> <amount> ..." (the budget hash's field names and amounts as it counts them;
-- a field name holds no space). A reservation past its expiry (its handler died and
-- nobody committed it) counts for nothing and is removed by the next call that reads
-- the hash.
--
-- KEYS: per entry, its run's budget hash then its run's reservations hash (pairs, in
--       entry order; repeats are read once)
-- ARGV[1] how long a reservation lives, ms; ARGV[2] nf: the limited fields, then nf x
--         (field name, the field of its raises (keys.py: raise_field), hard limit as the
--         hash counts it: 1/scale of a unit); then per
--         entry: its reservation key and nf amounts ('0': none for that field)
-- Returns the entries refused: per such entry {k, j, spent, raised, reserved} (its
-- position from 1, the first field j it would pass, and that field's counts as
-- stored); the usual reply is empty.
--@include clock
local now = now_ms()
local lease = tonumber(ARGV[1])
local nf = tonumber(ARGV[2])
local names, raises, limits = {}, {}, {}
for j = 1, nf do
  names[j], raises[j] = ARGV[3 * j], ARGV[3 * j + 1]
  limits[j] = tonumber(ARGV[3 * j + 2])
end
local a = 3 + 3 * nf

-- Per reservations hash: live reservations by key (expiry, then field and amount
-- pairs), and their sums per field name.
local runs = {}
local function load(budget, held)
  local r = runs[held]
  if r then return r end
  r = {keys = {}, sums = {}, spent = {}, raised = {}}
  local all = redis.call('HGETALL', held)
  local lapsed = {}
  for i = 1, #all, 2 do
    local parts = {}
    for word in string.gmatch(all[i + 1], '%S+') do parts[#parts + 1] = word end
    if (tonumber(parts[1]) or 0) <= now then
      lapsed[#lapsed + 1] = all[i]
    else
      r.keys[all[i]] = true
      for p = 2, #parts - 1, 2 do
        r.sums[parts[p]] = (r.sums[parts[p]] or 0) + (tonumber(parts[p + 1]) or 0)
      end
    end
  end
  if #lapsed > 0 then redis.call('HDEL', held, unpack(lapsed)) end
  local fields = {}
  for j = 1, nf do
    fields[2 * j - 1] = names[j]
    fields[2 * j] = raises[j]
  end
  local values = redis.pcall('HMGET', budget, unpack(fields))
  if type(values) ~= 'table' or values.err then values = {} end
  for j = 1, nf do
    r.spent[j] = tonumber(values[2 * j - 1]) or 0
    r.raised[j] = tonumber(values[2 * j]) or 0
  end
  runs[held] = r
  return r
end

local refused = {}
for k = 1, #KEYS / 2 do
  local budget, held = KEYS[2 * k - 1], KEYS[2 * k]
  local key = ARGV[a]
  local amounts = {}
  for j = 1, nf do amounts[j] = tonumber(ARGV[a + j]) or 0 end
  a = a + 1 + nf
  local r = load(budget, held)
  local over = nil
  if not r.keys[key] then  -- a redelivery holds its reservation already
    for j = 1, nf do
      if amounts[j] > 0 and limits[j]
          and r.spent[j] + (r.sums[names[j]] or 0) + amounts[j] > limits[j] + r.raised[j] then
        over = j
        break
      end
    end
  end
  if over then
    refused[#refused + 1] = {k, over, string.format('%.0f', r.spent[over]),
                             string.format('%.0f', r.raised[over]),
                             string.format('%.0f', r.sums[names[over]] or 0)}
  else
    local value = {string.format('%.0f', now + lease)}
    for j = 1, nf do
      if amounts[j] > 0 then
        value[#value + 1] = names[j]
        value[#value + 1] = string.format('%.0f', amounts[j])
        if not r.keys[key] then r.sums[names[j]] = (r.sums[names[j]] or 0) + amounts[j] end
      end
    end
    r.keys[key] = true
    redis.call('HSET', held, key, table.concat(value, ' '))
    redis.call('PEXPIRE', held, lease + 1000)
  end
end
return refused
