-- The ownership fence: an entry is acked, committed, dead-lettered, renewed or handed
-- back only by the consumer that holds it. `held(stream, group, id, consumer)`: the
-- entry's pending row ({id, consumer, idle ms, deliveries}) when `consumer` holds it
-- (consumer '' = whoever does: an operator's), else nil. An error (no such group) is
-- raised: a caller that must survive it calls it through pcall.
local function held(stream, group, id, consumer)
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  local row = pending[1]
  if row == nil or (consumer ~= '' and row[2] ~= consumer) then return nil end
  return row
end

-- The fence of n entries of one consumer at once (a commit's segment, ids ARGV[b ..]):
-- one XPENDING over the range they span. When its rows are exactly those ids in order
-- (the usual case) that settles it; else each entry the rows miss is checked with
-- `held`: the range saves work, it decides nothing. `lost(x, verdict)` is told each
-- entry that is not held (-1) or cannot be checked (an error reply).
local function fence_range(stream, group, consumer, b, n, lost)
  local rows = redis.pcall('XPENDING', stream, group, ARGV[b], ARGV[b + n - 1], 2 * n + 16,
                           consumer)
  if rows.err then
    for x = 1, n do lost(x, redis.error_reply(rows.err)) end
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
    if not owned[ARGV[b + x - 1]] then
      local ok, row = pcall(held, stream, group, ARGV[b + x - 1], consumer)
      if not ok then
        lost(x, redis.error_reply(type(row) == 'table' and row.err or tostring(row)))
      elseif row == nil then
        lost(x, -1)
      end
    end
  end
end
