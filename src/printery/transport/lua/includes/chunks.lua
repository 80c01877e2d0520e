-- Lua's stack bounds unpack: a list goes to a command 1000 values at a time.
-- `over(b, n, call)`: call(j, k) over ARGV[b .. b + n - 1], its replies concatenated.
local function over(b, n, call)
  local out = {}
  for j = b, b + n - 1, 1000 do
    local reply = call(j, math.min(j + 999, b + n - 1))
    if type(reply) == 'table' then
      for x = 1, #reply do out[#out + 1] = reply[x] end
    else
      out[#out + 1] = reply
    end
  end
  return out
end

-- `each(list, call)`: call(list, j, k) over a list, 1000 at a time; the sum of its replies.
local function each(list, call)
  local sum = 0
  for j = 1, #list, 1000 do
    sum = sum + call(list, j, math.min(j + 999, #list))
  end
  return sum
end
