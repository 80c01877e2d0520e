-- The server's clock in ms, read once per script run: the only clock a decision reads
-- (processes' clocks disagree; the server's is one for all of them).
local clock_ms
local function now_ms()
  if clock_ms == nil then
    local t = redis.call('TIME')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock_ms
end
