-- Dead-letter one entry (reference: failures), atomically: its dlq entry, the outcome that
-- ends its run (`run:failed`, whose data names the dlq entry's id: known only once the
-- XADD made it, hence a script), the ack, and the run index's writes; or nothing when
-- the entry is no longer held (acked meanwhile, or held by another consumer).
--
-- KEYS[1] the source stream, KEYS[2] the dlq stream; with a run: KEYS[3] the run:failed
--         stream, KEYS[4] the run's info hash of the run index
-- ARGV[1] group, ARGV[2] consumer ('' = whoever holds it: an operator), ARGV[3] entry id,
-- ARGV[4] nd: arguments of the dlq entry's fields (name, value, ...), ARGV[5] nf: the
-- run:failed entry's (0: no run), ARGV[6] its data before the dlq id, ARGV[7] after it,
-- ARGV[8] nx: arguments of the index writes, ARGV[9] the key of the entry's last-error
-- record ('' none), ARGV[10] a once key that makes this dead letter written at most once
-- ('' none; a join's, whose failure no entry holds), ARGV[11] its ttl in ms, ARGV[12] '1'
-- when the KEYS[3] entry ends the run, '0' when it is a plain entry (a skipped Map item's
-- result for its collector: written whatever the run's status, no index writes), ARGV[13]
-- the run's reservations hash and ARGV[14] the entry's reservation in it ('' none: a step's
-- estimate= reserved for the entry is given back with its dead letter); then the
-- dlq fields, the run:failed fields (its `data` value is replaced) and the index writes
-- (per command its argument count, then the command).
-- An entry id '' dead-letters what no entry holds (a join decided by a sweep): no fence,
-- no ack; KEYS[1] is then any key of the partition.
-- Returns the dlq entry's id, or -1 when the entry is not held as the arguments say (or
-- the once key was taken).
--
-- A run already ended by an outcome (its index has a status, not set by a dead letter:
-- the info's `dead_letter` field) gets no run:failed: an entry written after the outcome
-- (a notification) ends nothing. A run a dead letter ended may end again (its replay).

local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
local nd, nf, nx = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[8])
if id ~= '' then
  local pending = redis.call('XPENDING', KEYS[1], group, id, id, 1)
  if #pending == 0 or (consumer ~= '' and pending[1][2] ~= consumer) then
    return -1
  end
end
if ARGV[10] ~= '' and not redis.call('SET', ARGV[10], '1', 'NX', 'PX', ARGV[11]) then
  return -1
end
local a = 15
local letter = {}
for j = a, a + nd - 1 do letter[#letter + 1] = ARGV[j] end
a = a + nd
local dlq_id = redis.call('XADD', KEYS[2], '*', unpack(letter))
local function outcome()
  local fields = {}
  for j = a, a + nf - 1, 2 do
    fields[#fields + 1] = ARGV[j]
    if ARGV[j] == 'data' then
      fields[#fields + 1] = ARGV[6] .. dlq_id .. ARGV[7]
    else
      fields[#fields + 1] = ARGV[j + 1]
    end
  end
  redis.call('XADD', KEYS[3], '*', unpack(fields))
end
if nf > 0 and ARGV[12] == '0' then
  outcome()
elseif nf > 0 then
  local ended = redis.call('HMGET', KEYS[4], 'status', 'dead_letter')
  if not ended[1] or (ended[2] and ended[2] ~= '') then
    outcome()
    local i = a + nf
    while i < a + nf + nx do
      local n = tonumber(ARGV[i])
      redis.pcall(unpack(ARGV, i + 1, i + n))
      i = i + n + 1
    end
    redis.call('HSET', KEYS[4], 'dead_letter', dlq_id)
  end
end
if id ~= '' then redis.call('XACK', KEYS[1], group, id) end
if ARGV[9] ~= '' then redis.call('DEL', ARGV[9]) end
if ARGV[14] ~= '' then redis.call('HDEL', ARGV[13], ARGV[14]) end
return dlq_id
