-- Create the consumer groups of a pipeline on the streams of one partition, each where it
-- must start (docs/reference.md, Streams and entries: where a group starts), in one step:
-- two processes starting at once both see the same first start. ARGV[1] 'start' (a
-- service's start: renames applied) or 'recover' (a worker whose group is missing: one
-- the record knows, or any without a record, comes back at 0 as its stream was deleted;
-- one the record does not know, renamed away since, at the end, never at 0).
-- KEYS[1] the partition's record of known groups (a hash: "<event type>\t<group>" -> where
-- the group's history begins: 'start' (id 0), 'end <id>' (after <id>), 'exists' (a group
-- of the time before the record)); KEYS[2..] streams. ARGV[2..]: for each group, 5 values: the index of its
-- stream in KEYS, the group, the group it was renamed from ('' none), the group's record
-- field, the old group's record field.
-- Returns, per group: {how, id, moved}: how is 'exists', 'start' (created at 0: the
-- pipeline's first start), 'end'
-- (created at the end of its stream: id) or 'renamed' (created at the old group's
-- last-delivered id, its pending entries moved: moved).
local record = KEYS[1]
local recovering = ARGV[1] == 'recover'

local function group_info(stream, group)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups['err'] then return nil end
  for _, flat in ipairs(groups) do
    local info = {}
    for i = 1, #flat, 2 do info[flat[i]] = flat[i + 1] end
    if info['name'] == group then return info end
  end
  return nil
end

-- Whether the pipeline has run in this partition before: its record, or (a server of the
-- time before the record) one of its own groups (or a group it was renamed from) on its
-- stream. Another reader's group on the same streams says nothing of this pipeline.
local ran = redis.call('EXISTS', record) == 1
if not ran then
  for n = 2, #ARGV, 5 do
    local stream = KEYS[tonumber(ARGV[n])]
    if group_info(stream, ARGV[n + 1]) or (ARGV[n + 2] ~= '' and group_info(stream, ARGV[n + 2])) then
      ran = true
      break
    end
  end
end

-- Hand the pending entries of `old` to `new`: same consumer, idle time and delivery count
-- (XCLAIM ... FORCE makes a pending entry of a group that never had it); an entry trimmed
-- since is left out, as any read leaves it out.
local function move_pending(stream, old, new)
  local moved, start = 0, '-'
  while true do
    local rows = redis.call('XPENDING', stream, old, start, '+', 100)
    if #rows == 0 then break end
    for _, row in ipairs(rows) do
      local claimed = redis.call('XCLAIM', stream, new, row[2], 0, row[1], 'IDLE', row[3],
                                 'RETRYCOUNT', row[4], 'FORCE', 'JUSTID')
      moved = moved + #claimed
      start = '(' .. row[1]
    end
  end
  return moved
end

local placed = {}
for n = 2, #ARGV, 5 do
  local stream, group, old = KEYS[tonumber(ARGV[n])], ARGV[n + 1], ARGV[n + 2]
  local field, old_field = ARGV[n + 3], ARGV[n + 4]
  local previous = old ~= '' and group_info(stream, old) or nil
  if group_info(stream, group) then
    if not recovering then redis.call('HSETNX', record, field, 'exists') end
    table.insert(placed, {'exists', '', 0})
  elseif recovering and (redis.call('EXISTS', record) == 0
                         or redis.call('HEXISTS', record, field) == 1) then
    redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
    table.insert(placed, {'start', '0-0', 0})
  elseif previous and not recovering then
    local last = previous['last-delivered-id']
    local read = previous['entries-read']
    if type(read) == 'number' then
      redis.call('XGROUP', 'CREATE', stream, group, last, 'ENTRIESREAD', read)
    else
      redis.call('XGROUP', 'CREATE', stream, group, last)
    end
    local moved = move_pending(stream, old, group)
    redis.call('XGROUP', 'DESTROY', stream, old)
    -- the new group's history starts where the old one's did
    local began = redis.call('HGET', record, old_field) or 'exists'
    redis.call('HDEL', record, old_field)
    redis.call('HSET', record, field, began)
    table.insert(placed, {'renamed', last, moved})
  elseif not ran and not recovering then
    redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
    redis.call('HSET', record, field, 'start')
    table.insert(placed, {'start', '0-0', 0})
  else
    redis.call('XGROUP', 'CREATE', stream, group, '$', 'MKSTREAM')
    local last = group_info(stream, group)['last-delivered-id']
    redis.call('HSET', record, field, 'end ' .. last)
    table.insert(placed, {'end', last, 0})
  end
end
return placed
