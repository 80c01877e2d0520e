-- Flow control's state per limit key (limit.lua; KEYS by `key(b, n)`, the clock `now`,
-- the bucket `length`, the `window` and the `gate` defined before this include): the
-- concurrency slots held, and the live sums of the window hashes, each read once.

-- A window hash's live sum, its oldest live bucket's end of life, and its dead buckets
-- removed.
local function window_sum(k)
  local pairs_ = redis.call('HGETALL', k)
  local sum, oldest, dead = 0, nil, {}
  for j = 1, #pairs_, 2 do
    local b = tonumber(pairs_[j])
    local ends = (b + 1) * length + window
    if ends > now then
      sum = sum + tonumber(pairs_[j + 1])
      if oldest == nil or ends < oldest then oldest = ends end
    else
      dead[#dead + 1] = pairs_[j]
    end
  end
  if #dead > 0 then redis.call('HDEL', k, unpack(dead)) end
  return sum, oldest
end

local state = {}
local function load(b)
  local s = state[b]
  if s then return s end
  local lapsed = redis.call('ZRANGEBYSCORE', key(b, 1), '-inf', now)
  if #lapsed > 0 then
    redis.call('HDEL', key(b, 2), unpack(lapsed))
    redis.call('ZREMRANGEBYSCORE', key(b, 1), '-inf', now)
  end
  local slots = 0
  for _, held in ipairs(redis.call('HVALS', key(b, 2))) do slots = slots + tonumber(held) end
  s = {slots = slots, own = tonumber(redis.call('HGET', key(b, 2), gate) or '0'),
       reported = false, started = nil, started_ends = nil, new_starts = 0,
       tokens = nil, tokens_ends = nil}
  state[b] = s
  return s
end

local function started(b, s)
  if s.started == nil then s.started, s.started_ends = window_sum(key(b, 3)) end
  return s.started
end

local function tokens(b, s)
  if s.tokens == nil then s.tokens, s.tokens_ends = window_sum(key(b, 4)) end
  return s.tokens
end
