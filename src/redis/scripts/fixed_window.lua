-- Fixed window (SPEC §4), windows [k·W, (k+1)·W) aligned to the Unix epoch.
-- KEYS[i]  state of item i: the string "<t> <n>", t = time of the newest admission, n = units
--          admitted in t's window. Absent = nothing admitted.
-- ARGV[1]  minimum TTL in ms        ARGV[2]  commit: '1' / '0' / '2' (all or nothing)
-- ARGV[3]  limit L (≤ 2^51)          ARGV[4]  window W in ns (1 ms ≤ W ≤ 2^51)
-- ARGV[3 + 2i], ARGV[4 + 2i]: cost of item i (≤ L), its time in ns ('' = server TIME)
-- reply[i] {code, e, n}: e = t − k·W (time into the window), n = units admitted in it before

defer = all or #KEYS > 1
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost, at, limit, window = item(i)
  local ts, t = now_of(at)
  local code, _, n, e
  code, _, n, e, ts, t = read_window(key, ts, t, window, false)
  if type(code) == 'table' then return code end
  if not code then
    if cost == 0 or n + cost <= limit then
      code = 1
      if commit and cost > 0 then
        set_state(key, ts .. ' ' .. string.format('%d', n + cost), ttl_ms(window - e, t))
      end
    else
      code = 0
    end
  end
  reply[i] = {code, e, n}
end
return finish()
