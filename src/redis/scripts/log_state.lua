-- The members of a sliding log, shared by its decision and charge scripts.
local RENUMBER_AT = 4503599627370496 -- 2^52
-- The most expired entries a call removes (see the sliding-log script).
local CLEANUP = 64

-- cum, cost, time string, time pair of a member; nil if it is not one of ours.
local function member(m)
  if type(m) ~= 'string' then return nil end
  local cum, cost, mt = string.match(m, '^(%d+):(%d+):(%d+)$')
  if not cum or #cum > 16 or #cost > 16 or #mt > 20 then return nil end
  cum, cost = tonumber(cum), tonumber(cost)
  if cost < 1 or cost > cum or cum > 2 * RENUMBER_AT then return nil end
  return cum, cost, mt, parse_time(mt)
end

-- Rewrites every member with cum − base, so scores restart near 0.
local function renumber(key, base)
  local all = redis.call('ZRANGE', key, 0, -1)
  redis.call('DEL', key)
  for j = 1, #all do
    local cum, cost, mt = member(all[j])
    if cum then
      local score = string.format('%d', cum - base)
      redis.call('ZADD', key, score, score .. string.format(':%d:', cost) .. mt)
    end
  end
end
