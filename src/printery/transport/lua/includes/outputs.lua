-- A commit's outputs were appended by the XADDs before the script, in entry order (an
-- entry's in output order), so the k-th output to a stream is the k-th of that stream's
-- last entries: what is withdrawn is found by one XREVRANGE per stream and XDELed.

-- Output keys that are not streams (their XADDs failed): key -> the error message.
local function bad_outputs(outkeys)
  local bad = {}
  for k in pairs(outkeys) do
    local kind = redis.call('TYPE', k)
    kind = type(kind) == 'table' and kind.ok or kind
    if kind ~= 'stream' then
      bad[k] = 'WRONGTYPE output stream ' .. k .. ' holds a ' .. tostring(kind)
    end
  end
  return bad
end

-- `copies[e]`: {the withheld stream (a key), why} that gets a copy of the figures of
-- entry e's first output, which is withdrawn although the entry committed (and charged
-- its cost): an outcome of a run that had ended, or any output of a run that stopped
-- (cost.py counts the copy as the call).
local copies = {}

local function copy_figures(to, fields)
  local copy = {}
  for j = 1, #fields, 2 do
    copy[j], copy[j + 1] = fields[j], fields[j] == 'data' and '{}' or fields[j + 1]
  end
  copy[#copy + 1], copy[#copy + 2] = 'withheld', to[2]
  redis.call('XADD', to[1], '*', unpack(copy))
end

-- Whether `run` is among the stopped runs `key` (cancelled, or failed with on_failure
-- cancel): one ZCARD per key and script run, a ZSCORE per entry only when any is.
local stop_counts = {}
local function is_stopped(key, run)
  local n = stop_counts[key]
  if n == nil then
    n = redis.call('ZCARD', key)
    stop_counts[key] = n
  end
  return n > 0 and run ~= '' and redis.call('ZSCORE', key, run) ~= false
end

local function apply_withdrawals(segs, bad)
  local count, doomed, copied = {}, {}, {}
  for _, s in ipairs(segs) do
    for x = 1, s.n do
      local e = s.first + x
      local w = withdrawn[e]
      for j = 1, s.m do
        local k = s.outs[j]
        local p = (count[k] or 0) + 1
        count[k] = p
        if w == true or (w and w[j]) then
          doomed[k] = doomed[k] or {}
          doomed[k][#doomed[k] + 1] = p
          if j == 1 and copies[e] then
            copied[k] = copied[k] or {}
            copied[k][p] = copies[e]
          end
        end
      end
    end
  end
  for k, positions in pairs(doomed) do
    if not bad[k] then
      local t = count[k]
      local rows = redis.call('XREVRANGE', k, '+', '-', 'COUNT', t)
      local ids = {}
      for j, p in ipairs(positions) do
        local row = rows[t - p + 1]
        ids[j] = row[1]
        local to = copied[k] and copied[k][p]
        if to then copy_figures(to, row[2]) end
      end
      each(ids, function(l, j, k2) return redis.call('XDEL', k, unpack(l, j, k2)) end)
    end
  end
end

-- A run gets one outcome. `ended[info]`: whether a run (by its info hash) has ended, read
-- once per script; `kept_end[info]`: this script kept an outcome of it (its run index
-- writes are made). A run ended by a dead letter (`dead_letter` set) gives way to a
-- later outcome (its replay's).
local ended, kept_end = {}, {}
local function run_ended(info)
  local at = redis.call('HMGET', info, 'ended', 'dead_letter')
  return at[1] ~= false and (at[2] == false or at[2] == '')
end
local function withheld(info)
  local gone = ended[info]
  if gone == nil then gone = run_ended(info) end
  if not gone then kept_end[info] = true end
  ended[info] = true
  return gone
end
