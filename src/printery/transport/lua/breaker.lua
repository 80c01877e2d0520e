-- A model's circuit breaker (docs/reference.md, Flow control and model steps), one state
-- for every process sharing the server. The only clock is the server's TIME.
--
-- KEYS[1]: the model's breaker hash (StreamKeys.breaker); its fields:
--   times       the ms of the consecutive failures so far, space-separated (the last
--               `failures` of them, none older than `window`); a success removes it all
--   open_until  ms: set while the breaker is open; calls before it are refused
--   opened      ms of the last opening (shown by /status)
--   trial       the caller making the trial call once open_until has passed
--   trial_until ms: when that trial lapses (its caller died) and another may try
-- ARGV: op ('ask', 'ok', 'fail', 'peek'), failures, window ms, reset ms, trial lease ms,
-- caller.
-- Returns {state, ms}: state 0 closed (call), 1 open (refused; ms: until the next trial
-- may be made), 2 the caller makes the trial; for 'fail' in a closed breaker, ms is the
-- count of consecutive failures. 'peek' (what /status shows) changes nothing and returns
-- {state, ms, failures, opened}: state 0 closed, 1 open, 3 half open (the reset is over,
-- a trial decides); ms until a trial may be made; the consecutive failures in the
-- window; the ms of the last opening (0: none).
--@include clock
local now = now_ms()
local key, op = KEYS[1], ARGV[1]
local failures, window = tonumber(ARGV[2]), tonumber(ARGV[3])
local reset, lease, caller = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
-- Kept past what any decision reads: an idle breaker's state lapses on its own.
local keep = window + reset + lease + 60000

local open_until = tonumber(redis.call('HGET', key, 'open_until') or '')

if op == 'peek' then
  local counted = 0
  for at in string.gmatch(redis.call('HGET', key, 'times') or '', '%d+') do
    if now - tonumber(at) <= window then
      counted = counted + 1
    end
  end
  if not open_until then
    return {0, 0, counted, 0}
  end
  local opened = tonumber(redis.call('HGET', key, 'opened') or '0')
  local trial_until = tonumber(redis.call('HGET', key, 'trial_until') or '0')
  local wait = math.max(open_until, trial_until) - now
  return {now < open_until and 1 or 3, math.max(0, wait), failures, opened}
end

if op == 'ok' then
  if redis.call('EXISTS', key) == 1 then
    redis.call('DEL', key)
  end
  return {0, 0}
end

if op == 'ask' then
  if not open_until then
    return {0, 0}
  end
  if now < open_until then
    return {1, open_until - now}
  end
  local trial_until = tonumber(redis.call('HGET', key, 'trial_until') or '')
  if trial_until and now < trial_until then
    return {1, trial_until - now}
  end
  redis.call('HSET', key, 'trial', caller, 'trial_until', now + lease)
  redis.call('PEXPIRE', key, keep)
  return {2, 0}
end

-- op == 'fail'
if open_until then
  if redis.call('HGET', key, 'trial') == caller then  -- the trial failed: open again
    redis.call('HSET', key, 'open_until', now + reset, 'opened', now)
    redis.call('HDEL', key, 'trial', 'trial_until')
    redis.call('PEXPIRE', key, keep)
    return {1, reset}
  end
  return {1, math.max(0, open_until - now)}  -- a call made before it opened: no news
end
local kept = {}
for at in string.gmatch(redis.call('HGET', key, 'times') or '', '%d+') do
  if now - tonumber(at) <= window then
    kept[#kept + 1] = at
  end
end
kept[#kept + 1] = tostring(now)
while #kept > failures do
  table.remove(kept, 1)
end
if #kept >= failures then
  redis.call('HDEL', key, 'times')
  redis.call('HSET', key, 'open_until', now + reset, 'opened', now)
  redis.call('PEXPIRE', key, keep)
  return {1, reset}
end
redis.call('HSET', key, 'times', table.concat(kept, ' '))
redis.call('PEXPIRE', key, keep)
return {0, #kept}
