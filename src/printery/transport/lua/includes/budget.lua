-- Budgets (docs/reference.md, Budgets). The plan of a segment, read by `budget_plan()`:
-- the warning stream, the over set (if the step has hard limits), the correlation
-- field, the scale (the hash counts whole 1/scale of a unit), the amount columns, the
-- warning entry's fields and per field: its name, the field that remembers its warning
-- (keys.py: warned_field), soft threshold and hard limit (scaled, '' none), the warning's
-- data up to its spent, its amount column, and its warning's idempotency key around the
-- run id (keys.py: budget_warning_key). Its columns (`budget_columns`): per entry the
-- run's budget hash, its reservations hash (a step that reserves), its run id, amounts.
local SPENT_MAX = 9223372036854775807

local function budget_plan()
  local b = {stream = key(), corr = arg(), scale = num(), na = num(), tpl = {}, fields = {}}
  if num() == 1 then b.over = key() end
  b.reserves = num() == 1
  for j = 1, num() do b.tpl[j] = arg() end
  for j = 1, num() do
    b.fields[j] = {name = arg(), warned = arg(), soft = tonumber(arg()), hard = tonumber(arg()),
                   note = arg(), column = num(), before = arg(), after = arg()}
  end
  return b
end

local function budget_columns(b, n)
  b.hashes = key_column(n)
  if b.reserves then b.reserved = key_column(n) end
  b.runs = column(n)
  for _, f in ipairs(b.fields) do f.col = argn + 1 + (f.column - 1) * n end
  column(b.na * n)
end

local function budget_warning(b, f, run, spent)
  local fields = {}
  for j = 1, #b.tpl, 2 do
    local name, value = b.tpl[j], b.tpl[j + 1]
    if name == 'data' then
      value = f.note .. string.format('%.17g', spent / b.scale) .. '}'
    elseif name == b.corr then
      value = run
    elseif name == 'idempotency_key' then
      value = f.before .. run .. f.after
    elseif name == 'event_id' then
      value = value .. '-' .. run .. '-' .. f.name
    end
    fields[j], fields[j + 1] = name, value
  end
  redis.call('XADD', b.stream, '*', unpack(fields))
end

-- Each committed entry (no verdict) of segment s adds its amounts to its run's hash
-- (HINCRBY: HINCRBYFLOAT costs the server over twice as much), stopping at the most a
-- field counts rather than failing the commit; the first commit that finds a field at or
-- over its soft threshold writes the run's warning (once: the hash remembers it); a total
-- at or over a hard limit puts the run in the over set, scored by when its hash lapses at
-- the latest. A step that reserves has its entry's reservation removed here, in the
-- transaction that adds what the entry spent. `warned[e]` counts the warnings of entry e.
local function charge(s, ttl, warned)
  local b = s.budget
  for x = 1, s.n do
    local e = s.first + x
    if verdict[e] == nil then
      if b.reserved and s.marks then
        redis.call('HDEL', KEYS[b.reserved + x - 1], ARGV[s.marks + x - 1])
      end
      local run, hash, fresh = ARGV[b.runs + x - 1], KEYS[b.hashes + x - 1], true
      for _, f in ipairs(b.fields) do
        local amount = ARGV[f.col + x - 1]
        if amount ~= '0' then
          local spent = redis.pcall('HINCRBY', hash, f.name, amount)
          if type(spent) ~= 'number' then  -- past the most it counts (or no count)
            spent = SPENT_MAX
            redis.call('HSET', hash, f.name, '9223372036854775807')
          end
          if spent ~= tonumber(amount) then fresh = false end
          if f.hard and spent >= f.hard and b.over then
            redis.call('ZADD', b.over, now_ms() + 2 * ttl, run)
            redis.call('ZREMRANGEBYSCORE', b.over, '-inf', now_ms())
            redis.call('PEXPIRE', b.over, 2 * ttl)
          end
          if f.soft and spent >= f.soft and redis.call('HSETNX', hash, f.warned, '1') == 1 then
            budget_warning(b, f, run, spent)
            warned[e] = (warned[e] or 0) + 1
          end
        end
      end
      -- A run's hash lives twice the record ttl from its first charge.
      if fresh then redis.call('PEXPIRE', hash, 2 * ttl) end
    end
  end
end
