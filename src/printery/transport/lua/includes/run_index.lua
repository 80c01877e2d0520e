-- The run index's writes (runtime/run_index.py), by name: no command comes from ARGV.
-- `run_index_args()` reads: the time (ms), counts of started runs, cost units, ended
-- runs and started runs' info hashes; every run's set and the running ones (if a run starts or ends); the started
-- runs and each one's info hash (a key); the cost minute
-- hash, its ttl in s ('0': not set again now) and unit, amount pairs; the statuses set;
-- per ended run its info hash and status set (keys), its id, status, and '1' when its
-- outcome is no dead letter's (its info's `dead_letter` is cleared).
local function run_index_args()
  local ix = {at = num(), started = {}, costs = {}, ended = {}}
  local ns, nc, ne, ni = num(), num(), num(), num()
  if ns + ne > 0 then ix.every, ix.running = key(), key() end
  for j = 1, ns do ix.started[j] = arg() end
  ix.started_info = {}
  for j = 1, ni do ix.started_info[j] = key() end
  if nc > 0 then ix.minute, ix.ttl = key(), arg() end
  for j = 1, 2 * nc do ix.costs[j] = arg() end
  if ne > 0 then ix.statuses = key() end
  for j = 1, ne do
    ix.ended[j] = {info = key(), set = key(), run = arg(), status = arg(), clears = arg() == '1'}
  end
  return ix
end

-- Write them: a start goes into every run's set and the running ones (NX: a run keeps
-- its start), an end, only when this script kept that run's outcome (`kept[info]`,
-- once: the first outcome stays the run's status), out of the running ones and into its
-- status's. Idempotent (a duplicate's were made by the commit it duplicates). An error
-- (a key of another type) fails no commit: each is returned, in order.
local function write_run_index(ix, kept)
  local errors = {}
  local function try(reply)  -- each write by its name: try(redis.pcall('NAME', ...))
    if type(reply) == 'table' and reply.err then errors[#errors + 1] = reply.err end
  end
  for j = 1, #ix.costs, 2 do try(redis.pcall('HINCRBYFLOAT', ix.minute, ix.costs[j], ix.costs[j + 1])) end
  if ix.minute and ix.ttl ~= '0' then try(redis.pcall('EXPIRE', ix.minute, ix.ttl)) end
  if #ix.started > 0 then
    local members = {}
    for j, run in ipairs(ix.started) do members[2 * j - 1], members[2 * j] = ix.at, run end
    try(redis.pcall('ZADD', ix.every, 'NX', unpack(members)))
    local live = {}  -- a run cancelled before its first entry was handled stays ended
    for j, run in ipairs(ix.started) do
      local info = ix.started_info[j]
      if not info or redis.call('HMGET', info, 'ended')[1] == false then
        live[#live + 1], live[#live + 2] = ix.at, run
      end
    end
    if #live > 0 then try(redis.pcall('ZADD', ix.running, 'NX', unpack(live))) end
  end
  for _, e in ipairs(ix.ended) do
    if kept[e.info] then
      kept[e.info] = nil
      try(redis.pcall('ZADD', ix.every, 'NX', ix.at, e.run))
      try(redis.pcall('ZREM', ix.running, e.run))
      try(redis.pcall('ZADD', e.set, ix.at, e.run))
      try(redis.pcall('SADD', ix.statuses, e.status))
      if e.clears then
        try(redis.pcall('HSET', e.info, 'status', e.status, 'ended', ix.at, 'dead_letter', ''))
      else
        try(redis.pcall('HSET', e.info, 'status', e.status, 'ended', ix.at))
      end
    end
  end
  return errors
end
