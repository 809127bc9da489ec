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
-- units are appended at the later of their time and the newest entry's (entries stay in time
-- order; a later time only keeps them a little longer).
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
  local cum_newest, nts, npair = 0, nil, nil
  if type(newest) == 'table' and newest.err then
    if string.sub(newest.err, 1, 9) ~= 'WRONGTYPE' then return redis.error_reply(newest.err) end
    code = -1
  elseif newest[1] then
    local ncum, _, nmt, nmp = member(newest[1])
    if ncum then cum_newest, nts, npair = ncum, nmt, nmp else code = -2 end
  end
  if code == 1 then
    local ats, atp = ARGV[3 + 3 * i], parse_time(ARGV[3 + 3 * i])
    local horizon = window - diff(t, atp)
    if diff(t, atp) < 0 then ats, atp = ts, t end
    if nts and diff(atp, npair) < 0 then ats, atp = nts, npair end
    local age = diff(t, atp)
    if age < 0 then age = 0 end
    if horizon > 0 and age < window then
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
      if n > 0 then
        local score = string.format('%d', cum_newest + n)
        redis.call('ZADD', key, score, score .. string.format(':%d:', n) .. ats)
        redis.call('PEXPIRE', key, ttl_ms(window - age, t))
      end
    end
    mark_charged(token, n, horizon, t)
  end
  if before then code = 1 end
  reply[i] = {code, n}
end
return reply
