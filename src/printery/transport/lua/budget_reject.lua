-- A budget review's rejection: the guard stays taken, and the held entries are kept, as
-- long as the run's budget hash lives (else ARGV[1] ms); no later hold asks again. A held
-- entry that is a loop's attempt which streamed partials (field `streamed`) will never
-- be judged now: its draft is retracted, a verdict (not passed, ARGV[2] the reasons as
-- JSON) on the run's partials stream, so no follower is left with a draft that never
-- gets one (the fields runtime/partials.py's verdict_fields writes).
-- KEYS: the held stream, the review guard, the run's budget hash, the run's partials
-- stream; ARGV[1] the ms to keep them when the hash has no expiry, ARGV[2] the reasons,
-- ARGV[3] the partials stream's cap, ARGV[4] its lifetime in seconds. Returns the ms kept.
local ttl = redis.call('PTTL', KEYS[3])
if ttl <= 0 then ttl = tonumber(ARGV[1]) end
redis.call('SET', KEYS[2], 'rejected', 'PX', ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local retracted = false
  for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
    local f, fields = {}, entry[2]
    for i = 1, #fields, 2 do f[fields[i]] = fields[i + 1] end
    if f['streamed'] and f['streamed'] ~= '' and f['streamed'] ~= '0' and f['data'] then
      local ok, data = pcall(cjson.decode, f['data'])
      local attempt = ok and type(data) == 'table' and data['attempt']
      if type(attempt) == 'number' then
        local verdict = {'kind', 'verdict', 'step', f['replay_for'] or '',
                         'attempt', string.format('%d', attempt), 'passed', '0',
                         'reasons', ARGV[2]}
        if f['item'] then
          verdict[#verdict + 1] = 'item'
          verdict[#verdict + 1] = f['item']
        end
        redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', unpack(verdict))
        retracted = true
      end
    end
  end
  if retracted then redis.call('EXPIRE', KEYS[4], ARGV[4]) end
end
return ttl
