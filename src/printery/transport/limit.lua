-- Flow control (CONTRACT §13): renew, release and admit in one atomic step, for every
-- process sharing the server. The only clock is the server's TIME.
--
-- Each limit key ("base", b = 1..) has four keys, KEYS[(b-1)*4 + 1..4]:
--   slots  sorted set holder -> expiry ms (concurrency; renewed with the entry's lease,
--          so a dead process's slot lapses within the visibility timeout)
--   starts sorted set holder -> start ms (requests in the window)
--   tokens sorted set "holder:amount" -> ms the handler reported them
--   total  the sum of the amounts in tokens
-- ARGV: window ms, lease ms,
--   renewals: n, then n x (b, holder)
--   releases: n, then n x (b, holder, held a slot 0|1, tokens)
--   admissions: n, then n x (holder, asked before 0|1, limits m,
--     then m x (b, concurrency, rpm, tpm)), 0 meaning "no such limit"
-- Each key is read and written once per call, however many holders it serves: the
-- counts are kept here and the members added or removed in one command per key.
-- Returns one number per admission, in order: 0 admitted; else how many ms until the
-- window can admit it (-1: when a slot is given back, unknown here).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local i = 3

local function key(b, n) return KEYS[(tonumber(b) - 1) * 4 + n] end

-- Per base: what is in the window now, and the members to add or remove at the end.
local state = {}
local function load(b)
  local s = state[b]
  if s then return s end
  redis.call('ZREMRANGEBYSCORE', key(b, 1), '-inf', now)
  redis.call('ZREMRANGEBYSCORE', key(b, 2), '-inf', now - window)
  local old = redis.call('ZRANGEBYSCORE', key(b, 3), '-inf', now - window)
  local total = tonumber(redis.call('GET', key(b, 4)) or '0')
  if #old > 0 then
    for _, member in ipairs(old) do
      total = total - tonumber(string.match(member, ':([^:]*)$'))
    end
    redis.call('ZREMRANGEBYSCORE', key(b, 3), '-inf', now - window)
    if redis.call('ZCARD', key(b, 3)) == 0 then total = 0 end
    redis.call('SET', key(b, 4), total, 'PX', window + 1000)
  end
  s = {slots = redis.call('ZCARD', key(b, 1)), starts = redis.call('ZCARD', key(b, 2)),
       total = total, add_slots = {}, add_starts = {}, freed = {}}
  state[b] = s
  return s
end

local function chunked(command, k, opt, items)
  for first = 1, #items, 1000 do
    local part = {}
    for j = first, math.min(first + 999, #items) do part[#part + 1] = items[j] end
    if opt then
      redis.call(command, k, opt, unpack(part))
    else
      redis.call(command, k, unpack(part))
    end
  end
end

local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local b, holder = ARGV[i], ARGV[i + 1]; i = i + 2
  redis.call('ZADD', key(b, 1), 'XX', now + lease, holder)
  redis.call('PEXPIRE', key(b, 1), lease + 1000)
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local b, holder, slot, tokens = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  local s = load(b)
  if slot == '1' then
    s.freed[#s.freed + 1] = holder
  end
  -- NX: a release sent again after a lost reply charges nothing twice.
  if tokens > 0 and redis.call('ZADD', key(b, 3), 'NX', now, holder .. ':' .. ARGV[i - 1]) == 1 then
    s.total = s.total + tokens
    redis.call('SET', key(b, 4), s.total, 'PX', window + 1000)
    redis.call('PEXPIRE', key(b, 3), window + 1000)
  end
end
for b, s in pairs(state) do
  if #s.freed > 0 then
    chunked('ZREM', key(b, 1), nil, s.freed)
    s.slots = redis.call('ZCARD', key(b, 1))
    s.freed = {}
  end
end

local results = {}
n = tonumber(ARGV[i]); i = i + 1
for r = 1, n do
  local holder, asked, m = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]); i = i + 3
  local limits = {}
  local wait, unknown = 0, false
  for _ = 1, m do
    local b, conc, rpm, tpm = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    i = i + 4
    local s = load(b)
    limits[#limits + 1] = {b, conc, rpm, s}
    -- Admitted before (asked again after a lost reply): admitted again, nothing counted.
    local again = asked == '1' and ((conc > 0 and redis.call('ZSCORE', key(b, 1), holder))
      or (rpm > 0 and redis.call('ZSCORE', key(b, 2), holder)))
    if again then
      limits[#limits][2], limits[#limits][3] = 0, 0
    else
      if conc > 0 and s.slots >= conc then unknown = true end
      if rpm > 0 and s.starts >= rpm then
        local oldest = redis.call('ZRANGE', key(b, 2), 0, 0, 'WITHSCORES')
        wait = math.max(wait, tonumber(oldest[2] or now) + window - now, 1)
      end
      if tpm > 0 and s.total >= tpm then
        local oldest = redis.call('ZRANGE', key(b, 3), 0, 0, 'WITHSCORES')
        wait = math.max(wait, tonumber(oldest[2] or now) + window - now, 1)
      end
    end
  end
  if wait == 0 and not unknown then
    for _, limit in ipairs(limits) do
      local conc, rpm, s = limit[2], limit[3], limit[4]
      if conc > 0 then
        s.slots = s.slots + 1
        s.add_slots[#s.add_slots + 1] = now + lease
        s.add_slots[#s.add_slots + 1] = holder
      end
      if rpm > 0 then
        s.starts = s.starts + 1
        s.add_starts[#s.add_starts + 1] = now
        s.add_starts[#s.add_starts + 1] = holder
      end
    end
    results[r] = 0
  elseif wait > 0 then
    results[r] = wait
  else
    results[r] = -1
  end
end

for b, s in pairs(state) do
  if #s.add_slots > 0 then
    chunked('ZADD', key(b, 1), nil, s.add_slots)
    redis.call('PEXPIRE', key(b, 1), lease + 1000)
  end
  if #s.add_starts > 0 then
    chunked('ZADD', key(b, 2), 'NX', s.add_starts)
    redis.call('PEXPIRE', key(b, 2), window + 1000)
  end
end
return results
