-- Which idempotency keys already have a record: the commit script's duplicate check,
-- read-only, for a whole batch before its handlers run (the commit checks again).
-- KEYS[1] the group's idempotency index (see commit.lua); ARGV the idempotency keys.
-- Returns per key 1 (recorded) or 0.
local gen = tonumber(redis.call('HMGET', KEYS[1], 'gen')[1])
local seen = {}
for i = 1, #ARGV do seen[i] = 0 end
if gen == nil then return seen end
for g = gen - 1, gen do
  if g >= 1 then
    local name = KEYS[1] .. ':r' .. g
    for i = 1, #ARGV, 1000 do
      local j = math.min(i + 999, #ARGV)
      local found = redis.call('SMISMEMBER', name, unpack(ARGV, i, j))
      for x = 1, j - i + 1 do
        if found[x] == 1 then seen[i + x - 1] = 1 end
      end
    end
  end
end
return seen
