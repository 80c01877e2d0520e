-- Trim a stream below what every group has acknowledged (and, given, an age or a cutoff).
-- KEYS[1] stream; ARGV: retention ms ('' = no age limit), explicit cutoff ms ('' = none),
-- '1' to trim a stream no group reads, '1' for approximate trimming.
-- Returns {entries trimmed, the MINID used ('' when nothing was trimmed)}.
--@include clock
local stream = KEYS[1]
local retention, keep_after = ARGV[1], ARGV[2]
local without_groups, approximate = ARGV[3] == '1', ARGV[4] == '1'
if redis.call('EXISTS', stream) == 0 then return {0, ''} end

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end

local bound = nil
local function lower(id)
  if bound == nil or less(id, bound) then bound = id end
end
if retention ~= '' then
  lower(string.format('%d-0', now_ms() - tonumber(retention)))
end
if keep_after ~= '' then lower(keep_after .. '-0') end

local groups = redis.call('XINFO', 'GROUPS', stream)
if #groups == 0 and not without_groups then return {0, ''} end
for _, group in ipairs(groups) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  -- Never above what the group has read: later entries were delivered to no one yet.
  -- The last-delivered entry itself may go (read and, unless pending, acknowledged).
  local last_ms, last_seq = parse(info['last-delivered-id'])
  lower(string.format('%d-%d', last_ms, last_seq + 1))
  local pending = redis.call('XPENDING', stream, info['name'])
  if tonumber(pending[1]) > 0 then lower(pending[2]) end
end
if bound == nil then return {0, ''} end
local trimmed
if approximate then
  trimmed = redis.call('XTRIM', stream, 'MINID', '~', bound)
else
  trimmed = redis.call('XTRIM', stream, 'MINID', bound)
end
return {trimmed, bound}
