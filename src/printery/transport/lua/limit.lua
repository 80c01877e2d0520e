-- Flow control (docs/reference.md, Flow control): report, then admit, in one atomic step
-- for every process sharing the server. The only clock is the server's TIME.
--
-- State is counted per gate (one step's limits in one process), never per handler call,
-- so a call costs the same for a batch of one or of a thousand entries. Each limit key
-- ("base", b = 1..) has four keys, KEYS[(b-1)*4 + 1..4]:
--   slots    sorted set gate -> lease expiry ms (renewed with the entries' leases, so a
--            dead process's slots lapse within the visibility timeout)
--   held     hash gate -> concurrency slots it holds
--   started  hash bucket -> handler starts in it (requests per window)
--   tokens   hash bucket -> tokens reported in it
-- A bucket is window/60 ms long; bucket i counts until (i + 1) * length + window, so every
-- start and token is counted for at least a whole window after it happened: no span of
-- one window ever holds more than the limit (at most one bucket's length is lost).
-- ARGV: window ms, lease ms, gate,
--   departed: n, then n x (b, a gate of a process known to be dead), whose slots are
--   given back at once rather than when their lease lapses
--   reports: n, then n x (b, slots the gate holds now, tokens to charge)
--   asks: n, then n x (count, limits m, then m x (b, concurrency, rpm, tpm)), 0 meaning
--   "no such limit"
-- A gate's report is the truth about its slots: what a lost reply admitted is taken back
-- by the next report. A lost reply's starts and tokens stay counted (more conservative,
-- never less).
-- Returns two numbers per ask, in order: how many were admitted, then for the others how
-- many ms until the window can admit them (-1: when a slot is given back, unknown here;
-- 0: none left).
--@include clock
local now = now_ms()
local window = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local gate = ARGV[3]
local length = math.max(1, math.floor(window / 60))
local bucket = math.floor(now / length)
local i = 4

local function key(b, n) return KEYS[(tonumber(b) - 1) * 4 + n] end

--@include limit_state

local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local b, departed = ARGV[i], ARGV[i + 1]; i = i + 2
  redis.call('HDEL', key(b, 2), departed)
  redis.call('ZREM', key(b, 1), departed)
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local b, held, charge = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]); i = i + 3
  local s = load(b)
  s.slots = s.slots - s.own + held
  s.own = held
  s.reported = true
  if charge > 0 then
    tokens(b, s)
    s.tokens = s.tokens + charge
    s.tokens_ends = s.tokens_ends or (bucket + 1) * length + window
    redis.call('HINCRBYFLOAT', key(b, 4), bucket, charge)
    redis.call('PEXPIRE', key(b, 4), window + length + 1000)
  end
end

local results = {}
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local count, m = tonumber(ARGV[i]), tonumber(ARGV[i + 1]); i = i + 2
  local limits = {}
  local admit, wait, unknown = count, 0, false
  for _ = 1, m do
    local b, conc, rpm, tpm = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    i = i + 4
    local s = load(b)
    limits[#limits + 1] = {b, conc, rpm, s}
    if conc > 0 and s.slots + admit > conc then
      admit = math.max(conc - s.slots, 0)
      unknown = true
    end
    if rpm > 0 and started(b, s) + admit > rpm then
      admit = math.max(rpm - s.started, 0)
      wait = math.max(wait, (s.started_ends or now) - now, 1)
    end
    if tpm > 0 and tokens(b, s) >= tpm then
      admit = 0
      wait = math.max(wait, (s.tokens_ends or now) - now, 1)
    end
  end
  if admit > 0 then
    for _, limit in ipairs(limits) do
      local b, conc, rpm, s = limit[1], limit[2], limit[3], limit[4]
      if conc > 0 then
        s.slots = s.slots + admit
        s.own = s.own + admit
        s.reported = true
      end
      if rpm > 0 then
        s.started = s.started + admit
        s.started_ends = s.started_ends or (bucket + 1) * length + window
        s.new_starts = s.new_starts + admit
      end
    end
  end
  results[#results + 1] = admit
  if admit == count then
    results[#results + 1] = 0
  elseif wait > 0 then
    results[#results + 1] = wait
  elseif unknown then
    results[#results + 1] = -1
  else
    results[#results + 1] = 0
  end
end

for b, s in pairs(state) do
  if s.reported then
    if s.own > 0 then
      redis.call('HSET', key(b, 2), gate, s.own)
      redis.call('ZADD', key(b, 1), now + lease, gate)
      redis.call('PEXPIRE', key(b, 1), lease + 1000)
      redis.call('PEXPIRE', key(b, 2), lease + 1000)
    else
      redis.call('HDEL', key(b, 2), gate)
      redis.call('ZREM', key(b, 1), gate)
    end
  end
  if s.new_starts > 0 then
    redis.call('HINCRBY', key(b, 3), bucket, s.new_starts)
    redis.call('PEXPIRE', key(b, 3), window + length + 1000)
  end
end
return results
