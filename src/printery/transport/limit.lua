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
--   admissions: n, then n x (holder, limits m, then m x (b, concurrency, rpm, tpm)),
--     0 meaning "no such limit"
-- Returns one number per admission, in order: 0 admitted; else how many ms until the
-- window can admit it (-1: when a slot is given back, unknown here).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local i = 3

local function key(b, n) return KEYS[(tonumber(b) - 1) * 4 + n] end

local swept = {}
local function sweep(b)
  if swept[b] then return end
  swept[b] = true
  redis.call('ZREMRANGEBYSCORE', key(b, 1), '-inf', now)
  redis.call('ZREMRANGEBYSCORE', key(b, 2), '-inf', now - window)
  local old = redis.call('ZRANGEBYSCORE', key(b, 3), '-inf', now - window)
  if #old > 0 then
    local gone = 0
    for _, member in ipairs(old) do
      gone = gone + tonumber(string.match(member, ':([^:]*)$'))
    end
    redis.call('ZREMRANGEBYSCORE', key(b, 3), '-inf', now - window)
    if redis.call('ZCARD', key(b, 3)) == 0 then
      redis.call('DEL', key(b, 4))
    else
      redis.call('INCRBYFLOAT', key(b, 4), -gone)
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
  if slot == '1' then redis.call('ZREM', key(b, 1), holder) end
  -- NX: a release sent again after a lost reply charges nothing twice.
  if tokens > 0 and redis.call('ZADD', key(b, 3), 'NX', now, holder .. ':' .. ARGV[i - 1]) == 1 then
    redis.call('INCRBYFLOAT', key(b, 4), tokens)
    redis.call('PEXPIRE', key(b, 3), window + 1000)
    redis.call('PEXPIRE', key(b, 4), window + 1000)
  end
end

local results = {}
n = tonumber(ARGV[i]); i = i + 1
for r = 1, n do
  local holder, m = ARGV[i], tonumber(ARGV[i + 1]); i = i + 2
  local limits = {}
  local wait, unknown = 0, false
  for _ = 1, m do
    local b, conc, rpm, tpm = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    i = i + 4
    limits[#limits + 1] = {b, conc, rpm}
    sweep(b)
    -- Admitted before (a request sent again after a lost reply): admitted again.
    local again = (conc > 0 and redis.call('ZSCORE', key(b, 1), holder))
      or (rpm > 0 and redis.call('ZSCORE', key(b, 2), holder))
    if not again then
      if conc > 0 and redis.call('ZCARD', key(b, 1)) >= conc then
        unknown = true
      end
      if rpm > 0 and redis.call('ZCARD', key(b, 2)) >= rpm then
        local oldest = redis.call('ZRANGE', key(b, 2), 0, 0, 'WITHSCORES')
        wait = math.max(wait, tonumber(oldest[2]) + window - now, 1)
      end
      if tpm > 0 and tonumber(redis.call('GET', key(b, 4)) or '0') >= tpm then
        local oldest = redis.call('ZRANGE', key(b, 3), 0, 0, 'WITHSCORES')
        wait = math.max(wait, tonumber(oldest[2]) + window - now, 1)
      end
    end
  end
  if wait == 0 and not unknown then
    for _, limit in ipairs(limits) do
      local b, conc, rpm = limit[1], limit[2], limit[3]
      if conc > 0 then
        redis.call('ZADD', key(b, 1), now + lease, holder)
        redis.call('PEXPIRE', key(b, 1), lease + 1000)
      end
      if rpm > 0 then
        redis.call('ZADD', key(b, 2), 'NX', now, holder)
        redis.call('PEXPIRE', key(b, 2), window + 1000)
      end
    end
    results[r] = 0
  elseif wait > 0 then
    results[r] = wait
  else
    results[r] = -1
  end
end
return results
