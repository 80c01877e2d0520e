-- Remove a consumer from its group only if it owns no pending entry and has been idle
-- for at least ARGV[3] ms. Checked and done in one step: a consumer that reads between
-- a separate check and the delete would take its new entries down with it (XGROUP
-- DELCONSUMER drops a consumer's pending entries for good).
-- KEYS[1] stream; ARGV[1] group; ARGV[2] consumer; ARGV[3] minimum idle ms.
-- Returns 1 when removed, 0 when kept, -1 when there is no such consumer.
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, consumer in ipairs(consumers) do
  local info = {}
  for i = 1, #consumer, 2 do info[consumer[i]] = consumer[i + 1] end
  if info['name'] == ARGV[2] then
    if tonumber(info['pending']) == 0 and tonumber(info['idle']) >= tonumber(ARGV[3]) then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return -1
