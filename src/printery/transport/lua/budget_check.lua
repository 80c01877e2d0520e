-- Which of some runs are at or over a hard limit of their budget, raises included
-- (docs/reference.md, Budgets). Sent only for the runs of a read batch found in the set
-- of runs that reached a hard limit (runtime/budget_guard.py): the server compares, so
-- the reply carries only the runs that are over.
-- KEYS: each such entry's run budget hash, in batch order (repeats are read once)
-- ARGV: n, then n limits x (hash field, the field of its raises (keys.py: raise_field),
--       limit as the hash counts: 1/scale of a unit, see transport/commit.py)
-- Returns the keys over a limit only (the usual reply is empty, so the client does nothing
-- per entry): per such key {k, i, spent, raised}: its position k (from 1) and its first
-- limit i (from 1) with spent >= limit + raised (spent and raised as stored). A value
-- that is not a number, or a key that is not a hash, counts as nothing spent.
local n = tonumber(ARGV[1])
local fields, limits = {}, {}
for j = 1, n do
  fields[2 * j - 1] = ARGV[3 * j - 1]
  fields[2 * j] = ARGV[3 * j]
  limits[j] = tonumber(ARGV[3 * j + 1])
end
local seen, out = {}, {}
for k, key in ipairs(KEYS) do
  local verdict = seen[key]
  if verdict == nil then
    verdict = false
    local values = redis.pcall('HMGET', key, unpack(fields))
    if type(values) == 'table' and values.err == nil then
      for j = 1, n do
        local spent = tonumber(values[2 * j - 1]) or 0
        local raised = tonumber(values[2 * j]) or 0
        if spent >= limits[j] + raised then
          verdict = {j, values[2 * j - 1] or '0', values[2 * j] or '0'}
          break
        end
      end
    end
    seen[key] = verdict
  end
  if verdict then
    out[#out + 1] = {k, verdict[1], verdict[2], verdict[3]}
  end
end
return out
