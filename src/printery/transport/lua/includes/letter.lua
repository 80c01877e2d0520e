-- A dead letter (reference: failures) is one kind of commit: a segment of one entry,
-- `letter_args(s)` reads it: the entry id ('' = what no entry holds: a join a sweep
-- decided; no fence, no ack) and its holder ('' = whoever holds it: an operator's), the
-- dlq stream, the entry's source stream (with an id), the dlq entry's fields, then the
-- run:failed's: count (0: the entry names no run), its stream and the run's info hash,
-- '1' if it ends the run ('0': a plain entry, a skipped Map item's result for its
-- collector), its data around the dlq id, its fields; then flags, each followed by its
-- key: the entry's last-error record, a once key (and its ttl ms) that makes the letter
-- written at most once, and the run's reservations hash (and the entry's field in it).
local function letter_args(s)
  local l = {id = arg(), consumer = arg(), dlq = key(), fields = {}, outcome_fields = {}}
  if l.id ~= '' then l.source = key() end
  for j = 1, num() do l.fields[j] = arg() end
  local nf = num()
  if nf > 0 then
    l.outcome, l.info, l.ends = key(), key(), arg() == '1'
    l.before, l.after = arg(), arg()
    for j = 1, nf do l.outcome_fields[j] = arg() end
  end
  if num() == 1 then l.last_error = key() end
  if num() == 1 then l.once, l.once_ttl = key(), arg() end
  if num() == 1 then l.reserved, l.reservation = key(), arg() end
  s.letter = l
  return s
end

-- Write it: its dlq entry and, unless its run has ended (but by a dead letter), the
-- run:failed that names the dlq entry (hence here: its id exists only once XADD made
-- it); the ack, its last error and reservation removed. Its result: the dlq entry's id,
-- or -1 when the entry is not held as it says (or the once key was taken).
local function write_letter(l, group)
  if l.source and held(l.source, group, l.id, l.consumer) == nil then return -1 end
  if l.once and not redis.call('SET', l.once, '1', 'NX', 'PX', l.once_ttl) then return -1 end
  local id = redis.call('XADD', l.dlq, '*', unpack(l.fields))
  if l.outcome then
    local fields = {}
    for j = 1, #l.outcome_fields, 2 do
      local name = l.outcome_fields[j]
      fields[j] = name
      fields[j + 1] = name == 'data' and (l.before .. id .. l.after) or l.outcome_fields[j + 1]
    end
    if not l.ends then
      redis.call('XADD', l.outcome, '*', unpack(fields))
    else
      local gone = ended[l.info]
      if gone == nil then gone = run_ended(l.info) end
      if not gone then
        redis.call('XADD', l.outcome, '*', unpack(fields))
        redis.call('HSET', l.info, 'dead_letter', id)
        kept_end[l.info] = true
      end
    end
  end
  if l.source then redis.call('XACK', l.source, group, l.id) end
  if l.last_error then redis.call('DEL', l.last_error) end
  if l.reserved then redis.call('HDEL', l.reserved, l.reservation) end
  return id
end
