-- A commit's arguments (transport/commit.py writes them; docs/engine.md, The Lua
-- library): group, record ttl ms, '1' + the records' index hash and ring (keys) when an
-- entry carries a record (else '0'), the segment count, then each segment, then the
-- count of the run index's writes and each. A segment is a letter (one dead letter) or
-- consecutive entries that share a source stream, a consumer, whether they carry a
-- record, their output streams and budget plan: its header (kind 'entries',
-- count n, '1' + source stream key + consumer if it has one, '1' if it carries records,
-- outputs m, budget fields nb; per output its stream (key) and flags: 1 once key, + 2 an
-- outcome of its run; when an output is an outcome, the run's withheld stream, a key;
-- '1' + the partition's stopped runs and withheld stream (keys) when its entries are
-- checked for a stop, else '0'), its budget plan, then its columns, n each: entry ids,
-- records, the runs checked for a stop ('' none),
-- per output its once keys and run info hashes (keys), the budget's columns.
local group, ttl = arg(), num()
local records = num() == 1 and {index = key(), ring = {key(), key(), key()}} or nil
local segs, total, outkeys = {}, 0, {}
local any_once, letters = false, {}

local function entries_args(s)
  s.n = num()
  if num() == 1 then s.stream, s.consumer = key(), arg() end
  local marked = num() == 1
  s.m = num()
  local nb = num()
  s.outs, s.once, s.ends = {}, {}, {}
  for j = 1, s.m do
    s.outs[j] = key()
    outkeys[s.outs[j]] = true
    local flags = num()
    s.once[j], s.ends[j] = flags % 2 == 1, flags >= 2
    if s.ends[j] then s.has_ends = true end
  end
  if s.has_ends then s.withheld = key() end
  if num() == 1 then s.stopped, s.stop_copies = key(), key() end
  if nb > 0 then s.budget = budget_plan() end
  if s.stream then s.ids = column(s.n) end
  if marked then s.marks = column(s.n) end
  if s.stopped then s.runs = column(s.n) end
  for j = 1, s.m do
    if s.once[j] then s.once[j] = key_column(s.n) any_once = true end
    if s.ends[j] then s.ends[j] = key_column(s.n) any_once = true end
  end
  if s.budget then budget_columns(s.budget, s.n) end
  return s
end

for j = 1, num() do
  local s = {first = total, kind = arg()}
  if s.kind == 'letter' then
    s.n, s.m, s.outs = 1, 0, {}
    letter_args(s)
    letters[#letters + 1] = s
  else
    entries_args(s)
  end
  segs[j] = s
  total = total + s.n
end
local indexes = {}
for j = 1, num() do indexes[j] = run_index_args() end
