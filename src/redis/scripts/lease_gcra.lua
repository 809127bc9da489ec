-- Leases on GCRA state (SPEC §1), the leased tier. A grant of g units is g admissions of cost 1
-- at once: the units leave the bucket now (the last g slots of its debt), and the node spends
-- them later, each before its slot is more than the horizon and one T in the past (the node's
-- lease decays), so the fleet's admissions over any interval [a, b] stay within
-- B + 1 + (b − a + horizon)/T (the bound on LeasedLimiter).
-- KEYS[i]  state of item i, as the GCRA script keeps it: "<t> <debt>"
-- ARGV[1]  minimum TTL in ms        ARGV[2]  unused ('1')
-- ARGV[3]  span B·T in ns (≤ 2^51)  ARGV[4]  emission interval T in ns (≥ 1)
-- ARGV[1 + 4i] 'g' grant, 'r' return or 'c' charge ('c<k>': with the token KEYS[k])
-- ARGV[2 + 4i] units (≤ B for a grant or a return; < 2^52 for a charge)
-- ARGV[3 + 4i] return: the TAT (t + debt, ns since the epoch) right after the grant whose units
--              go back; charge: the time its units' debt was measured at ('' = now); ''
--              otherwise                            ARGV[4 + 4i] time in ns ('' = server TIME)
-- grant:  g = min(units, ⌊(B·T − debt)/T⌋), then debt += g·T
-- return: only while the TAT is still the one right after the grant (nothing admitted behind
--         its units since): debt := max(0, debt − units·T), the units go back to the bucket,
--         never beyond B. Units that others' admissions sit behind are not taken back: that
--         would move those admissions earlier, past the lives their leases were given.
-- charge: debt += c·T with c = min(u, ⌊(2^52 − 1 − debt)/T⌋), u = units − ⌊(t − at)/T⌋ (the
--         units the bucket has refilled since `at` are not charged): units a node admitted
--         without a grant (during an outage, or before its first grant arrived) are counted,
--         never denied; the debt may pass B·T, and the key is denied until it drains. Sent
--         again from at + units·T on, the same charge charges nothing: its token lives that
--         long
-- reply[i] {code, g or units or c, s, ns, debt after, 0, 0}: (s, ns) = the time judged at

local span, interval = tonumber(ARGV[3]), tonumber(ARGV[4])
local most = idiv(span, interval)
local MAX_DEBT = 4503599627370495 -- 2^52 − 1, the largest debt a state holds
for i = 1, (#ARGV - 4) / 4 do
  local key = KEYS[i]
  local op, token, units, tat, ts, t = lease_item(i, most)
  local code, debt, present
  code, debt, ts, t, present = read_gcra(key, ts, t)
  if type(code) == 'table' then return code end
  code = code or 1
  local n = 0
  local before = op == 'c' and charged_before(token)
  if before then
    n = before
  elseif code == 1 then
    if op == 'g' or op == 'c' then
      -- A grant stops at the bucket's span, a charge at the largest debt a state holds.
      local top, horizon = span, 0
      if op == 'c' then
        top = MAX_DEBT
        local age = 0
        if tat ~= '' then age = diff(t, parse_time(tat)) end
        horizon = units * interval - age
        if horizon > MAX_DEBT then horizon = MAX_DEBT end
        if age >= MAX_DEBT then
          units = 0
        elseif age > 0 then
          units = units - math.min(units, idiv(age, interval))
        end
      end
      if debt < top then n = idiv(top - debt, interval) end
      if n > units then n = units end
      if n > 0 then
        debt = debt + n * interval
        redis.call('SET', key, ts .. ' ' .. string.format('%d', debt), 'PX', ttl_ms(debt, t))
      end
      if op == 'c' then mark_charged(token, n, horizon, t) end
    elseif present and debt > 0 and tat ~= '' and diff(t, parse_time(tat)) + debt == 0 then
      n = units
      debt = debt - units * interval
      if debt <= 0 then
        debt = 0
        redis.call('DEL', key)
      else
        redis.call('SET', key, ts .. ' ' .. string.format('%d', debt), 'PX', ttl_ms(debt, t))
      end
    end
  end
  reply[i] = {code, n, t[1], t[2], debt, 0, 0}
end
return reply
