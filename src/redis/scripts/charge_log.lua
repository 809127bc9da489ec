-- Charges to a sliding log (SPEC §6), for reconciliation after an outage: units admitted
-- without Redis are added as one entry, never denied (the log may then hold more than L units
-- for a while).
-- KEYS[i]  log of item i, as the sliding-log script keeps it
-- ARGV[1]  minimum TTL in ms        ARGV[2]  unused
-- ARGV[3]  limit L (unused)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[2 + 3i], ARGV[3 + 3i], ARGV[4 + 3i]: units of item i (≥ 1, < 2^51), the time they were
--          admitted (ns since the epoch, by the node's clock), and 'c' or 'c<k>' (with the
--          token KEYS[k])
-- An entry of units admitted W or more ago has expired: nothing to charge (so the same charge
-- sent again from its time + W on changes nothing: its token lives that long). Otherwise the
-- units are inserted at their own time (one ahead of the server's clock counts now), so each
-- expires a window after it was admitted: the entries newer than it (admitted through Redis
-- meanwhile) are written again after it, their counts moved up by its units (a write per newer
-- entry), and entries stay in time order.
-- reply[i] {code, units charged}

local window = tonumber(ARGV[4])
for i = 1, (#ARGV - 4) / 3 do
  local key = KEYS[i]
  local units = tonumber(ARGV[2 + 3 * i])
  local token = token_of(ARGV[4 + 3 * i])
  local ts, t = now_of('')
  local code, n = 1, 0
  local before = charged_before(token)
  if before then code, n = 0, before end
  local newest = redis.pcall('ZRANGE', key, -1, -1)
  local cum_newest = 0
  if type(newest) == 'table' and newest.err then
    if string.sub(newest.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(newest.err) end
    code = -1
  elseif newest[1] then
    local ncum = member(newest[1])
    if ncum then cum_newest = ncum else code = -2 end
  end
  local ats, atp = ARGV[3 + 3 * i], parse_time(ARGV[3 + 3 * i])
  -- Units from ahead of the server's clock count now, and their token lives a window from now.
  if diff(t, atp) < 0 then ats, atp = ts, t end
  local horizon = window - diff(t, atp)
  if code == 1 and horizon > 0 then
    n = units
    if cum_newest + n > RENUMBER_AT then
      local first = redis.call('ZRANGE', key, 0, 0)[1]
      local fcum, fcost = member(first)
      if fcum then
        renumber(key, fcum - fcost)
        cum_newest = cum_newest - (fcum - fcost)
      end
      if cum_newest + n > RENUMBER_AT then n = 0 end
    end
    -- The entries newer than the units: ranks lo.. (the log is in time order).
    local card = redis.call('ZCARD', key)
    local lo, hi = 0, card
    while n > 0 and lo < hi do
      local mid = floor((lo + hi) / 2)
      local _, _, _, mt = member(redis.call('ZRANGE', key, mid, mid)[1])
      if mt and diff(mt, atp) > 0 then hi = mid else lo = mid + 1 end
    end
    local later, base = {}, cum_newest
    if n > 0 and lo < card then
      for j, m in ipairs(redis.call('ZRANGE', key, lo, -1)) do
        local c, k, mt = member(m)
        if not c then
          code, n = -2, 0
          break
        end
        later[j] = {c, k, mt}
      end
      if n > 0 then base = later[1][1] - later[1][2] end
    end
    if n > 0 then
      if #later > 0 then redis.call('ZREMRANGEBYRANK', key, lo, -1) end
      local score = string.format('%d', base + n)
      redis.call('ZADD', key, score, score .. string.format(':%d:', n) .. ats)
      for j = 1, #later do
        local e = later[j]
        local moved = string.format('%d', e[1] + n)
        redis.call('ZADD', key, moved, moved .. string.format(':%d:', e[2]) .. e[3])
      end
      -- The newest entry sets the log's life: these units, if none is newer.
      if #later == 0 then redis.call('PEXPIRE', key, ttl_ms(window - diff(t, atp), t)) end
    end
    mark_charged(token, n, horizon, t)
  end
  if before then code = 1 end
  reply[i] = {code, n}
end
return reply
