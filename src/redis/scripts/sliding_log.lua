-- Sliding window log (SPEC §6): units with time > t − W count.
-- KEYS[i]  log of item i: a sorted set with one member per admitted request,
--          member "<cum>:<cost>:<t>", score cum = units admitted to this log up to and including
--          this request. Scores grow with time, so unit number u belongs to the first member
--          with score ≥ u: the k-th oldest live unit is found in O(log n), and a request of any
--          cost is one member. Renumbered from 0 before cum would pass 2^52.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, count, age_retry, age_newest}: count = live units before the decision;
--          age_retry = t − time of the (count + c − L)-th oldest live unit when denied, else −1;
--          age_newest = t − time of the newest live entry, −1 if none.

for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, limit, window = item(i)
  local ts, t = now_of(at)
  local newest = redis.pcall('ZRANGE', key, -1, -1)
  local code
  local count, base, cum_newest, age_newest, age_retry = 0, 0, 0, -1, -1
  if type(newest) == 'table' and newest.err then
    if string.sub(newest.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(newest.err) end
    code = -1
  elseif newest[1] then
    local ncum, ncost, nts = member(newest[1])
    if not ncum then
      code = -2
    else
      local gap
      ts, t, gap = clamp(ts, t, nts)
      if gap >= window then
        -- Every entry has expired: freed in the background (UNLINK), whatever their number.
        redis.call('UNLINK', key)
      else
        -- Binary search for the first live rank (the newest is live), then drop at most
        -- CLEANUP of the expired entries before it: a call's work stays bounded however many
        -- expired at once, and the rest go in the next calls (each adds at most one).
        local lo, hi = 0, redis.call('ZCARD', key) - 1
        while lo < hi do
          local mid = floor((lo + hi) / 2)
          local _, _, _, mt = member(redis.call('ZRANGE', key, mid, mid)[1])
          if mt and diff(t, mt) >= window then lo = mid + 1 else hi = mid end
        end
        local dropped = math.min(lo, CLEANUP)
        if dropped > 0 then redis.call('ZREMRANGEBYRANK', key, 0, dropped - 1) end
        local first = lo - dropped
        local fcum, fcost = member(redis.call('ZRANGE', key, first, first)[1])
        if not fcum or fcum - fcost > ncum then
          code = -2
        else
          base, cum_newest, age_newest = fcum - fcost, ncum, gap
          count = ncum - base
        end
      end
    end
  end
  if not code then
    if cost == 0 or count + cost <= limit then
      code = 1
      if commit and cost > 0 then
        write(function()
          if cum_newest + cost > RENUMBER_AT then
            renumber(key, base)
            cum_newest = cum_newest - base
          end
          local cum = cum_newest + cost
          local score = string.format('%d', cum)
          redis.call('ZADD', key, score, score .. string.format(':%d:', cost) .. ts)
          redis.call('PEXPIRE', key, ttl_ms(window, t))
        end)
      end
    else
      code = 0
      -- Unit number base + (count + cost − L) must expire first.
      local unit = string.format('%d', base + count + cost - limit)
      local hit = redis.call('ZRANGEBYSCORE', key, unit, '+inf', 'LIMIT', 0, 1)
      local _, _, _, mt = member(hit[1])
      if mt then age_retry = diff(t, mt) else code = -2 end
    end
  end
  reply[i] = {code, count, age_retry, age_newest}
end
return finish()
