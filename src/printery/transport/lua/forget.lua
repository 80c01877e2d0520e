-- Forget the runs whose (latest) outcome is older than the retention.
-- KEYS[1] every run, KEYS[2..] the runs of each ended status; ARGV: retention ms, most
-- runs to forget, a run's info key less its id. A run goes out of every set and its info
-- hash is deleted; one filed under an older outcome of a run that ended again since only
-- leaves that status's set. Returns how many runs went and how many it looked at (the
-- call is repeated while that is the most asked).
--@include clock
local cutoff = now_ms() - tonumber(ARGV[1])
local left, forgotten = tonumber(ARGV[2]), 0
for k = 2, #KEYS do
  if left <= 0 then break end
  local old = redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', '(' .. cutoff, 'LIMIT', 0, left)
  for _, run in ipairs(old) do
    local info = ARGV[3] .. run
    local ended = tonumber(redis.call('HGET', info, 'ended'))
    if ended == nil or ended < cutoff then
      for j = 1, #KEYS do redis.call('ZREM', KEYS[j], run) end
      redis.call('UNLINK', info)
      forgotten = forgotten + 1
    else
      redis.call('ZREM', KEYS[k], run)
    end
    left = left - 1
  end
end
return {forgotten, tonumber(ARGV[2]) - left}
