-- GCRA (SPEC §1–3).
-- KEYS[i]  state of item i: the string "<t> <debt>", t = time of the newest admission (ns since
--          the epoch), debt = TAT − t in ns (0 < debt ≤ 2^52). Absent = a full bucket.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' to count an admitted request, '0' to
--          peek, '2' all or nothing (each item its own ARGV[3], ARGV[4]: see `item` above)
-- ARGV[3]  span B·T in ns (≤ 2^51)  ARGV[4]  emission interval T in ns (≥ 1)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ B), its time in ns ('' = server TIME)
-- reply[i] {code, debt}: debt = max(0, TAT − t) before the decision

defer = all or #KEYS > 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, span, interval = item(i)
  local ts, t = now_of(at)
  local code, debt
  local f = fields and fields[key]
  if f then
    -- This call's own newest state of the key, read as read_gcra reads its string.
    local gap
    ts, t, gap = clamp(ts, t, f[1], f[2])
    debt = f[3] - gap
    if debt < 0 then debt = 0 end
  else
    code, debt, ts, t = read_gcra(key, ts, t)
    if type(code) == 'table' then return code end
  end
  if not code then
    local increment = cost * interval
    if cost == 0 or debt + increment <= span then
      code = 1
      if commit and cost > 0 then
        local after = debt + increment
        if ttls[key] then
          -- Written before in this call (so `defer` is on): a hot key, kept as fields
          -- {time string, time pair, debt}, whose state is "<t> <debt>".
          if not fields then
            fields = {}
            format_state = function(v)
              return v[1] .. ' ' .. string.format('%d', v[3]), ttl_ms(v[3], v[2])
            end
          end
          fields[key] = {ts, t, after}
        else
          set_state(key, ts .. ' ' .. string.format('%d', after), ttl_ms(after, t))
        end
      end
    else
      code = 0
    end
  end
  reply[i] = {code, debt}
end
return finish()
